"""WorkerActivator: cheapest start set, hysteresis (no flapping), dwell, warm-up, silent workers, re-planning."""

from __future__ import annotations

import random

import pytest

from swarm_node.echo.activation import ActivationPolicy, Demand, WorkerActivator, WorkerReport
from swarm_node.errors import UserError

# need = R / T = 40 / 10 = 4.0 rollouts/s; target with 10% headroom = 4.4.
DEMAND = Demand(rollouts_per_step=40, learner_step_s=10)
PRICES = {"cheap": 0.4, "mid": 0.9, "dear": 2.5}  # $/h; throughputs 2, 3, 5 -> $ per rollout/s 0.2, 0.3, 0.5
RATES = {"cheap": 2.0, "mid": 3.0, "dear": 5.0}


def reports(now: float, rates: dict[str, float | None], seen: dict[str, float] | None = None) -> list[WorkerReport]:
    """Every worker heartbeats (last seen `now` unless `seen` says otherwise); only those in `rates` are measured."""
    seen = seen or {}
    return [WorkerReport(n, PRICES[n], seen.get(n, now), rates.get(n)) for n in PRICES]


def started(policy: ActivationPolicy | None = None) -> WorkerActivator:
    act = WorkerActivator(policy)
    d = act.decide(0.0, DEMAND, reports(0.0, RATES))
    # Sets reaching 4.4: {cheap, mid} 5.0 at $1.3 (cheapest), {dear} $2.5, {cheap, dear} $2.9, ...
    assert (d.start, d.stop, d.active, d.reason) == (("cheap", "mid"), (), ("cheap", "mid"), "under-provisioned")
    assert d.required_rollouts_s == pytest.approx(4.0) and d.active_rollouts_s == pytest.approx(5.0)
    return act


def test_starts_the_cheapest_set_that_reaches_the_target() -> None:
    started()


def test_noise_inside_the_headroom_band_changes_nothing() -> None:
    act = started()
    # Past the dwell (60 s) mid measures 2.2: 4.2 is below the 4.4 target but not below the 4.0 need -> no start;
    # the re-plan finds nothing cheaper than $1.3 that reaches 4.4 ({dear} is $2.5) -> no stop.
    for now in (70.0, 130.0, 190.0):
        d = act.decide(now, DEMAND, reports(now, {"cheap": 2.0, "mid": 2.2, "dear": None}))
        assert (d.start, d.stop, d.reason) == ((), (), "steady")
        assert d.active_rollouts_s == pytest.approx(4.2)


def test_jittery_measurements_do_not_flap() -> None:
    act = started()
    rng = random.Random(0)
    toggles = below_target = 0
    for tick in range(1, 200):
        now = 5.0 * tick
        rates = {"cheap": 2.0 * rng.uniform(0.85, 1.15), "mid": 3.0 * rng.uniform(0.85, 1.15)}
        below_target += rates["cheap"] + rates["mid"] < 4.4  # a rule without a band would add dear here
        d = act.decide(now, DEMAND, reports(now, {**rates, "dear": None}))
        toggles += len(d.start) + len(d.stop)
    assert below_target >= 3
    assert toggles == 0 and act.active == ("cheap", "mid")


def test_a_new_worker_is_judged_by_its_estimate_during_its_dwell() -> None:
    act = started()
    # mid (started at 0) measures 1.5 at t = 10: within its dwell it counts as its 3.0 estimate (warm-up).
    d = act.decide(10.0, DEMAND, reports(10.0, {"cheap": 2.0, "mid": 1.5}))
    assert (d.start, d.stop, d.active_rollouts_s) == ((), (), pytest.approx(5.0))


def test_under_provisioned_adds_the_cheapest_gap_filler() -> None:
    act = started()
    d = act.decide(70.0, DEMAND, reports(70.0, {"cheap": 2.0, "mid": 1.5}))  # 3.5 < 4.0
    assert (d.start, d.stop, d.reason) == (("dear",), (), "under-provisioned")
    assert d.active == ("cheap", "dear", "mid") and d.active_rollouts_s == pytest.approx(8.5)


def test_dwell_then_cheaper_set() -> None:
    act = started()
    act.decide(70.0, DEMAND, reports(70.0, {"cheap": 2.0, "mid": 1.5}))  # dear started at t = 70
    # No re-plan while dear is within its dwell (until t = 130), even though {dear} alone would do.
    d = act.decide(125.0, DEMAND, reports(125.0, {"cheap": 2.0, "mid": 1.5, "dear": 5.0}))
    assert (d.start, d.stop, d.reason) == ((), (), "steady")
    # Then the cheapest set reaching 4.4 is {dear} ($2.5) against $3.8 now (saving > 10%) -> stop cheap and mid.
    d = act.decide(131.0, DEMAND, reports(131.0, {"cheap": 2.0, "mid": 1.5, "dear": 5.0}))
    assert (d.start, d.stop, d.reason) == ((), ("cheap", "mid"), "cheaper set")
    assert d.active == ("dear",)


