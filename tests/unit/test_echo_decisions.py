"""The ECHO-2 decisions as plain functions / state machines: a worker's catch-up, a learner's admission."""

from __future__ import annotations

from dataclasses import dataclass

from swarm_node.echo.admission import Admission, Admitted
from swarm_node.echo.catch_up import CatchUp, lineage_restarted, plan_catch_up, stranded


@dataclass(frozen=True)
class A:  # a held announce
    version: int
    base_version: int
    state_sha256: str = "s"


def test_nothing_held_means_caught_up() -> None:
    assert plan_catch_up([], 3, "h3") == CatchUp(reset=False, fetch=None)


def test_the_delta_from_our_version_comes_before_any_snapshot() -> None:
    held = [A(5, 5, "h5"), A(4, 3, "h4"), A(5, 4, "h5")]
    assert plan_catch_up(held, 3, "h3") == CatchUp(False, (4, 3))
    assert plan_catch_up(held, 4, "h4") == CatchUp(False, (5, 4))
    assert plan_catch_up(held, 5, "h5") == CatchUp(False, None)


def test_without_our_delta_the_newest_snapshot_newer_than_ours() -> None:
    held = [A(2, 2, "h2"), A(6, 6, "h6"), A(6, 5, "h6")]
    assert plan_catch_up(held, 1, "h1") == CatchUp(False, (6, 6))


def test_a_learner_behind_us_restarted_its_lineage() -> None:
    held = [A(0, 0, "new0"), A(1, 0, "new1")]
    assert lineage_restarted(held, 4, "h4")
    assert plan_catch_up(held, 4, "h4") == CatchUp(True, (0, 0))  # reset: version -1, only snapshots apply


def test_a_snapshot_at_our_version_with_another_state_restarts_too() -> None:
    held = [A(2, 2, "theirs"), A(3, 2, "t3")]
    assert plan_catch_up(held, 2, "ours") == CatchUp(True, (2, 2))
    assert plan_catch_up(held, 2, "theirs") == CatchUp(False, (3, 2))


def test_a_follower_whose_deltas_were_evicted_is_stranded() -> None:
    deltas = [A(v, v - 1) for v in range(2, 10)]  # keep_versions 8 at v9: the snapshot v0 and delta 0->1 evicted
    assert plan_catch_up(deltas, 0, "h0") == CatchUp(False, None)  # catch-up finds nothing to fetch ...
    assert stranded(deltas, 0)  # ... although v9 is held: only a new snapshot frees it
    assert not stranded(deltas, 1) and not stranded(deltas, 5)  # the delta from its version is held
    assert not stranded(deltas, 9) and not stranded(deltas, 12)  # caught up, or ahead (a lineage reset's business)
    assert not stranded([*deltas, A(4, 4)], 0)  # a snapshot newer than it is held
    assert not stranded([A(4, 4)], 4) and not stranded([], 0)


@dataclass(frozen=True)
class S:  # a Status
    role: str = "worker"
    follows: str = "L"
    throughput: float = 0.0
    capabilities: tuple[str, ...] = ()
    policy_version: int = 0


def test_a_worker_following_us_is_admitted_once() -> None:
    adm = Admission("L")
    assert adm.on_status("w1", S(capabilities=("cost_per_hour:0.5",)), 10.0, 0) == Admitted(joined=True,
                                                                                                snapshot=False)
    assert adm.delegates == {"L": frozenset({"w1"})} and adm.active == {"w1"}
    assert adm.workers["w1"].cost_per_hour == 0.5 and adm.workers["w1"].last_seen == 10.0
    assert adm.on_status("w1", S(), 12.0, 3) == Admitted()  # known already: its report is refreshed only
    assert adm.workers["w1"].last_seen == 12.0 and adm.receivers() == ["w1"]


def test_a_late_joiner_asks_for_a_snapshot() -> None:
    adm = Admission("L")
    assert adm.on_status("w2", S(), 0.0, 4) == Admitted(joined=True, snapshot=True)


def test_a_known_worker_stranded_behind_what_we_hold_asks_for_a_snapshot() -> None:
    adm = Admission("L")
    adm.on_status("w", S(policy_version=0), 0.0, 0)
    held = [A(v, v - 1) for v in range(2, 10)]
    assert adm.on_status("w", S(policy_version=8), 1.0, 9, held) == Admitted()  # the delta 8->9 is held
    assert adm.on_status("w", S(policy_version=0), 2.0, 9, held) == Admitted(snapshot=True)  # restarted at v0
    assert adm.on_status("w", S(policy_version=0), 3.0, 9, [*held, A(9, 9)]) == Admitted()  # the snapshot is out


def test_others_status_is_ignored() -> None:
    adm = Admission("L")
    assert adm.on_status("p", S(role="peer"), 0.0, 0) == Admitted()
    assert adm.on_status("w", S(follows="other"), 0.0, 0) == Admitted()
    assert adm.delegates == {"L": frozenset()} and not adm.workers and not adm.active


def test_throughput_in_rollouts_per_second_from_received_token_counts() -> None:
    adm = Admission("L")
    adm.on_status("w", S(throughput=100.0), 0.0, 0)
    assert adm.workers["w"].throughput_rollouts_s is None  # no rollouts seen yet: tokens per rollout unknown
    adm.on_rollouts(tokens=40, completions=4)  # 10 tokens per rollout
    adm.on_status("w", S(throughput=100.0), 1.0, 0)
    assert adm.workers["w"].throughput_rollouts_s == 10.0


def test_stopped_workers_get_no_updates_and_demand_uses_the_median_step() -> None:
    adm = Admission("L")
    adm.on_status("a", S(), 0.0, 0)
    adm.on_status("b", S(), 0.0, 0)
    adm.stopped("a")
    assert adm.receivers() == ["b"]
    adm.started("a")
    assert adm.receivers() == ["a", "b"]
    assert adm.demand(32, 1).learner_step_s == 1.0  # nothing trained yet
    for s in (0.5, 3.0, 1.0):
        adm.on_trained(s)
    d = adm.demand(32, 2)
    assert d.learner_step_s == 1.0 and d.rollouts_per_step == 32 and d.kappa == 2
