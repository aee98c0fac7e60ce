"""Our scored groups as wire RolloutGroups, deterministic group ids, and the content hash used for de-duplication.

`GroupSigner(tokenizer_hash, family, seed, prompt_format)` is how every role puts its groups on the wire: tagged with
our tokenizer, model family and prompt format, ids derived from (signer, seed, batch, index). Log-probs are clamped
to <= 0 (float rounding) as the wire demands. Pure: no I/O (the creation time is the caller's clock).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from dataclasses import dataclass

from protocol.messages import DEFAULT_PROMPT_FORMAT, CompletionWire, RolloutGroup, TaskRefWire
from swarm_node import tasks
from swarm_node.types import ScoredGroup


def to_wire(group: ScoredGroup, policy_id: str, version: int, tokenizer_hash: str, family: str, created_at: float,
            group_id: bytes, prompt_format: str = DEFAULT_PROMPT_FORMAT) -> RolloutGroup:
    completions = tuple(CompletionWire(tuple(c.token_ids), c.text, tuple(min(lp, 0.0) for lp in c.logprobs), r)
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
