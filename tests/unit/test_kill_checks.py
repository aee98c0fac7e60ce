"""The kill -9 check claims no more than it checks (issue 28 item 4): a `join` must resume from exactly the newest
complete checkpoint and lose at most checkpoint_every steps; a worker's kill counts as mid-apply only when it
landed inside an apply (the pause hook) and a restarted worker must reach its learner's version; a cell redone from
scratch is counted apart from one resumed, and is a failure when a snapshot was there."""

from __future__ import annotations

import subprocess
import sys
import types
from pathlib import Path

from simulations.attack_kill import kill_mid_apply, last_metric_step
from simulations.kill_checks import (
    cell_restart,
    cell_restart_problem,
    count_cells,
    join_resume_problem,
    landed_mid_apply,
    resumed_step,
    worker_follow_problem,
)
from swarm_node.echo.worker import Worker
from swarm_node.roles import apply_pause
from tests.unit.test_delta_guard import Host, publisher_for, step_weight


# ------------------------------------------------------------------------------------------------------- join
def test_the_resumed_step_is_read_from_the_nodes_resume_line() -> None:
    assert resumed_step(["model: ...\n", "resume: continuing from checkpoint step 14 (policy version 14)\n"]) == 14
    assert resumed_step(["resume: no complete checkpoint found; starting from step 0\n"]) == 0
    assert resumed_step(["join this node with: --bootstrap /ip4/127.0.0.1/tcp/1/p2p/x\n"]) is None


def test_join_resumed_correctly_only_from_the_newest_checkpoint_within_checkpoint_every() -> None:
    assert join_resume_problem(12, last_checkpoint=12, reached=13, checkpoint_every=2) == ""
    assert join_resume_problem(12, last_checkpoint=12, reached=14, checkpoint_every=2) == ""  # killed mid-checkpoint
    assert join_resume_problem(0, last_checkpoint=0, reached=0, checkpoint_every=2) == ""  # the first start
    assert join_resume_problem(0, last_checkpoint=12, reached=13, checkpoint_every=2) == (
        "resumed from step 0, but the newest complete checkpoint was step 12")  # a silent restart from step 0
    assert join_resume_problem(10, last_checkpoint=12, reached=13, checkpoint_every=2) == (
        "resumed from step 10, but the newest complete checkpoint was step 12")
    assert join_resume_problem(12, last_checkpoint=12, reached=15, checkpoint_every=2) == (
        "lost 3 steps (the killed run had finished step 15, its newest checkpoint was step 12): more than "
        "checkpoint_every = 2")
    assert join_resume_problem(None, last_checkpoint=12, reached=13, checkpoint_every=2) == (
        "the restarted node never said which checkpoint it resumed from")


def test_the_steps_a_killed_run_finished_come_from_its_metrics(tmp_path: Path) -> None:
    metrics = tmp_path / "metrics.jsonl"
    assert last_metric_step(metrics) == 0
    metrics.write_text('{"step": 1, "reward_mean": 0.5}\n{"step": 2, "reward_mean": 0.25}\n{"step": 3, "rew')
    assert last_metric_step(metrics) == 2  # the line cut by the kill is not a finished step


# ----------------------------------------------------------------------------------------------------- worker
def test_a_kill_landed_mid_apply_only_when_the_marker_outlived_it() -> None:
    assert landed_mid_apply("7", "7")
    assert not landed_mid_apply("7", None)  # the apply ended before the kill
    assert not landed_mid_apply(None, None)
    assert not landed_mid_apply("7", "8")  # another apply: the one seen was left


def test_a_restarted_worker_must_reach_the_learners_version_at_the_kill() -> None:
    assert worker_follow_problem(5, 5) == ""
    assert worker_follow_problem(6, 5) == ""
    assert worker_follow_problem(4, 5) == "the restarted worker reached v4, not the learner's v5 at the kill"
    assert worker_follow_problem(0, 0) == "the restarted worker reached v0, not the learner's v1 at the kill"
    assert worker_follow_problem(1, 0) == ""


def test_the_pause_hook_is_off_without_its_variable_and_pauses_once_per_arming(tmp_path: Path) -> None:
    assert apply_pause.from_env({}) is None
    seen: list[tuple[str | None, bool]] = []

    def sleep(_s: float) -> None:  # the worker waits: what it left on disk meanwhile, then the release
        seen.append(((tmp_path / "applying").read_text(), (tmp_path / "arm").exists()))
        (tmp_path / "release").write_text("")

    pause = apply_pause.from_env({apply_pause.ENV: str(tmp_path)}, sleep=sleep)
    assert pause is not None
    pause(3)  # not armed: at once
    assert seen == []
    (tmp_path / "arm").write_text("")
    pause(4)
    assert seen == [("4", False)]  # paused inside the apply of v4, the arming consumed
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # marker and release gone once it went on
    pause(5)
    assert seen == [("4", False)]


