"""What a pulled or pushed group must pass before bounded fan-in queues it (the receiving side of WIRE.md's pulls).

Contract (pure but for the `replay` guard it updates; no I/O): `admit_pulled(sender, pulled, digest, limits,
policy, replay, rescore, now)` returns `(group, "")` for a group that passes, in this order: its bytes against the
digest's content hash, before they are decoded (`decode_pulled`, which also bounds and checks freshness); the
checks a flooded group gets (`check_message`: attribution to `sender`, our task, tokenizer); replay by content
hash (then remembered); its rewards re-scored by `rescore` against the digest's signal and variance
(`fanin_ledger.check_pulled`). Else `(None, reason)`: the codec's or validation's reason, "replay", or the
ledger's (`hash_mismatch`, `digest_reward_mismatch`); the caller drops and scores it.
"""

from __future__ import annotations

from collections.abc import Callable

from protocol.codec import decode_pulled
from protocol.errors import WireError, ignore
from protocol.limits import Limits
from protocol.messages import TOPIC_ROLLOUTS, PulledGroup, RolloutBatch, RolloutGroup
from protocol.validation import AcceptPolicy, ReplayGuard, check_message
from swarm_node.sharing.fanin import Digest, reward_stats
from swarm_node.sharing.fanin_ledger import check_pulled


def admit_pulled(sender: str, pulled: PulledGroup, digest: Digest, limits: Limits, policy: AcceptPolicy,
                 replay: ReplayGuard, rescore: Callable[[RolloutGroup], list[float]], now: float
                 ) -> tuple[RolloutGroup | None, str]:
    try:
        group = decode_pulled(pulled, digest.content_hash, limits, now)
        check_message(RolloutBatch((group,)), TOPIC_ROLLOUTS, sender, limits, policy, now)
        if replay.is_replay(digest.content_hash, group.created_at, now):
            raise ignore("replay", "group already accepted")
    except WireError as err:
        return None, err.reason
    replay.remember(digest.content_hash, group.created_at, now)
    signal, variance = reward_stats(rescore(group))
    reason = check_pulled(digest, digest.content_hash, signal, variance)
    return (None, reason) if reason else (group, "")
