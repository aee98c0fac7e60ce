"""Capacity planning for a learner and its inference workers (ECHO-2's overlap-based provisioning rule).

Modules: this one (`plan`, `Plan`, `plan_to_dict`); `plan_model` (inputs, dissemination, the overlap model);
`plan_search` (`cheapest_set`); `plan_file` (`input_from_mapping`, `measure_run`).

Contract (pure: no I/O, no clocks; docs/PLANNING.md derives every formula):
- Units. A "rollout" is whatever `rollouts_per_step` counts (one completion, or one group of G completions); every
  throughput is in the same unit per second. Bytes are bytes; "MB" means 10**6 bytes, bandwidths are MB/s.
- `plan(PlanInput) -> Plan`: the cheapest set of workers that keeps the learner fully busy (and, if a staleness
  cap is given, does so within it), the dissemination latency of a delta to that set under the chosen relay
  schedule (and a star's for comparison), the learner's utilisation for each staleness bound S, and the smallest
  S that sustains full utilisation. An unreachable demand is a `Plan` with `feasible=False` and a one-line
  `reason` ("need X more rollouts/s"), computed for the best effort (every usable worker). A worker whose device
  class has less memory than `worker_memory_mib` is excluded, with the reason.
- `plan_search.cheapest_set(...)` is the selection the runtime activator reuses: exact branch and bound for up to
  `exact_limit` candidates, greedy by cost per throughput beyond (then a pass that drops what is not needed).
- The timing model (steady state, deterministic, fluid): the learner trains T s per step and publishes every
  kappa steps; a delta reaches every chosen worker D s after publication; the workers generate one step's R
  rollouts in G = R / (sum of their throughputs) s, started once the newest version is there; uploading them
  takes U s. Step k may train on rollouts of version >= k - S (version v exists once step v - 1 ends). With
  x = D + G + U, the learner's step period P(S) is (T + x) / (S + 1) for kappa = 1 (S = 0: synchronous, T + x),
  in general `learner_period_s`, never below max(T, G, U, busiest uplink / kappa); S < kappa - 1 deadlocks.
  Utilisation is T / P(S); the smallest S with P(S) = T is kappa - 1 + ceil(x / T), once G, U and the uplink fit.
- Invalid input (non-positive times or sizes, zero bandwidth, no workers, unknown keys) raises UserError with
  one line naming the field.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from swarm_node.echo.plan_model import (
    MB,
    REL_TOL,
    Dissemination,
    PlanInput,
    WorkerSpec,
    dissemination,
    learner_period_s,
    min_full_staleness,
    required_throughput,
)
from swarm_node.echo.plan_search import cheapest_set, sort_key


@dataclass(frozen=True)
class StalenessRow:
    staleness: int
    period_s: float  # seconds per learner step (inf: deadlock)
    utilisation: float  # T / period
    cost_per_step: float  # (workers + learner) $ per learner step (inf: deadlock)


@dataclass(frozen=True)
class Plan:
    feasible: bool
    reason: str  # "" when feasible, else one line saying what is missing
    search: str  # "exact" | "greedy" | "none" (infeasible: the best effort is every usable worker)
    chosen: tuple[WorkerSpec, ...]
    throughput_rollouts_s: float  # of the chosen workers
    required_rollouts_s: float  # R / T (or more, under a staleness cap)
    shortfall_rollouts_s: float  # 0 when feasible
    cost_per_hour: float  # of the chosen workers
    dissemination: Dissemination | None  # None when no worker is usable
    generation_s: float  # G: one step's rollouts at the chosen workers' throughput (inf: none chosen)
    upload_s: float  # U
    min_staleness: int | None  # smallest S with full utilisation (None: none reaches it)
    rows: tuple[StalenessRow, ...]  # S = 0, 1, ...
    excluded: tuple[tuple[str, str], ...]  # (worker, why it cannot be used)


def plan(inp: PlanInput) -> Plan:
    """The cheapest set of workers that keeps the learner busy, and what it implies (see the module contract)."""
    t, r, kappa = inp.learner_step_s, inp.rollouts_per_step, inp.kappa
    upload = inp.upload_s
    excluded: list[tuple[str, str]] = []
    usable: list[WorkerSpec] = []
    for w in inp.workers:
        # A worker that cannot even take in one delta per kappa steps falls further behind every version. (A
        # worker on the learner's rate fails only if the learner's link does: checked once, below.)
        receive_s = inp.delta_bytes / ((w.bandwidth_mb_s or inp.bandwidth_mb_s) * MB)
        need = inp.worker_memory_mib
        if need is not None and w.memory_mib is not None and w.memory_mib < need:
            excluded.append((w.name, f"its device class {w.device!r} has {w.memory_mib:g} MiB, a worker needs "
                                     f"{need:g} MiB"))
        elif w.bandwidth_mb_s is not None and receive_s > kappa * t * (1 + REL_TOL):
            excluded.append((w.name, f"its link needs {receive_s:.3g} s per delta, more than kappa steps "
                                     f"({kappa * t:.3g} s)"))
        else:
            usable.append(w)

    def latency(ws: tuple[WorkerSpec, ...]) -> Dissemination:
        return dissemination(inp, ws)

    def accept(ws: tuple[WorkerSpec, ...]) -> bool:
        if not ws:
            return False
        d = latency(ws)
        thr = sum(w.throughput_rollouts_s for w in ws)
        need = required_throughput(r, t, kappa, inp.max_staleness, d.latency_s + upload)
        return thr >= need * (1 - REL_TOL) and d.busiest_uplink_s <= kappa * t * (1 + REL_TOL)

    base_need = r / t
    reason = ""
    found = None
    source_s = inp.delta_bytes / (inp.bandwidth_mb_s * MB)
    if source_s > kappa * t * (1 + REL_TOL):  # every schedule sends at least one copy from the learner
        reason = (f"infeasible: the learner's link needs {source_s:.3g} s per delta ({inp.delta_bytes / MB:g} MB at "
                  f"{inp.bandwidth_mb_s:g} MB/s), more than kappa steps ({kappa * t:.3g} s); raise kappa or bandwidth")
        usable = []
    elif upload > t * (1 + REL_TOL):
        reason = (f"infeasible: uploading one step's rollouts takes {upload:.3g} s at "
                  f"{inp.bandwidth_mb_s:g} MB/s, more than a learner step ({t:g} s)")
    elif usable:
        found = cheapest_set(usable, base_need, accept, exact_limit=inp.exact_limit)
    if found is not None:
        chosen, search = found
    else:
        chosen, search = tuple(sorted(usable, key=sort_key)), "none"
        if not reason:
            reason = _why_not(inp, chosen, upload, excluded)

    thr = sum(w.throughput_rollouts_s for w in chosen)
    d = latency(chosen) if chosen else None
    d_s = d.latency_s if d else 0.0
    busiest = d.busiest_uplink_s if d else 0.0
    gen = r / thr if thr > 0 else math.inf
    required = required_throughput(r, t, kappa, inp.max_staleness, d_s + upload) if chosen else base_need
    s_min = min_full_staleness(t, gen, upload, d_s, busiest, kappa) if chosen else None
    cost = sum(w.cost_per_hour for w in chosen)
    last = s_min if s_min is not None else kappa + 2
    if inp.max_staleness is not None:
        last = max(last, inp.max_staleness)
    rows = []
    for s in range(0, min(max(last, kappa), 64) + 1):
        period = learner_period_s(s, t, gen, upload, d_s, busiest, kappa) if chosen else math.inf
        util = t / period if math.isfinite(period) else 0.0
        per_step = (cost + inp.learner_cost_per_hour) * period / 3600 if math.isfinite(period) else math.inf
        rows.append(StalenessRow(s, period, util, per_step))
    shortfall = 0.0 if found is not None else max(0.0, required - thr) if math.isfinite(required) else math.inf
    return Plan(feasible=found is not None, reason=reason, search=search, chosen=chosen, throughput_rollouts_s=thr,
                required_rollouts_s=required, shortfall_rollouts_s=shortfall, cost_per_hour=cost, dissemination=d,
                generation_s=gen, upload_s=upload, min_staleness=s_min, rows=tuple(rows), excluded=tuple(excluded))


def _why_not(inp: PlanInput, usable: tuple[WorkerSpec, ...], upload: float,
             excluded: list[tuple[str, str]]) -> str:
    """One line: what the best effort (every usable worker) lacks."""
    if not usable:
        return f"infeasible: no worker's link can take in a delta every kappa steps ({len(excluded)} excluded)"
    t, r, kappa = inp.learner_step_s, inp.rollouts_per_step, inp.kappa
    d = dissemination(inp, usable)
    have = sum(w.throughput_rollouts_s for w in usable)
    need = required_throughput(r, t, kappa, inp.max_staleness, d.latency_s + upload)
    if not math.isfinite(need):
        return (f"infeasible: dissemination + upload take {d.latency_s + upload:.3g} s, which leaves no time for "
                f"generation within S = {inp.max_staleness} (kappa {kappa}, step {t:g} s)")
    if have < need * (1 - REL_TOL):
        return f"infeasible: need {need - have:.4g} more rollouts/s (have {have:.4g}, need {need:.4g})"
    if d.busiest_uplink_s > kappa * t * (1 + REL_TOL):
        return (f"infeasible: the busiest uplink needs {d.busiest_uplink_s:.3g} s per delta under "
                f"{inp.schedule}, more than kappa steps ({kappa * t:.3g} s); raise kappa or bandwidth")
    return "infeasible: no set of workers meets the throughput and the dissemination limits together"


def plan_to_dict(p: Plan) -> dict[str, Any]:
    """JSON-ready: infinities become None."""
    def clean(x: Any) -> Any:
        if isinstance(x, float) and not math.isfinite(x):
            return None
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items()}
        if isinstance(x, list | tuple):
            return [clean(v) for v in x]
        return x

    out = asdict(p)
    out["excluded"] = [{"worker": name, "reason": why} for name, why in p.excluded]
    return clean(out)