def test_the_worker_calls_the_hook_after_applying_and_before_its_sampler_loads() -> None:
    host = Host()
    calls: list[tuple[int, list[int], int]] = []
    worker = Worker(host, kappa=1, max_staleness=1, mid_apply=lambda v: calls.append((v, list(host.loaded),
                                                                                      worker.version)))
    publisher = publisher_for(Host())
    worker.apply(step_weight(publisher, 0.1))
    worker.apply(step_weight(publisher, 0.1))
    assert calls == [(1, [], 1), (2, [1], 2)]  # the followed state is at v, the sampler not yet
    assert host.loaded == [1, 2]


def test_a_worker_paused_in_an_apply_is_killed_there(tmp_path: Path) -> None:
    child = ("import sys, time; from pathlib import Path; from swarm_node.roles.apply_pause import pause_in\n"
             "pause = pause_in(Path(sys.argv[1]))\nwhile True:\n    pause(7)\n    time.sleep(0.01)\n")
    proc = subprocess.Popen([sys.executable, "-c", child, str(tmp_path)], start_new_session=True)
    assert kill_mid_apply(types.SimpleNamespace(proc=proc), tmp_path, limit_s=120.0)  # type: ignore[arg-type]
    assert proc.returncode == -9
    assert (tmp_path / "applying").read_text() == "7"  # it died inside the apply


# ------------------------------------------------------------------------------------------------------- cells
def test_a_cell_redone_from_scratch_is_counted_apart_and_fails_when_a_snapshot_was_there() -> None:
    log = ["status: http://127.0.0.1:1", "resuming cell f0.3/seed0 from round 2"]
    assert cell_restart(finished_before=False, log_lines=log) == "resumed"
    assert cell_restart(finished_before=False, log_lines=log[:1]) == "redone"
    assert cell_restart(finished_before=True, log_lines=[]) == "finished"
    assert cell_restart_problem("redone", snapshot_before=False) == ""  # killed before its first snapshot
    assert cell_restart_problem("redone", snapshot_before=True) == (
        "redone from scratch although a complete snapshot (progress.json) was there")
    assert cell_restart_problem("resumed", snapshot_before=True) == ""
    assert count_cells([("resumed", True), ("redone", False), ("redone", True), ("finished", True),
                        ("resumed", True)]) == {"resumed": 2, "redone": 2, "redone_with_snapshot": 1, "finished": 1}


def test_the_attack_row_says_how_the_killed_cells_went_on_where_counted() -> None:
    import json

    from bench.report_rows import ROWS

    real = json.loads((Path(__file__).resolve().parents[2] / "bench/results/attack.json").read_text())
    kill = {"points": 6, "unusable_runs": 1, "failures": ["cell point 3: ..."],
            "by_target": {"cell": {"points": 2, "unusable": 1, "mid_write": 1},
                          "join": {"points": 2, "unusable": 0, "mid_write": 1},
                          "worker": {"points": 2, "unusable": 0, "mid_write": 1}}}
    old = ROWS["attack"].render({"attack.json": {**real, "kill_resume": kill}})
    assert old.endswith("kill -9 at 6 points (3 mid-write, by checks that did not read the step a `join` resumed "
                        "from, counted a worker's kill near a version change as mid-write, and took a cell redone "
                        "from scratch as usable): 1 unusable runs")
    cells = {"resumed": 1, "redone": 1, "redone_with_snapshot": 1, "finished": 0}
    new = ROWS["attack"].render({"attack.json": {**real, "kill_resume": {**kill, "cells": cells}}})
    assert new.endswith("kill -9 at 6 points (3 mid-write, of them 1 workers killed inside a delta's apply; cells: 1 "
                        "resumed, 1 redone from scratch (1 with a snapshot there), 0 finished before the kill): 1 "
                        "unusable runs")


def test_a_cell_kill_waits_until_it_is_armed(tmp_path: Path) -> None:
    from simulations.attack_kill import kill_when

    (tmp_path / "progress.json.tmp").write_text("{")  # a write under way, the first snapshot's
    snapshot = tmp_path / "progress.json"
    proc = subprocess.Popen(["sleep", "30"], start_new_session=True)
    assert not kill_when(proc, tmp_path, mid_write=True, after_s=0.0, limit_s=0.3, armed=snapshot.exists)
    assert proc.returncode == -9  # never armed: killed at the limit, not counted mid-write
    snapshot.write_text("{}")
    proc = subprocess.Popen(["sleep", "30"], start_new_session=True)
    assert kill_when(proc, tmp_path, mid_write=True, after_s=0.0, limit_s=30.0, armed=snapshot.exists)
