"""Capacity planning for a learner and its inference workers (ECHO-2's overlap-based provisioning rule).

Contract (pure: no I/O, no clocks; docs/PLANNING.md derives every formula):
- Units. A "rollout" is whatever `rollouts_per_step` counts (one completion, or one group of G completions); every
  throughput is in the same unit per second. Bytes are bytes; "MB" means 10**6 bytes, bandwidths are MB/s.
- `plan(PlanInput) -> Plan`: the cheapest set of workers that keeps the learner fully busy (and, if a staleness
  cap is given, does so within it), the dissemination latency of a delta to that set under the chosen relay
  schedule (and a star's for comparison), the learner's utilisation for each staleness bound S, and the smallest
  S that sustains full utilisation. An unreachable demand is a `Plan` with `feasible=False` and a one-line
  `reason` ("need X more rollouts/s"), computed for the best effort (every usable worker).
- `cheapest_set(...)` is the selection the runtime activator reuses: exact branch and bound for up to
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
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from swarm_node.errors import UserError

MB = 1_000_000  # bytes; network rates are quoted in decimal megabytes
DEFAULT_SCHEDULE = "stripe:2"  # the same default as protocol.relay
EXACT_LIMIT = 20  # candidates up to which the selection is exact (branch and bound)
_REL_TOL = 1e-9  # float slack when comparing times and rates that are equal on paper


# --------------------------------------------------------------------------------------------------- inputs
@dataclass(frozen=True)
class WorkerSpec:
    """One inference worker: its rollout throughput (while generating), its price, and its link (None: as fast
    as the learner's)."""

    name: str
    throughput_rollouts_s: float
    cost_per_hour: float
    bandwidth_mb_s: float | None = None

    def __post_init__(self) -> None:
        if not self.name:
            raise UserError("a worker needs a non-empty name")
        _positive(f"worker {self.name!r}: throughput", self.throughput_rollouts_s)
        _non_negative(f"worker {self.name!r}: cost_per_hour", self.cost_per_hour)
        if self.bandwidth_mb_s is not None:
            _positive(f"worker {self.name!r}: bandwidth_mb_s", self.bandwidth_mb_s)


@dataclass(frozen=True)
class PlanInput:
    """What the plan needs; field checks name the plan file's keys ([learner], [network])."""

    learner_step_s: float  # T: seconds the learner trains per step
    rollouts_per_step: float  # R: rollouts one step consumes
    delta_bytes: int  # M: bytes of one published delta
    bandwidth_mb_s: float  # B: the learner's link, MB/s (and every worker's unless it says otherwise)
    chunk_bytes: int  # chunk size of the pipelined broadcast; K = ceil(M / chunk_bytes)
    workers: tuple[WorkerSpec, ...]
    kappa: int = 1  # publish a delta every kappa steps
    schedule: str = DEFAULT_SCHEDULE  # relay schedule of the broadcast (names as in protocol.relay)
    rollout_bytes: int = 0  # bytes uploaded per rollout (0: ignore the upload)
    hop_latency_s: float = 0.0  # one-way latency added per relay hop
    max_staleness: int | None = None  # S cap: choose workers so that full utilisation holds within it
    learner_cost_per_hour: float = 0.0  # only for the cost per step
    exact_limit: int = EXACT_LIMIT

    def __post_init__(self) -> None:
        _positive("learner.step_s", self.learner_step_s)
        _positive("learner.rollouts_per_step", self.rollouts_per_step)
        _int_at_least("delta_bytes", self.delta_bytes, 1)
        _positive("network.bandwidth_mb_s", self.bandwidth_mb_s)
        _int_at_least("chunk_bytes", self.chunk_bytes, 1)
        _int_at_least("learner.kappa", self.kappa, 1)
        _int_at_least("rollout_bytes (learner.rollout_kb)", self.rollout_bytes, 0)
        _non_negative("network.hop_latency_s", self.hop_latency_s)
        _non_negative("learner.cost_per_hour", self.learner_cost_per_hour)
        if self.max_staleness is not None:
            _int_at_least("learner.max_staleness", self.max_staleness, 0)
        _int_at_least("exact_limit", self.exact_limit, 0)
        parse_schedule(self.schedule)
        if not self.workers:
            raise UserError("no workers: give at least one [[workers]] entry (or --worker)")
        names = [w.name for w in self.workers]
        if len(set(names)) != len(names):
            dup = next(n for n in names if names.count(n) > 1)
            raise UserError(f"worker name {dup!r} appears twice")

    @property
    def chunks(self) -> int:
        return -(-self.delta_bytes // self.chunk_bytes)

    @property
    def upload_s(self) -> float:
        """U: one step's rollouts through the learner's link."""
        return self.rollouts_per_step * self.rollout_bytes / (self.bandwidth_mb_s * MB)


def _positive(what: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise UserError(f"{what} must be a finite number > 0, got {value!r}")


def _non_negative(what: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise UserError(f"{what} must be a finite number >= 0, got {value!r}")


def _int_at_least(what: str, value: int, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise UserError(f"{what} must be an integer >= {low}, got {value!r}")


# ------------------------------------------------------------------------------------- delta dissemination
@dataclass(frozen=True)
class Dissemination:
    """How long one delta takes to reach every chosen worker, and what it costs the busiest uplink."""

    schedule: str
    receivers: int  # N
    depth: int  # hops from the learner to the farthest receiver
    chunks: int  # K
    hop_bandwidth_mb_s: float  # the rate a relay hop is modelled at: the slowest link involved
    latency_s: float  # D: publication -> the last receiver holds the whole delta
    floor_s: float  # M / B: every receiver must take in M bytes
    star_s: float  # the same delta sent by the learner to each receiver (the baseline)
    busiest_uplink_s: float  # seconds the busiest uplink spends sending one delta (must fit in kappa steps)


@dataclass(frozen=True)
class _Times:
    """Seconds to move the whole delta (M bytes) over one link, for the links a schedule uses."""

    hop_s: float  # M / (the slowest of the learner and the receivers): a relay hop
    source_s: float  # M / the learner's uplink
    receive_s: float  # M / the slowest receiver's downlink


# A broadcast model: (N, fan-out parameter, K, link times) -> (depth, latency without hop latency, busiest uplink s).
BroadcastModel = Callable[[int, "int | None", int, _Times], tuple[int, float, float]]


def _levels(n: int, first: int, fanout: int) -> int:
    """Depth of a tree whose level 1 holds `first` nodes and every further level `fanout` times the previous."""
    depth, width, held = 1, first, first
    while held < n:
        width *= fanout
        held += width
        depth += 1
    return depth


def _chain(n: int, param: int | None, k: int, t: _Times) -> tuple[int, float, float]:
    # Chunk j leaves the learner at j*c (c = hop_s/K) and crosses N hops: the last arrives at (K + N - 1)*c.
    return n, t.hop_s * (1 + (n - 1) / k), t.hop_s


def _tree(n: int, param: int | None, k: int, t: _Times) -> tuple[int, float, float]:
    # Every interior node (the learner too) sends each chunk to f children at once, so a hop runs at B/f.
    f = min(param or 2, n)
    depth = _levels(n, f, f)
    return depth, f * t.hop_s * (1 + (depth - 1) / k), f * t.hop_s


def _star(n: int, param: int | None, k: int, t: _Times) -> tuple[int, float, float]:
    # The learner's uplink carries N full copies at once; chunking does not help.
    return 1, max(n * t.source_s, t.receive_s), n * t.source_s


def _stripe(n: int, param: int | None, k: int, t: _Times) -> tuple[int, float, float]:
    # f stripes of K/f chunks, each an f-ary tree under one learner child (protocol.relay.stripe). A hop runs at
    # B/f, so a chunk takes f*c per hop and a stripe's last chunk arrives after (K/f + depth - 1) * f * c; every
    # node sends about M in all (f children x M/f), the learner M once.
    f = param or 2
    depth = _levels(n, 1, f)
    return depth, t.hop_s * (max(k / f, 1.0) + depth - 1) * f / k, t.hop_s


BROADCAST_MODELS: dict[str, BroadcastModel] = {"chain": _chain, "tree": _tree, "star": _star, "stripe": _stripe}
_TAKES_PARAM = frozenset({"tree", "stripe"})


def parse_schedule(spec: str) -> tuple[str, int | None]:
    """"name" or "name:f" -> (name, f); UserError unless the name has a model and f is an int in [1, 64]."""
    name, sep, raw = spec.partition(":")
    if name not in BROADCAST_MODELS:
        raise UserError(f"network.schedule {spec!r}: unknown schedule (known: {', '.join(sorted(BROADCAST_MODELS))})")
    if not sep:
        return name, None
    if name not in _TAKES_PARAM:
        raise UserError(f"network.schedule {spec!r}: {name} takes no fan-out")
    if not (raw.isascii() and raw.isdigit() and 1 <= int(raw) <= 64):
        raise UserError(f"network.schedule {spec!r}: fan-out must be an integer in [1, 64]")
    return name, int(raw)


def dissemination(inp: PlanInput, receivers: Sequence[WorkerSpec]) -> Dissemination:
    """D for `receivers` (at least one) under inp.schedule. A relay hop is modelled at the slowest link among the
    learner and the receivers (in chain, tree and stripe every receiver may relay); a star at the learner's
    uplink shared N ways, bounded by the slowest receiver's downlink."""
    if not receivers:
        raise ValueError("dissemination needs at least one receiver")
    name, param = parse_schedule(inp.schedule)
    slowest = min(w.bandwidth_mb_s or inp.bandwidth_mb_s for w in receivers)
    hop = min(inp.bandwidth_mb_s, slowest)
    m = inp.delta_bytes
    times = _Times(hop_s=m / (hop * MB), source_s=m / (inp.bandwidth_mb_s * MB), receive_s=m / (slowest * MB))
    n, k = len(receivers), inp.chunks
    depth, latency, busiest = BROADCAST_MODELS[name](n, param, k, times)
    _, star, _ = _star(n, None, k, times)
    return Dissemination(schedule=inp.schedule, receivers=n, depth=depth, chunks=k, hop_bandwidth_mb_s=hop,
                         latency_s=latency + depth * inp.hop_latency_s, floor_s=times.hop_s,
                         star_s=star + inp.hop_latency_s, busiest_uplink_s=busiest)


# -------------------------------------------------------------------------------------- the overlap model
def learner_period_s(staleness: int, step_s: float, gen_s: float, upload_s: float, dissem_s: float,
                     busiest_uplink_s: float, kappa: int = 1) -> float:
    """Steady-state seconds per learner step under bound S (math.inf: the learner deadlocks). See PLANNING.md.

    Version v exists when step v-1 ends; its rollouts are there x = D + G + U later; step k may use a version
    >= k - S. With s_k the start of step k and q(k) the oldest usable published version, s_k >= s_{k-1} + T and
    s_k >= s_{q(k)-1} + T + x. The growth rate of that max-plus recurrence (its critical cycle: one version's wait
    spanning sigma = S - kappa + 2 steps, repeated every m*kappa steps, m = ceil(sigma / kappa)) is
    T + max(0, x - (sigma - 1) T) / (m kappa); S = kappa - 1 is the synchronous cycle
    (D + U + G + (kappa - 1) max(G, T) + T) / kappa, exact even when the workers are the bottleneck. The workers,
    the upload and the learner's uplink bound the period from below on their own: max(G, U, busiest / kappa).
    """
    if staleness < kappa - 1:  # the learner needs a version newer than any it will publish
        return math.inf
    x = dissem_s + gen_s + upload_s
    best = (dissem_s + upload_s + gen_s + (kappa - 1) * max(gen_s, step_s) + step_s) / kappa
    # A schedule that works under a smaller bound works under a larger one: take the best over S' <= S.
    for s in range(kappa, staleness + 1):
        sigma = s - kappa + 2
        m = -(-sigma // kappa)
        best = min(best, step_s + max(0.0, x - (sigma - 1) * step_s) / (m * kappa))
    return max(best, step_s, gen_s, upload_s, busiest_uplink_s / kappa)


def min_full_staleness(step_s: float, gen_s: float, upload_s: float, dissem_s: float, busiest_uplink_s: float,
                       kappa: int = 1) -> int | None:
    """The smallest S with learner_period_s(S) == step_s, or None when no S gets there (the workers, the upload
    or the learner's uplink cannot keep pace with one step per step_s)."""
    if max(gen_s, upload_s, busiest_uplink_s / kappa) > step_s * (1 + _REL_TOL):
        return None
    return kappa - 1 + max(1, math.ceil((dissem_s + gen_s + upload_s) / step_s - _REL_TOL))


def required_throughput(rollouts_per_step: float, step_s: float, kappa: int = 1, max_staleness: int | None = None,
                        latency_s: float = 0.0) -> float:
    """Aggregate rollouts/s that keeps the learner fully busy: R / T, and with a staleness cap S also enough that
    generation fits in the slack: G = R / rate <= (S - kappa + 1) T - latency (latency = D + U).
    math.inf when the cap leaves no time for generation at all."""
    need = rollouts_per_step / step_s
    if max_staleness is None:
        return need
    room = (max_staleness - kappa + 1) * step_s - latency_s
    if room <= 0:
        return math.inf
    return max(need, rollouts_per_step / room)


# ------------------------------------------------------------------------------------------- the selection
def _sort_key(w: WorkerSpec) -> tuple[float, float, float, float, str]:
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
    free = sorted((w for w in workers if w.name not in forced), key=_sort_key)

    def ok(ws: tuple[WorkerSpec, ...]) -> bool:
        thr = sum(w.throughput_rollouts_s for w in ws)
        return thr >= need_rollouts_s * (1 - _REL_TOL) and (accept is None or accept(ws))

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
        if i == n or thr + suffix[i] < need * (1 - _REL_TOL):
            return
        ratio = free[i].cost_per_hour / free[i].throughput_rollouts_s
        if best:
            best_cost, best_thr = _rank(best[0])[0], -_rank(best[0])[1]
            bound = cost + max(0.0, need - thr) * ratio
            if bound > best_cost * (1 + _REL_TOL) + 1e-12:
                return
            if bound >= best_cost * (1 - _REL_TOL) - 1e-12:  # at best a tie on cost: must bring more throughput
                budget = best_cost * (1 + _REL_TOL) + 1e-12 - cost
                extra = suffix[i] if ratio == 0 else min(suffix[i], budget / ratio)
                if thr + extra <= best_thr * (1 + _REL_TOL):
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


# ------------------------------------------------------------------------------------------------ the plan
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
        if w.bandwidth_mb_s is not None and receive_s > kappa * t * (1 + _REL_TOL):
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
        return thr >= need * (1 - _REL_TOL) and d.busiest_uplink_s <= kappa * t * (1 + _REL_TOL)

    base_need = r / t
    reason = ""
    found = None
    source_s = inp.delta_bytes / (inp.bandwidth_mb_s * MB)
    if source_s > kappa * t * (1 + _REL_TOL):  # every schedule sends at least one copy from the learner
        reason = (f"infeasible: the learner's link needs {source_s:.3g} s per delta ({inp.delta_bytes / MB:g} MB at "
                  f"{inp.bandwidth_mb_s:g} MB/s), more than kappa steps ({kappa * t:.3g} s); raise kappa or bandwidth")
        usable = []
    elif upload > t * (1 + _REL_TOL):
        reason = (f"infeasible: uploading one step's rollouts takes {upload:.3g} s at "
                  f"{inp.bandwidth_mb_s:g} MB/s, more than a learner step ({t:g} s)")
    elif usable:
        found = cheapest_set(usable, base_need, accept, exact_limit=inp.exact_limit)
    if found is not None:
        chosen, search = found
    else:
        chosen, search = tuple(sorted(usable, key=_sort_key)), "none"
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
    if have < need * (1 - _REL_TOL):
        return f"infeasible: need {need - have:.4g} more rollouts/s (have {have:.4g}, need {need:.4g})"
    if d.busiest_uplink_s > kappa * t * (1 + _REL_TOL):
        return (f"infeasible: the busiest uplink needs {d.busiest_uplink_s:.3g} s per delta under "
                f"{inp.schedule}, more than kappa steps ({kappa * t:.3g} s); raise kappa or bandwidth")
    return "infeasible: no set of workers meets the throughput and the dissemination limits together"


# ------------------------------------------------------------------------------------ input from a mapping
_LEARNER_KEYS = {"step_s": float, "rollouts_per_step": float, "delta_mb": float, "kappa": int,
                 "max_staleness": int, "cost_per_hour": float, "tokens_per_rollout": float, "rollout_kb": float}
_NETWORK_KEYS = {"bandwidth_mb_s": float, "chunk_mb": float, "schedule": str, "hop_latency_s": float}
_WORKER_KEYS = {"name": str, "throughput": float, "tokens_per_s": float, "cost_per_hour": float,
                "bandwidth_mb_s": float, "count": int}
_SECTIONS = {"learner": _LEARNER_KEYS, "network": _NETWORK_KEYS}
DEFAULT_CHUNK_MB = 1.0


def _typed(value: Any, kind: type, where: str) -> Any:
    if kind is float and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if kind is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if kind is str and isinstance(value, str):
        return value
    names = {float: "a number", int: "an integer", str: "a string"}
    raise UserError(f"{where} must be {names[kind]}, got {value!r}")


def _table(data: Any, keys: Mapping[str, type], where: str) -> dict[str, Any]:
    if not isinstance(data, Mapping):
        raise UserError(f"{where} must be a table")
    out = {}
    for key, value in data.items():
        if key not in keys:
            raise UserError(f"unknown key {where}.{key}; known: {', '.join(sorted(keys))}")
        out[key] = _typed(value, keys[key], f"{where}.{key}")
    return out


def _required(table: Mapping[str, Any], key: str, where: str, hint: str) -> Any:
    if key not in table:
        raise UserError(f"{where}.{key} is required ({hint})")
    return table[key]


def _mb_to_bytes(what: str, mb: float) -> int:
    _positive(what, mb)
    return max(1, round(mb * MB))


def _kb_to_bytes(kb: float) -> int:
    _non_negative("learner.rollout_kb", kb)
    return round(kb * 1000)


def input_from_mapping(data: Mapping[str, Any], source: str = "the plan file") -> PlanInput:
    """A PlanInput from a plan file's tables ([learner], [network], [[workers]]); see docs/PLANNING.md.
    Unknown sections or keys, wrong types and missing required keys are one UserError line."""
    for section in data:
        if section not in (*_SECTIONS, "workers"):
            raise UserError(f"unknown section [{section}] in {source}; known: learner, network, workers")
    learner = _table(data.get("learner", {}), _LEARNER_KEYS, "learner")
    network = _table(data.get("network", {}), _NETWORK_KEYS, "network")
    raw_workers = data.get("workers", [])
    if not isinstance(raw_workers, list):
        raise UserError("workers must be an array of tables ([[workers]])")
    tokens_per_rollout = learner.get("tokens_per_rollout")
    if tokens_per_rollout is not None:
        _positive("learner.tokens_per_rollout", tokens_per_rollout)
    workers: list[WorkerSpec] = []
    for i, raw in enumerate(raw_workers):
        w = _table(raw, _WORKER_KEYS, f"workers[{i}]")
        name = _required(w, "name", f"workers[{i}]", "each worker needs a name")
        if ("throughput" in w) == ("tokens_per_s" in w):
            raise UserError(f"worker {name!r}: give exactly one of throughput (rollouts/s) or tokens_per_s")
        if "tokens_per_s" in w:
            if tokens_per_rollout is None:
                raise UserError(f"worker {name!r}: tokens_per_s needs learner.tokens_per_rollout to convert")
            throughput = w["tokens_per_s"] / tokens_per_rollout
        else:
            throughput = w["throughput"]
        cost = _required(w, "cost_per_hour", f"worker {name!r}", "dollars per hour; 0 for a free worker")
        count = w.get("count", 1)
        _int_at_least(f"worker {name!r}: count", count, 1)
        names = [name] if count == 1 else [f"{name}#{j}" for j in range(1, count + 1)]
        workers.extend(WorkerSpec(n, throughput, cost, w.get("bandwidth_mb_s")) for n in names)
    hint = "in the plan file or as a flag"
    return PlanInput(
        learner_step_s=_required(learner, "step_s", "learner", f"{hint}, or --from-run RUN_DIR"),
        rollouts_per_step=_required(learner, "rollouts_per_step", "learner", f"{hint}, or --from-run RUN_DIR"),
        delta_bytes=_mb_to_bytes("learner.delta_mb", _required(learner, "delta_mb", "learner", hint)),
        bandwidth_mb_s=_required(network, "bandwidth_mb_s", "network", hint),
        chunk_bytes=_mb_to_bytes("network.chunk_mb", network.get("chunk_mb", DEFAULT_CHUNK_MB)),
        workers=tuple(workers),
        kappa=learner.get("kappa", 1),
        schedule=network.get("schedule", DEFAULT_SCHEDULE),
        rollout_bytes=_kb_to_bytes(learner.get("rollout_kb", 0.0)),
        hop_latency_s=network.get("hop_latency_s", 0.0),
        max_staleness=learner.get("max_staleness"),
        learner_cost_per_hour=learner.get("cost_per_hour", 0.0),
    )


@dataclass(frozen=True)
class RunMeasurement:
    """What a node's metrics.jsonl says about its learner: medians over the trained steps."""

    steps: int
    train_s: float  # median seconds of training per step (the learner's busy time T)
    rollouts_per_step: float  # median groups per step (the unit is a group of G completions)
    gen_rollouts_s: float | None  # median groups/s of this node's own generation (None: it did not generate)


def measure_run(records: Iterable[Mapping[str, Any]]) -> RunMeasurement:
    """Medians over the steps that trained (skipped steps carry no train_s); UserError if there are none."""
    trained = [m for m in records if isinstance(m.get("train_s"), int | float) and m["train_s"] > 0
               and isinstance(m.get("groups_total"), int) and m["groups_total"] > 0]
    if not trained:
        raise UserError("the run's metrics hold no trained step (need train_s and groups_total)")
    gen = [m["groups_total"] / m["gen_s"] for m in trained if isinstance(m.get("gen_s"), int | float)
           and m["gen_s"] > 0]
    return RunMeasurement(steps=len(trained), train_s=statistics.median(m["train_s"] for m in trained),
                          rollouts_per_step=statistics.median(m["groups_total"] for m in trained),
                          gen_rollouts_s=statistics.median(gen) if gen else None)


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
