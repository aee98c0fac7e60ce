"""Cost-aware activation of inference workers for a running learner (ECHO-2): which workers to start or stop.

Contract (pure: no I/O, no clocks; the caller passes `now` and sends the WorkerControl start/stop messages):
- `WorkerActivator(policy)` keeps one record per worker it has heard of. `decide(now, demand, reports)` takes
  the newest `WorkerReport`s (measured throughput over a window, price, when last heard from) and the learner's
  `Demand`, and returns a `Decision`: the workers to start, the workers to stop, and the active set afterwards.
  The activator assumes the caller carries the decision out (its records say so from then on).
- Required throughput is plan_model.required_throughput(demand) (R / T, more under a staleness cap); the target
  is that times (1 + headroom). Selection is plan_search.cheapest_set, so "cheapest" means the same as in
  `swarm-node plan`: least $/h reaching the target, cheap per throughput first.
- Hysteresis, so that measurement noise does not flap workers:
  * start only when the active workers' estimated throughput falls below the requirement, and then add the
    cheapest workers that lift it to the target (the headroom band absorbs noise);
  * stop only by re-planning, once every active worker is past `min_dwell_s` since its start: when the cheapest
    set for the target (workers stopped less than `min_dwell_s` ago kept out) costs at least `min_saving` less
    than the active set, start what it adds and stop what it drops;
  * a worker started less than `min_dwell_s` ago is judged by the larger of its measurement and its earlier
    estimate (warm-up: loading weights is not slowness).
- A worker not heard from for `silent_after_s` is stopped at once (reason "silent") and is no candidate until it
  reports again.
- Throughput must be measured while generating (rollouts per busy second), not per wall second: under the
  staleness flow control an over-provisioned worker idles, and its wall-clock rate would understate it.
- A worker whose throughput was never measured is assumed to have `policy.prior_rollouts_s`, else the median of
  the measured ones, else the whole target (so unknown workers are tried one at a time, cheapest first).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass

from swarm_node.echo.plan_model import WorkerSpec, required_throughput
from swarm_node.echo.plan_search import cheapest_set
from swarm_node.errors import UserError


@dataclass(frozen=True)
class ActivationPolicy:
    headroom: float = 0.1  # target = required x (1 + headroom)
    min_saving: float = 0.1  # re-plan to a cheaper set only if it saves this fraction of the active $/h
    min_dwell_s: float = 60.0  # after a start or stop, a worker keeps its state this long unless silent or needed
    silent_after_s: float = 30.0  # no report for this long: deactivate
    prior_rollouts_s: float | None = None  # assumed throughput of a never-measured worker

    def __post_init__(self) -> None:
        for name in ("headroom", "min_saving", "min_dwell_s"):
            if getattr(self, name) < 0:
                raise UserError(f"activation {name} must be >= 0, got {getattr(self, name)}")
        if self.min_saving >= 1:
            raise UserError(f"activation min_saving must be < 1, got {self.min_saving}")
        if self.silent_after_s <= 0:
            raise UserError(f"activation silent_after_s must be > 0, got {self.silent_after_s}")
        if self.prior_rollouts_s is not None and self.prior_rollouts_s <= 0:
            raise UserError(f"activation prior_rollouts_s must be > 0, got {self.prior_rollouts_s}")


@dataclass(frozen=True)
class WorkerReport:
    name: str  # the worker's peer id
    cost_per_hour: float
    last_seen: float  # when we last heard from it (same clock as `now`)
    throughput_rollouts_s: float | None = None  # over the last window, while generating; None: not measured


@dataclass(frozen=True)
class Demand:
    rollouts_per_step: float  # R
    learner_step_s: float  # T: the learner's training time per step
    kappa: int = 1
    max_staleness: int | None = None  # with a cap, generation must also fit in its slack
    latency_s: float = 0.0  # measured dissemination + upload, used with the cap

    def __post_init__(self) -> None:
        if not (self.rollouts_per_step > 0 and self.learner_step_s > 0 and self.kappa >= 1 and self.latency_s >= 0):
            raise ValueError(f"bad demand {self}: R and T must be > 0, kappa >= 1, latency >= 0")


@dataclass(frozen=True)
class Decision:
    start: tuple[str, ...]
    stop: tuple[str, ...]
    active: tuple[str, ...]  # after the decision
    required_rollouts_s: float
    active_rollouts_s: float  # estimated throughput of `active`
    reason: str  # "steady", "under-provisioned", "cheaper set", "silent", joined by "+"; "short" if even all fall short


@dataclass
class _Record:
    cost_per_hour: float
    last_seen: float
    measured: float | None = None  # newest measurement
    before_start: float | None = None  # the estimate when it was last started (warm-up floor)
    active: bool = False
    changed_at: float = float("-inf")


class WorkerActivator:
    def __init__(self, policy: ActivationPolicy | None = None) -> None:
        self.policy = policy or ActivationPolicy()
        self._workers: dict[str, _Record] = {}

    @property
    def active(self) -> tuple[str, ...]:
        return tuple(sorted(n for n, r in self._workers.items() if r.active))

    def forget(self, name: str) -> None:
        """Drop a worker that left for good (e.g. its connection closed and it said goodbye)."""
        self._workers.pop(name, None)

    def decide(self, now: float, demand: Demand, reports: Iterable[WorkerReport] = ()) -> Decision:
        policy = self.policy
        for rep in reports:
            rec = self._workers.get(rep.name)
            if rec is None:
                rec = self._workers[rep.name] = _Record(rep.cost_per_hour, rep.last_seen)
            rec.cost_per_hour = rep.cost_per_hour
            rec.last_seen = max(rec.last_seen, rep.last_seen)
            if rep.throughput_rollouts_s is not None:
                rec.measured = max(0.0, rep.throughput_rollouts_s)

        reasons: list[str] = []
        stop: list[str] = []
        start: list[str] = []
        for name, rec in sorted(self._workers.items()):
            if rec.active and now - rec.last_seen > policy.silent_after_s:
                stop.append(name)
                self._set(name, False, now)
        if stop:
            reasons.append("silent")

        need = required_throughput(demand.rollouts_per_step, demand.learner_step_s, demand.kappa,
                                   demand.max_staleness, demand.latency_s)
        target = need * (1 + policy.headroom)
        estimates = self._estimates(now, target)
        cands = {n: WorkerSpec(n, est, self._workers[n].cost_per_hour) for n, est in estimates.items() if est > 0}
        active = [n for n in self.active]
        have = sum(estimates.get(n, 0.0) for n in active)

        if have < need:
            # Starving the learner costs more than a flap: every alive worker may be started, even one in dwell.
            found = cheapest_set(list(cands.values()), target, forced=[n for n in active if n in cands])
            picked = {w.name for w in found[0]} if found is not None else set(cands)
            start = sorted(picked - set(active))
            reasons.append("under-provisioned" if found is not None else "short")
        elif all(now - self._workers[n].changed_at >= policy.min_dwell_s for n in active):
            # Re-plan only once every active worker is past its dwell: a warming worker's assumed estimate may
            # justify not starting more, never stopping others. Workers stopped within the dwell stay out.
            pool = [w for n, w in cands.items()
                    if self._workers[n].active or now - self._workers[n].changed_at >= policy.min_dwell_s]
            found = cheapest_set(pool, target)
            if found is not None:
                new = {w.name for w in found[0]}
                cost_now = sum(self._workers[n].cost_per_hour for n in active)
                cost_new = sum(w.cost_per_hour for w in found[0])
                if cost_new < cost_now * (1 - policy.min_saving) and cost_new < cost_now:
                    start = sorted(new - set(active))
                    stop += sorted(set(active) - new)
                    reasons.append("cheaper set")
        for name in start:
            self._workers[name].before_start = estimates[name]
            self._set(name, True, now)
        for name in stop:
            if self._workers[name].active:
                self._set(name, False, now)
        after = self.active
        return Decision(start=tuple(start), stop=tuple(stop), active=after, required_rollouts_s=need,
                        active_rollouts_s=sum(estimates.get(n, 0.0) for n in after),
                        reason="+".join(reasons) or "steady")

    def _set(self, name: str, active: bool, now: float) -> None:
        rec = self._workers[name]
        rec.active, rec.changed_at = active, now

    def _estimates(self, now: float, target: float) -> dict[str, float]:
        """Estimated rollouts/s of every worker heard from within silent_after_s."""
        policy = self.policy
        alive = {n: r for n, r in self._workers.items() if now - r.last_seen <= policy.silent_after_s}
        measured = [r.measured for r in alive.values() if r.measured is not None and r.measured > 0]
        prior = policy.prior_rollouts_s or (statistics.median(measured) if measured else target)
        out = {}
        for name, rec in alive.items():
            est = rec.measured if rec.measured is not None else prior
            warming = rec.active and now - rec.changed_at < policy.min_dwell_s and rec.before_start is not None
            out[name] = max(est, rec.before_start) if warming else est
        return out
