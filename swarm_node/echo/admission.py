"""A learner's admission of workers, as a state machine: Status reports in, decisions out (no I/O, no clock).

Contract (`Admission(me)`):
- `on_status(peer, status, now, published_version, held)`: a Status from `peer`. Only a worker following us counts:
  its report (stated cost, measured rollouts/s) is kept for the activator; a worker heard for the first time is
  admitted: it becomes a delegate (its signed groups count as ours, see `accept_external`) and active. Returns
  `Admitted(joined, snapshot)`: `snapshot` asks the caller to publish a snapshot of the current policy for a late
  joiner (we published a version > 0 already), or for any worker whose reported version catch-up cannot move from
  what we hold (`held`, our complete announces: `catch_up.stranded`), such as one restarted without its policy.
- `on_rollouts(tokens, completions)`: tallies what workers sent, to turn their tokens/s into rollouts/s.
- `on_trained(seconds)`, `demand(rollouts_per_step, kappa)`: the learner's measured step time for the activator.
- `started(peer)` / `stopped(peer)`: a start/stop control message went out. `receivers()`: the active delegates
  (who a policy update is pushed to). `delegates` is the mapping the accept policy and the ingest path read.
- `reported_cost(capabilities)`: the price a worker states ("cost_per_hour:0.35"); untrusted, only ranks workers.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from swarm_node.echo.activation import Demand, WorkerReport
from swarm_node.echo.catch_up import Held, stranded

COST_CAPABILITY = "cost_per_hour:"  # a worker's price travels as a Status capability, e.g. "cost_per_hour:0.35"


def reported_cost(capabilities: tuple[str, ...]) -> float:
    """The price a worker states in its Status (0 if absent or malformed: it is untrusted and only ranks workers)."""
    for cap in capabilities:
        if cap.startswith(COST_CAPABILITY):
            try:
                value = float(cap.removeprefix(COST_CAPABILITY))
            except ValueError:
                return 0.0
            return value if math.isfinite(value) and value >= 0 else 0.0
    return 0.0


class StatusLike(Protocol):
    """The fields of `protocol.messages.Status` admission reads."""

    @property
    def role(self) -> str: ...

    @property
    def follows(self) -> str: ...

    @property
    def throughput(self) -> float: ...

    @property
    def capabilities(self) -> tuple[str, ...]: ...

    @property
    def policy_version(self) -> int: ...


@dataclass(frozen=True)
class Admitted:
    joined: bool = False  # first Status of this worker: it was admitted now
    snapshot: bool = False  # publish a snapshot of the current policy for it


@dataclass
class Admission:
    me: str
    delegates: dict[str, frozenset[str]] = field(default_factory=dict)
    workers: dict[str, WorkerReport] = field(default_factory=dict)
    active: set[str] = field(default_factory=set)
    tokens: int = 0
    completions: int = 0
    train_s: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.delegates.setdefault(self.me, frozenset())

    def on_status(self, peer: str, status: StatusLike, now: float, published_version: int,
                  held: Sequence[Held] = ()) -> Admitted:
        if status.role != "worker" or status.follows != self.me:
            return Admitted()
        per_rollout = self.tokens / self.completions if self.completions else 0.0
        rate = status.throughput / per_rollout if per_rollout > 0 and status.throughput > 0 else None
        self.workers[peer] = WorkerReport(peer, reported_cost(status.capabilities), now, rate)
        if peer in self.delegates[self.me]:
            return Admitted(snapshot=stranded(held, status.policy_version))
        self.delegates[self.me] = self.delegates[self.me] | {peer}
        self.active.add(peer)
        return Admitted(joined=True, snapshot=published_version > 0)

    def on_rollouts(self, tokens: int, completions: int) -> None:
        self.tokens += tokens
        self.completions += completions

    def on_trained(self, seconds: float) -> None:
        self.train_s.append(seconds)

    def demand(self, rollouts_per_step: int, kappa: int) -> Demand:
        step_s = max(statistics.median(self.train_s[-10:]), 1e-3) if self.train_s else 1.0
        return Demand(rollouts_per_step=rollouts_per_step, learner_step_s=step_s, kappa=kappa)

    def started(self, peer: str) -> None:
        self.active.add(peer)

    def stopped(self, peer: str) -> None:
        self.active.discard(peer)

    def receivers(self) -> list[str]:
        return sorted(self.active & self.delegates[self.me])
