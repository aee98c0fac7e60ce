"""The worker-set search: the cheapest set of workers that reaches a throughput (and passes an extra test).

Contract (pure): `cheapest_set(workers, need, accept, forced, exact_limit)` returns (set, "exact" | "greedy") or
None. Exact branch and bound (fractional-knapsack bounds, twins of identical specs tried as prefixes only) for up
to `exact_limit` free candidates; beyond, or once the exact search spends NODE_BUDGET nodes, greedy by cost per
throughput plus a pass that drops what is not needed (the better of that and the exact search's best so far). Sets
rank by cost, then more throughput, fewer workers, names. Costs >= 0. Used by `planning.plan` and echo/activation.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence

from swarm_node.echo.plan_model import EXACT_LIMIT, REL_TOL, WorkerSpec


def sort_key(w: WorkerSpec) -> tuple[float, float, float, float, str]:
    # Cheap per throughput first; identical specs end up adjacent (the search relies on it, see below).
    return (w.cost_per_hour / w.throughput_rollouts_s, -w.throughput_rollouts_s, w.cost_per_hour,
            -(w.bandwidth_mb_s or math.inf), w.name)


def _rank(ws: Sequence[WorkerSpec]) -> tuple[float, float, int, tuple[str, ...]]:
    """Cheaper first; at equal cost more throughput (headroom, smaller S), then fewer workers, then names."""
    return (sum(w.cost_per_hour for w in ws), -sum(w.throughput_rollouts_s for w in ws), len(ws),
            tuple(sorted(w.name for w in ws)))


def cheapest_set(workers: Sequence[WorkerSpec], need_rollouts_s: float,
                 accept: Callable[[tuple[WorkerSpec, ...]], bool] | None = None, forced: Iterable[str] = (),
                 exact_limit: int = EXACT_LIMIT) -> tuple[tuple[WorkerSpec, ...], str] | None:
    """The cheapest set (with every worker named in `forced`) whose throughput reaches `need_rollouts_s` and
    that `accept` (an extra condition, e.g. a staleness cap) takes; with the method used: "exact" (branch and
    bound, up to `exact_limit` free candidates), "greedy" (beyond, or when the exact search runs past its node
    budget; the better of its best so far and the greedy set). None if no set qualifies. Costs are >= 0."""
    forced = set(forced)
    fixed = tuple(w for w in workers if w.name in forced)
    free = sorted((w for w in workers if w.name not in forced), key=sort_key)

    def ok(ws: tuple[WorkerSpec, ...]) -> bool:
        thr = sum(w.throughput_rollouts_s for w in ws)
        return thr >= need_rollouts_s * (1 - REL_TOL) and (accept is None or accept(ws))

    if len(free) <= exact_limit:
        try:
            found = _branch_and_bound(fixed, free, need_rollouts_s, ok)
            return (found, "exact") if found is not None else None
        except _BudgetSpent as spent:
            partial = spent.best
    else:
        partial = None
    greedy = _greedy(fixed, free, need_rollouts_s, ok)
    options = [ws for ws in (partial, greedy) if ws is not None]
    return (min(options, key=_rank), "greedy") if options else None


NODE_BUDGET = 200_000  # search nodes before the exact search gives up (adversarial near-ties); ~1 s


class _BudgetSpent(Exception):
    def __init__(self, best: tuple[WorkerSpec, ...] | None) -> None:
        self.best = best


def _branch_and_bound(fixed: tuple[WorkerSpec, ...], free: list[WorkerSpec], need: float,
                      ok: Callable[[tuple[WorkerSpec, ...]], bool]) -> tuple[WorkerSpec, ...] | None:
    # free is sorted by cost per throughput, so free[i] has the lowest ratio of what remains: a deficit d costs at
    # least d * ratio more (fractional knapsack bound), a budget b buys at most b / ratio more throughput, and
    # nothing from i on adds more than suffix[i].
    n = len(free)
    suffix = [0.0] * (n + 1)
    for i in range(n - 1, -1, -1):
        suffix[i] = suffix[i + 1] + free[i].throughput_rollouts_s
    # Identical workers are interchangeable: skipping one skips its twins too (only prefixes of a run of twins
    # are tried), which keeps `count = 20` of one machine linear instead of 2**20.
    same = [(w.throughput_rollouts_s, w.cost_per_hour, w.bandwidth_mb_s) for w in free]
    next_other = [n] * (n + 1)
    for i in range(n - 2, -1, -1):
        next_other[i] = next_other[i + 1] if same[i] == same[i + 1] else i + 1
    best: list[tuple[WorkerSpec, ...]] = []
    nodes = [0]

    def visit(i: int, chosen: tuple[WorkerSpec, ...], cost: float, thr: float, fresh: bool) -> None:
        nodes[0] += 1
        if nodes[0] > NODE_BUDGET:
            raise _BudgetSpent(best[0] if best else None)
        if fresh and ok(chosen) and (not best or _rank(chosen) < _rank(best[0])):
            best[:] = [chosen]
        if i == n or thr + suffix[i] < need * (1 - REL_TOL):
            return
        ratio = free[i].cost_per_hour / free[i].throughput_rollouts_s
        if best:
            best_cost, best_thr = _rank(best[0])[0], -_rank(best[0])[1]
            bound = cost + max(0.0, need - thr) * ratio
            if bound > best_cost * (1 + REL_TOL) + 1e-12:
                return
            if bound >= best_cost * (1 - REL_TOL) - 1e-12:  # at best a tie on cost: must bring more throughput
                budget = best_cost * (1 + REL_TOL) + 1e-12 - cost
                extra = suffix[i] if ratio == 0 else min(suffix[i], budget / ratio)
                if thr + extra <= best_thr * (1 + REL_TOL):
                    return
        w = free[i]
        visit(i + 1, (*chosen, w), cost + w.cost_per_hour, thr + w.throughput_rollouts_s, True)
        visit(next_other[i], chosen, cost, thr, False)  # the same set: already judged

    visit(0, fixed, sum(w.cost_per_hour for w in fixed), sum(w.throughput_rollouts_s for w in fixed), True)
    return best[0] if best else None


def _greedy(fixed: tuple[WorkerSpec, ...], free: list[WorkerSpec], need: float,
            ok: Callable[[tuple[WorkerSpec, ...]], bool]) -> tuple[WorkerSpec, ...] | None:
    chosen = list(fixed)
    for w in free:
        if ok(tuple(chosen)):
            break
        chosen.append(w)
    if not ok(tuple(chosen)):
        return None
    # Drop what is not needed, dearest first (a late cheap-per-throughput worker can make an early one redundant).
    for w in sorted(chosen[len(fixed):], key=lambda w: (-w.cost_per_hour, w.name)):
        trial = tuple(x for x in chosen if x is not w)
        if ok(trial):
            chosen = list(trial)
    return tuple(chosen)

