"""Our scored groups as wire RolloutGroups, deterministic group ids, and the content hash used for de-duplication.

`GroupSigner(tokenizer_hash, family, seed, prompt_format)` is how every role puts its groups on the wire: tagged with
our tokenizer, model family and prompt format, ids derived from (signer, seed, batch, index). Log-probs are clamped
to <= 0 (float rounding) as the wire demands. A completion sampled by more than one policy (APRIL's resumed ones), or
by another policy than the group's version, carries its version spans (`wire_spans`), so that a receiver's staleness
bound reads its oldest policy. Pure: no I/O (the creation time is the caller's clock).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from dataclasses import dataclass

from protocol.messages import DEFAULT_PROMPT_FORMAT, CompletionWire, RolloutGroup, TaskRefWire
from swarm_node import tasks
from swarm_node.types import Completion, ScoredGroup


def wire_spans(c: Completion, version: int) -> tuple[tuple[int, int], ...]:
    """The version spans a completion carries on the wire in a group of `version`: its own when it was resumed
    under newer policies (APRIL), one span (0, its version) when it was finished by another policy than the group's
    (a carried completion finished under an older one), else none (the receiver reads the group's version).

    A span that covers no token (a resume that added none) is left out: the wire wants every start to be a token
    of the completion, and a policy that sampled none of its tokens has no bearing on its staleness. A completion
    without tokens carries none (no policy sampled any of it)."""
    n = len(c.token_ids)
    spans = c.version_spans()
    kept = tuple(s for k, s in enumerate(spans) if s[0] < (spans[k + 1][0] if k + 1 < len(spans) else n))
    if not kept or (len(kept) == 1 and kept[0][1] == version):
        return ()
    return kept


def to_wire(group: ScoredGroup, policy_id: str, version: int, tokenizer_hash: str, family: str, created_at: float,
            group_id: bytes, prompt_format: str = DEFAULT_PROMPT_FORMAT) -> RolloutGroup:
    completions = tuple(CompletionWire(tuple(c.token_ids), c.text, tuple(min(lp, 0.0) for lp in c.logprobs), r,
                                       wire_spans(c, version))
                        for c, r in zip(group.completions, group.rewards, strict=True))
    ref = group.inst.ref
    return RolloutGroup(group_id, policy_id, version, TaskRefWire(ref.dataset, ref.config, ref.seed, ref.index),
                        completions, tokenizer_hash, family, created_at, prompt_format)


def group_id_for(peer_id: str, step: int, index: int, seed: int) -> bytes:
    """Deterministic 16-byte group id (simulations reproduce byte for byte; content dedup does not rely on it)."""
    return hashlib.sha256(f"{peer_id}/{seed}/{step}/{index}".encode()).digest()[:16]


@dataclass(frozen=True)
class GroupSigner:
    """Our groups as every role publishes them: tagged with our tokenizer, model family and prompt format."""

    tokenizer_hash: str
    family: str
    seed: int  # run.seed: two runs of one identity with other seeds publish other group ids
    prompt_format: str = DEFAULT_PROMPT_FORMAT  # the format our completions were generated in

    def wire(self, groups: Sequence[ScoredGroup], policy_id: str, version: int, signer: str, batch: int,
             now: float | None = None) -> list[RolloutGroup]:
        created = time.time() if now is None else now
        return [to_wire(g, policy_id, version, self.tokenizer_hash, self.family, created,
                        group_id_for(signer, batch, i, self.seed), self.prompt_format) for i, g in enumerate(groups)]


def content_key(ref: tasks.TaskRef, completion_ids: Sequence[Sequence[int]]) -> bytes:
    """Hash of what a group trains on: the task and the multiset of completions (order-free, so a permuted
    re-send is still a duplicate)."""
    h = hashlib.sha256(f"{ref.dataset}\0{ref.config}\0{ref.seed}\0{ref.index}".encode())
    for ids in sorted(completion_ids):
        h.update(len(ids).to_bytes(4, "little"))
        h.update(b"".join(t.to_bytes(4, "little") for t in ids))
    return h.digest()
