"""Bounded fan-in's bookkeeping: what a server serves, what a receiver accepts, and which behaviour is scored.

Contract (pure: no I/O, no clock; state is per round, `new_round()` clears it):
- `ServeBook` (the serving side): `request(requester, group_id, announced_in)` answers SERVE, or a refusal:
  UNOFFERED (we never announced that group: scored "unoffered_pull"), OVER_PULL (the requester already had
  `serve_per_requester` groups of the digest batch that announced it, round `announced_in`: scored "over_pull",
  refused), BUSY (we served `serve_per_round` in our current round: refused, not scored, the requester tries someone
  else). So a node's outbound pulls are bounded however many ask. The per-requester cap counts per announcing round,
  not per current round: a pull of round r's group that arrives just after we opened round r + 1 must not use up the
  requester's share of r + 1's digests (honest peers out of step would score each other).
- `PushBook` (the receiving side of the push fallback): `accept(sender, group_id, digest_known)` takes at most
  `pushes_accepted_per_sender` unsolicited groups per sender and `pushes_accepted_per_round` in all, and only for
  groups whose digest we hold from the shard; anything else is dropped unread and scored "unsolicited_push".
- `check_pulled(digest, content_hash, signal, variance)` (the receiving side of a pull, after the bytes arrived):
  a content hash other than the digest's is dropped before decoding and scored "hash_mismatch"; a group whose
  re-scored rewards disagree with the digest (signal flag, or variance beyond `VARIANCE_TOLERANCE`) is scored
  "digest_reward_mismatch" (a sender inflating its statistics to attract pulls); else "" (accepted).
- `NOT_SERVED` is scored when a sender answers "not found" for a group its own digest announced in this round.
- `FANIN_WEIGHTS`: the reputation weights of these kinds (sharing/reputation.py's `ReputationParams.weights`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from swarm_node.sharing.fanin import Digest, FanInParams

SERVE, UNOFFERED, OVER_PULL, BUSY = "serve", "unoffered_pull", "over_pull", "busy"
HASH_MISMATCH = "hash_mismatch"
REWARD_MISMATCH = "digest_reward_mismatch"
NOT_SERVED = "unserved_digest"
NOT_HELD = "not_held"  # a round the server no longer holds (sharing/served_rounds.py): scored on neither side
UNSOLICITED = "unsolicited_push"
VARIANCE_TOLERANCE = 1e-6  # rewards are re-scored by the same verifier: honest statistics agree exactly

FANIN_WEIGHTS: Mapping[str, float] = MappingProxyType({
    HASH_MISMATCH: -5.0,  # content other than announced: a deliberate lie or corruption
    REWARD_MISMATCH: -5.0,  # statistics inflated to attract pulls (the same weight as a forged reward)
    NOT_SERVED: -1.0,  # announced groups it does not serve: wastes our pull slots
    UNOFFERED: -1.0,  # asks for groups never offered: probing or replaying ids
    OVER_PULL: -0.5,  # pulls past its share this round
    UNSOLICITED: -0.5,  # pushes past the fallback's caps, or groups never announced
    BUSY: 0.0,  # our own cap: the requester did nothing wrong
})


@dataclass
class ServeBook:
    """The serving side's per-round state; `offered`: the group ids our digests announced this round."""

    params: FanInParams
    offered: set[str] = field(default_factory=set)
    served: Counter[tuple[str, int]] = field(default_factory=Counter)  # (requester, announcing round) -> groups
    served_now: int = 0  # groups served in our current round

    def new_round(self, offered: set[str], held_rounds: Collection[int] = ()) -> None:
        """`offered`: the group ids of every round we still serve; `held_rounds`: those rounds (their counts stay)."""
        self.offered = set(offered)
        self.served = Counter({key: n for key, n in self.served.items() if key[1] in held_rounds})
        self.served_now = 0

    def request(self, requester: str, group_id: str, announced_in: int = 0) -> str:
        if group_id not in self.offered:
            return UNOFFERED
        if self.served[requester, announced_in] >= self.params.serve_per_requester:
            return OVER_PULL
        if self.served_now >= self.params.serve_per_round:
            return BUSY
        self.served[requester, announced_in] += 1
        self.served_now += 1
        return SERVE


@dataclass
class PushBook:
    """The receiving side of the push fallback, per round."""

    params: FanInParams
    accepted: Counter[str] = field(default_factory=Counter)  # sender -> unsolicited groups taken this round

    def new_round(self) -> None:
        self.accepted.clear()

    def accept(self, sender: str, digest_known: bool) -> str:
        """"" to take the pushed group (then check it like a pull), else the kind to score (dropped unread)."""
        if (not digest_known or self.accepted[sender] >= self.params.pushes_accepted_per_sender
                or self.accepted.total() >= self.params.pushes_accepted_per_round):
            return UNSOLICITED
        self.accepted[sender] += 1
        return ""


def check_pulled(digest: Digest, content_hash: bytes, signal: bool, variance: float) -> str:
    """"" if the group matches its digest, else the kind to score (see the module contract). `content_hash` is
    computed over the received bytes before decoding; `signal` and `variance` come from our re-scoring."""
    if content_hash != digest.content_hash:
        return HASH_MISMATCH
    if signal != digest.signal or abs(variance - digest.reward_variance) > VARIANCE_TOLERANCE:
        return REWARD_MISMATCH
    return ""
