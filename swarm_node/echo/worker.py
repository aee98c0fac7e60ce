"""ECHO-2 worker: follows one learner's policy and generates rollouts for it (transport-free; no node import).

`Worker(host, kappa=, max_staleness=, keep, max_delta_norm)`: `host` is the sampling side (`WorkerHost`: its
model, which is the base at version 0, `load_policy(state, version)` into its sampler, `generate_groups()`; a
`Node` is one).
`apply(update)` verifies and applies a learner update (delta or snapshot) and loads the result into the sampler
(`mid_apply(version)`, when given, is called in between: a test hook that pauses there, roles/apply_pause.py; a
refused one, e.g. `DeltaTooLarge` past `max_delta_norm` (0: unbounded), raises before the sampler sees it, and
is remembered in `refused` as (version, base_version), which catch-up never fetches again: catch_up.py);
`may_generate()` says whether a batch generated now can still be trained on within S; `generate()` samples and
scores one batch, tagged with the published version it used. A worker's base is the model it loaded (version 0).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch
from torch import nn

from swarm_node.policy_sync.delta import DeltaTooLarge, PolicyFollower, PolicyUpdate, model_state, state_hash
from swarm_node.train.staleness import may_generate
from swarm_node.types import ScoredGroup


class WorkerHost(Protocol):
    """What a worker needs from the node that samples."""

    @property
    def model(self) -> nn.Module: ...

    def load_policy(self, state: dict[str, torch.Tensor], version: int) -> None: ...

    def generate_groups(self) -> tuple[list[ScoredGroup], float, int]: ...


class Worker:
    def __init__(self, host: WorkerHost, *, kappa: int, max_staleness: int, keep: int = 8,
                 max_delta_norm: float = 0.0, mid_apply: Callable[[int], None] | None = None) -> None:
        self.host = host
        self.mid_apply = mid_apply
        self.kappa = kappa  # published versions are kappa learner steps apart
        self.max_staleness = max_staleness
        self.follower = PolicyFollower(model_state(host.model), keep=keep, max_delta_norm=max_delta_norm)
        self.batches = 0  # batches generated so far
        self.forgiven = 0  # batches the learner evidently never got (lost): they no longer hold generation back
        self.known_version = 0  # newest published version we have heard of (announces may run ahead of payloads)
        self.refused: set[tuple[int, int]] = set()  # (version, base_version) refused as too large, this lineage

    @property
    def version(self) -> int:
        return self.follower.version

    def base_sha256(self) -> str:
        return state_hash(self.follower.published_state())

    def state_sha256(self) -> str:
        return self.follower.state_sha256 if self.follower.version >= 0 else ""

    def apply(self, update: PolicyUpdate) -> None:
        try:
            state = self.follower.apply(update)
        except DeltaTooLarge:
            self.refused.add((update.version, update.base_version))
            raise
        if self.mid_apply is not None:
            self.mid_apply(update.version)
        self.host.load_policy(state, update.version)
        self.known_version = max(self.known_version, update.version)

    def may_generate(self) -> bool:
        return may_generate(self.batches - self.forgiven, self.version * self.kappa, self.known_version * self.kappa,
                            self.max_staleness)

    def reset(self) -> None:
        """Forget the followed lineage (the learner restarted or resumed): the next update must be a snapshot."""
        self.follower = PolicyFollower(None, keep=self.follower.keep, shapes=self.follower.shapes,
                                       max_delta_norm=self.follower.max_delta_norm)
        self.batches = self.forgiven = self.known_version = 0
        self.refused = set()

    def generate(self) -> tuple[list[ScoredGroup], float, int]:
        """One batch (B groups), scored; completions carry the published version used. Also (seconds, tokens)."""
        groups, seconds, tokens = self.host.generate_groups()
        self.batches += 1
        return groups, seconds, tokens