def test_recently_stopped_worker_is_not_restarted_by_a_replan() -> None:
    act = started()
    act.decide(70.0, DEMAND, reports(70.0, {"cheap": 2.0, "mid": 1.5}))
    act.decide(131.0, DEMAND, reports(131.0, {"cheap": 2.0, "mid": 1.5, "dear": 5.0}))  # -> only dear
    # mid recovers at t = 140: {cheap, mid} ($1.3, 5.0/s) beats {dear} ($2.5) by far, but cheap and mid were
    # stopped 9 s ago: no re-plan brings them back before their dwell ends (t = 191).
    d = act.decide(140.0, DEMAND, reports(140.0, {"cheap": None, "mid": 3.0, "dear": 5.0}))
    assert (d.start, d.stop) == ((), ())
    d = act.decide(191.0, DEMAND, reports(191.0, {"dear": 5.0}))
    assert (d.start, d.stop, d.active) == (("cheap", "mid"), ("dear",), ("cheap", "mid"))


def test_warm_up_is_not_judged_as_slowness() -> None:
    act = started()
    act.decide(70.0, DEMAND, reports(70.0, {"cheap": 2.0, "mid": 1.5}))  # dear started at 70 (estimate 5.0)
    # dear still loading: 0.5/s measured. Within its dwell it counts as 5.0 -> nothing else starts, and its
    # assumed 5.0 does not justify stopping cheap and mid either (no re-plan while a worker warms up).
    d = act.decide(80.0, DEMAND, reports(80.0, {"cheap": 2.0, "mid": 1.5, "dear": 0.5}))
    assert (d.start, d.stop) == ((), ()) and d.active_rollouts_s == pytest.approx(8.5)
    # Past its dwell the measurement counts: 4.0 is not < 4.0 (no start), and no set reaches 4.4 at the
    # measured rates (2 + 1.5 + 0.5): nothing to re-plan to.
    d = act.decide(131.0, DEMAND, reports(131.0, {"cheap": 2.0, "mid": 1.5, "dear": 0.5}))
    assert (d.start, d.stop, d.active_rollouts_s) == ((), (), pytest.approx(4.0))


def test_silent_worker_is_stopped_and_replaced() -> None:
    act = started()
    # mid last heard from at t = 5; at t = 40 that is 35 s > 30 s: stop it, and cheap alone (2.0) is short.
    d = act.decide(40.0, DEMAND, reports(40.0, {"cheap": 2.0}, seen={"mid": 5.0}))
    assert d.stop == ("mid",) and d.start == ("dear",)
    assert d.reason == "silent+under-provisioned" and d.active == ("cheap", "dear")
    # It comes back: a candidate again, but not started while the active set suffices and is cheap enough.
    d = act.decide(50.0, DEMAND, reports(50.0, {"cheap": 2.0, "mid": 3.0, "dear": 5.0}))
    assert (d.start, d.stop) == ((), ())


def test_silent_inactive_worker_is_no_candidate() -> None:
    act = WorkerActivator()
    d = act.decide(100.0, DEMAND, [WorkerReport("cheap", 0.4, 0.0, 2.0), WorkerReport("dear", 2.5, 100.0, 5.0)])
    assert d.start == ("dear",)  # cheap was last heard from 100 s ago


def test_never_measured_workers_are_tried_one_at_a_time_cheapest_first() -> None:
    act = WorkerActivator()
    d = act.decide(0.0, DEMAND, reports(0.0, {"cheap": None, "mid": None, "dear": None}))
    assert d.start == ("cheap",)  # assumed to meet the whole target until measured


def test_short_of_demand_starts_everyone() -> None:
    act = WorkerActivator()
    d = act.decide(0.0, Demand(rollouts_per_step=200, learner_step_s=10), reports(0.0, RATES))  # 20/s vs 10/s
    assert d.start == ("cheap", "dear", "mid") and d.reason == "short"


def test_demand_drop_releases_the_dear_workers() -> None:
    act = started()
    act.decide(70.0, DEMAND, reports(70.0, {"cheap": 2.0, "mid": 1.5}))  # + dear
    d = act.decide(135.0, Demand(rollouts_per_step=15, learner_step_s=10),  # need 1.5, target 1.65
                   reports(135.0, {"cheap": 2.0, "mid": 1.5, "dear": 5.0}))
    assert (d.stop, d.active) == (("dear", "mid"), ("cheap",))


def test_staleness_cap_raises_the_requirement() -> None:
    # R / ((S - kappa + 1) T - latency) = 40 / (10 - 2) = 5.0 > R / T = 4.0
    act = WorkerActivator()
    d = act.decide(0.0, Demand(40, 10, max_staleness=1, latency_s=2.0), reports(0.0, RATES))
    assert d.required_rollouts_s == pytest.approx(5.0)
    # target 5.5: {cheap, mid} = 5.0 misses; {dear} 5.0 misses; {cheap, dear} 7.0 $2.9 vs {mid, dear} $3.4
    assert d.start == ("cheap", "dear")


def test_bad_policy_and_demand() -> None:
    with pytest.raises(UserError, match="min_saving must be < 1"):
        ActivationPolicy(min_saving=1.0)
    with pytest.raises(UserError, match="silent_after_s must be > 0"):
        ActivationPolicy(silent_after_s=0)
    with pytest.raises(ValueError, match="bad demand"):
        Demand(rollouts_per_step=10, learner_step_s=0)
