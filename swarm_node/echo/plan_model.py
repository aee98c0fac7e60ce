"""The plan model: inputs, the dissemination latency of a delta, and the overlap (staleness) timing model.

Contract (pure: no I/O, no clocks; docs/PLANNING.md derives every formula; units as in `planning`):
- `WorkerSpec` and `PlanInput` check their fields on construction: UserError with one line naming the field.
- `dissemination(inp, receivers)` models the broadcast of one delta under inp.schedule (a protocol.relay spec,
  parsed by protocol.relay.parse_schedule; `BROADCAST_MODELS` holds one model per schedule).
- `learner_period_s`, `min_full_staleness` and `required_throughput` are the overlap model of `planning`'s
  contract: the learner's step period under a staleness bound S, the smallest S at full utilisation, and the
  aggregate throughput that keeps the learner busy.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from protocol.relay import DEFAULT_SCHEDULE, MAX_FANOUT, SCHEDULES, TAKES_PARAM, ScheduleError
from protocol.relay import parse_schedule as parse_relay_schedule
from swarm_node.errors import UserError

MB = 1_000_000  # bytes; network rates are quoted in decimal megabytes
EXACT_LIMIT = 20  # candidates up to which the selection is exact (branch and bound)
REL_TOL = 1e-9  # float slack when comparing times and rates that are equal on paper


# --------------------------------------------------------------------------------------------------- inputs
@dataclass(frozen=True)
class WorkerSpec:
    """One inference worker: its rollout throughput (while generating), its price, its link (None: as fast
    as the learner's), and its device class with the memory it has (train/device_classes.py; None: not given)."""

    name: str
    throughput_rollouts_s: float
    cost_per_hour: float
    bandwidth_mb_s: float | None = None
    device: str = ""
    memory_mib: float | None = None

    def __post_init__(self) -> None:
        if not self.name:
            raise UserError("a worker needs a non-empty name")
        check_positive(f"worker {self.name!r}: throughput", self.throughput_rollouts_s)
        check_non_negative(f"worker {self.name!r}: cost_per_hour", self.cost_per_hour)
        if self.bandwidth_mb_s is not None:
            check_positive(f"worker {self.name!r}: bandwidth_mb_s", self.bandwidth_mb_s)


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
    worker_memory_mib: float | None = None  # memory a worker needs (model + KV cache); less excludes it

    def __post_init__(self) -> None:
        check_positive("learner.step_s", self.learner_step_s)
        check_positive("learner.rollouts_per_step", self.rollouts_per_step)
        check_int_at_least("delta_bytes", self.delta_bytes, 1)
        check_positive("network.bandwidth_mb_s", self.bandwidth_mb_s)
        check_int_at_least("chunk_bytes", self.chunk_bytes, 1)
        check_int_at_least("learner.kappa", self.kappa, 1)
        check_int_at_least("rollout_bytes (learner.rollout_kb)", self.rollout_bytes, 0)
        check_non_negative("network.hop_latency_s", self.hop_latency_s)
        check_non_negative("learner.cost_per_hour", self.learner_cost_per_hour)
        if self.max_staleness is not None:
            check_int_at_least("learner.max_staleness", self.max_staleness, 0)
        check_int_at_least("exact_limit", self.exact_limit, 0)
        if self.worker_memory_mib is not None:
            check_positive("learner.worker_memory_mib", self.worker_memory_mib)
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


def check_positive(what: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise UserError(f"{what} must be a finite number > 0, got {value!r}")


def check_non_negative(what: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise UserError(f"{what} must be a finite number >= 0, got {value!r}")


def check_int_at_least(what: str, value: int, low: int) -> None:
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


def parse_schedule(spec: str) -> tuple[str, int | None]:
    """"name" or "name:f" -> (name, f) by protocol.relay.parse_schedule; UserError naming network.schedule unless
    the name has a model here and f is an int in [1, MAX_FANOUT]."""
    name = spec.partition(":")[0]
    if name not in BROADCAST_MODELS or name not in SCHEDULES:
        raise UserError(f"network.schedule {spec!r}: unknown schedule (known: {', '.join(sorted(BROADCAST_MODELS))})")
    try:
        return parse_relay_schedule(spec)
    except ScheduleError:
        if name not in TAKES_PARAM:
            raise UserError(f"network.schedule {spec!r}: {name} takes no fan-out") from None
        raise UserError(f"network.schedule {spec!r}: fan-out must be an integer in [1, {MAX_FANOUT}]") from None


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
    if max(gen_s, upload_s, busiest_uplink_s / kappa) > step_s * (1 + REL_TOL):
        return None
    return kappa - 1 + max(1, math.ceil((dissem_s + gen_s + upload_s) / step_s - REL_TOL))


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

