"""kill -9 at random points, then resume: does any kill leave a run that cannot go on? (bench/attack.py part "kill")

Contract: `kill_resume(scn, run_dir, points, log)` spends `points` kills, in turn on three targets, and returns
{"points", "unusable_runs", "by_target": {target: {"points", "unusable", "mid_write"}}, "cells": {"resumed",
"redone", "redone_with_snapshot", "finished"}, "failures": [...]}. What each check proves is decided by the pure
functions of simulations/kill_checks.py:
- "cell": an attack cell of the scenario, small (3 nodes, one attacker, a snapshot every round), run as a process
  (`python -m simulations.attack_kill cell DIR`, its log in DIR.log). Once its first snapshot is complete, each
  kill lands at a random time or, every other time, the moment a snapshot is being written (a node's checkpoint
  temp dir or progress.json's temp file exists: "mid_write"); the next run of the same cell dir resumes it, or
  redoes it from scratch, and the two are counted apart (`cells`; "finished": the cell had completed before the
  kill). Unusable: a run that fails, a finished cell whose metrics.csv does not hold exactly rounds x honest nodes
  rows, or a cell redone from scratch although a complete snapshot (progress.json) was there.
- "join": a solo `swarm-node join --resume` in one run dir with a checkpoint every JOIN_CHECKPOINT_EVERY steps,
  killed at a random time or while a checkpoint is being written (its temp dir exists). The next start of the same
  run dir must say it resumed from exactly the newest complete checkpoint the kill left (its "resume: continuing
  from checkpoint step N" line; a silent restart from step 0 fails), so that it lost at most checkpoint_every of
  the steps the killed run had finished (its metrics.jsonl), and must train past it.
- "worker": an ECHO-2 `join --role worker` following a `join --role learner` that publishes an update every step,
  with the apply pause hook on (swarm_node/roles/apply_pause.py). Every other kill is armed: the worker pauses
  inside its next apply (the update verified and applied to its followed state, not yet loaded into its sampler)
  and is killed there ("mid_write" counts the kills that landed inside the apply: its pause marker named the same
  update before and after the kill); the others land at a random time. It is restarted on the same run dir.
  Unusable: it fails, or does not reach the version its learner had at the kill (a worker keeps no policy on disk:
  it must catch up from its learner).
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from simulations import kill_checks
from simulations.attack_live import ROOT, LiveNode, node_tables, write_config
from simulations.scenario import Scenario, load_scenario
from swarm_node.roles import apply_pause

LogFn = Callable[[str], None]
TARGETS = ("cell", "join", "worker")
SCENARIO = Path(__file__).parent / "scenarios" / "attack.toml"  # bench/attack.py's default
CELL_ROUNDS = 4
JOIN_CHECKPOINT_EVERY = 2  # a join kill may lose up to this many steps, and no more (checked)


def small_cell(scn: Scenario) -> Scenario:
    return dataclasses.replace(scn, nodes=3, rounds=CELL_ROUNDS, checkpoint_rounds=1, eval_problems=0, seeds=(0,),
                               attackers=((2, "forged_reward"),))


def writing(root: Path) -> bool:
    """A snapshot or checkpoint is being written under `root` (its temp files exist)."""
    return any(root.rglob(".tmp-step-*")) or any(root.rglob("*.json.tmp"))


def kill_when(proc: subprocess.Popen[Any], root: Path, mid_write: bool, after_s: float, limit_s: float,
              armed: Callable[[], bool] | None = None) -> bool:
    """SIGKILL the process group `after_s` after it is `armed` (default: at once), or (mid_write) the first time a
    write is seen under `root` once armed; True if the kill landed mid-write. False, without a kill, if the process
    ended first."""
    started = time.monotonic()
    armed_at: float | None = None
    while proc.poll() is None and time.monotonic() - started < limit_s:
        if armed_at is None and (armed is None or armed()):
            armed_at = time.monotonic()
        if armed_at is not None and mid_write and writing(root):
            _killpg(proc)
            return True
        if armed_at is not None and not mid_write and time.monotonic() - armed_at >= after_s:
            busy = writing(root)
            _killpg(proc)
            return busy
        time.sleep(0.002 if mid_write else 0.05)
    _killpg(proc)
    return False


def _killpg(proc: subprocess.Popen[Any]) -> None:
    import os

    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _cell_proc(scn_file: Path, root: Path, log: Path | None = None) -> subprocess.Popen[str]:
    """The cell as a process; its log (the runner's "resuming cell" line) to `log` when given."""
    args = [sys.executable, "-m", "simulations.attack_kill", "cell", str(root), "--file", str(scn_file)]
    if log is None:
        return subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True, text=True)
    with open(log, "w") as out:  # the child has its own copy of the descriptor
        return subprocess.Popen(args, cwd=ROOT, stdout=out, stderr=subprocess.DEVNULL, start_new_session=True,
                                text=True)


def kill_cell(scn_file: Path, root: Path, rng: random.Random, mid_write: bool
              ) -> tuple[bool, bool, str, tuple[str, bool]]:
    """One kill of the cell process, then a run to the end: (usable, killed mid-write, why not usable, (how the
    cell went on after the kill, whether a snapshot was there))."""
    from simulations.cells import cell_dir
    from simulations.results import METRICS_CSV, RESULT_FILE, read_rows
    from simulations.snapshots import PROGRESS_FILE

    done = cell_dir(root, small_cell(load_scenario(scn_file)).variants[0].name, 0)
    # Once the first snapshot is complete, so that a kill has one to resume from (a kill while the first is
    # written could only redo the cell: it tests nothing of the resume).
    landed = kill_when(_cell_proc(scn_file, root), root, mid_write, rng.uniform(0.0, 8.0), 300.0,
                       armed=lambda: (done / PROGRESS_FILE).exists())
    finished_before, snapshot_before = (done / RESULT_FILE).exists(), (done / PROGRESS_FILE).exists()
    log = root.with_name(root.name + ".log")
    finish = _cell_proc(scn_file, root, log)
    try:
        code = finish.wait(timeout=600)
    except subprocess.TimeoutExpired:
        _killpg(finish)
        return False, landed, "the resumed cell did not finish in 600 s", ("redone", snapshot_before)
    kind = kill_checks.cell_restart(finished_before, log.read_text().splitlines())
    rows = read_rows(done / METRICS_CSV) if (done / METRICS_CSV).exists() else []
    problem = kill_checks.cell_restart_problem(kind, snapshot_before)
    ok = code == 0 and (done / RESULT_FILE).exists() and len(rows) == CELL_ROUNDS * 2 and not problem
    shutil.rmtree(root, ignore_errors=True)  # the next point starts a fresh cell
    return ok, landed, "" if ok else problem or f"exit {code}, {len(rows)} rows", (kind, snapshot_before)


def _steps(run_dir: Path) -> int:
    from swarm_node.model import checkpoint

    ckpt = checkpoint.latest_checkpoint(run_dir, warn=lambda _m: None)
    return ckpt.step if ckpt is not None else 0


def last_metric_step(path: Path) -> int:
    """The last step a run recorded in its metrics.jsonl (0: none); a line cut by a kill is skipped."""
    import json

    step = 0
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                step = max(step, int(json.loads(line)["step"]))
            except (ValueError, KeyError, TypeError):
                continue
    return step


def _wait_resumed_step(node: LiveNode, limit_s: float = 10.0) -> int | None:
    """The step the node said it resumed from; its log line may still be on its way to our reader thread."""
    deadline = time.monotonic() + limit_s
    while (step := kill_checks.resumed_step(list(node.lines))) is None and time.monotonic() < deadline:
        time.sleep(0.1)
    return step


def kill_join(config: Path, run_dir: Path, rng: random.Random, mid_write: bool,
              checkpoint_every: int = JOIN_CHECKPOINT_EVERY) -> tuple[bool, bool, str]:
    """Start (resume) the solo node, check it resumed from its newest complete checkpoint, kill it."""
    from swarm_node.node.run_files import METRICS_FILE

    before = _steps(run_dir)  # the newest complete checkpoint the last kill left
    reached = last_metric_step(run_dir / METRICS_FILE)  # the steps the killed run had finished
    node = LiveNode.start(run_dir, config, extra=["--resume"])
    try:
        deadline = time.monotonic() + 300
        while node.status().get("step", 0) <= before:  # resumed at `before`, then trained past it
            if time.monotonic() > deadline or node.proc.poll() is not None:
                return False, False, f"did not train past its checkpoint at step {before}"
            time.sleep(0.2)
        if why := kill_checks.join_resume_problem(_wait_resumed_step(node), before, reached, checkpoint_every):
            return False, False, why
        landed = kill_when(node.proc, run_dir / "checkpoints", mid_write, rng.uniform(0.0, 10.0), 60.0)
        return True, landed, ""
    finally:
        node.stop()


def _marker(path: Path) -> str | None:
    try:
        return path.read_text()
    except FileNotFoundError:
        return None


def _clear_pause(pause_dir: Path) -> None:
    pause_dir.mkdir(parents=True, exist_ok=True)
    for name in (apply_pause.ARM, apply_pause.APPLYING, apply_pause.RELEASE):
        (pause_dir / name).unlink(missing_ok=True)


def kill_mid_apply(worker: LiveNode, pause_dir: Path, limit_s: float = 120.0) -> bool:
    """Arm the pause, wait for the worker to pause inside its next apply, kill it there; True if the kill landed
    inside the apply. Killed anyway (False) when no apply came within `limit_s`."""
    (pause_dir / apply_pause.ARM).write_text("")
    applying = pause_dir / apply_pause.APPLYING
    deadline = time.monotonic() + limit_s
    while (before := _marker(applying)) is None:
        if worker.proc.poll() is not None or time.monotonic() > deadline:
            _killpg(worker.proc)
            return False
        time.sleep(0.01)
    _killpg(worker.proc)
    return kill_checks.landed_mid_apply(before, _marker(applying))


def kill_worker(config: Path, run_dir: Path, learner: LiveNode, learner_id: str, rng: random.Random,
                mid_write: bool) -> tuple[bool, bool, str]:
    """Start (restart) the worker, check it reaches the learner's version at the last kill, kill it."""
    seen = run_dir.with_name(run_dir.name + ".learner_version")  # the learner's version at the last kill
    target = int(seen.read_text()) if seen.exists() else 0
    pause_dir = run_dir.with_name(run_dir.name + ".pause")
    _clear_pause(pause_dir)
    worker = LiveNode.start(run_dir, config, extra=["--role", "worker", "--learner", learner_id, "--bootstrap",
                                                    learner.addr], env={apply_pause.ENV: str(pause_dir)})
    try:
        deadline = time.monotonic() + 300
        while why := kill_checks.worker_follow_problem(int(worker.status().get("policy_version", 0)), target):
            if time.monotonic() > deadline or worker.proc.poll() is not None:
                return False, False, why
            time.sleep(0.1)
        if mid_write:
            landed = kill_mid_apply(worker, pause_dir)
        else:
            time.sleep(rng.uniform(0.0, 10.0))
            landed = False  # unarmed, the worker never pauses: nothing shows that this kill was inside an apply
            _killpg(worker.proc)
        seen.write_text(str(int(learner.status().get("policy_version", 0))))
        return True, landed, ""
    finally:
        worker.stop()
        _clear_pause(pause_dir)


def kill_resume(scn: Scenario, run_dir: Path, points: int, log: LogFn, scn_file: Path | None = None,
                seed: int = 0) -> dict[str, Any]:
    rng = random.Random(seed)
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    tables = node_tables(scn)
    tables["run"].update({"checkpoint_every": JOIN_CHECKPOINT_EVERY, "keep_checkpoints": 2})
    join_cfg = write_config(run_dir / "join.toml", tables)
    learner_tables = node_tables(scn)
    learner_tables.setdefault("train", {})["max_staleness"] = 1
    learner_cfg = write_config(run_dir / "echo.toml", learner_tables)
    by = {t: {"points": 0, "unusable": 0, "mid_write": 0} for t in TARGETS}
    failures: list[str] = []
    restarts: list[tuple[str, bool]] = []
    learner: LiveNode | None = None
    try:
        for k in range(points):
            target = TARGETS[k % len(TARGETS)]
            mid = (k // len(TARGETS)) % 2 == 1
            if target == "cell":
                ok, landed, why, restart = kill_cell(scn_file or SCENARIO, run_dir / "cell", rng, mid)
                restarts.append(restart)
            elif target == "join":
                ok, landed, why = kill_join(join_cfg, run_dir / "join", rng, mid)
            else:
                if learner is None:
                    learner = LiveNode.start(run_dir / "learner", learner_cfg, extra=["--role", "learner"])
                learner_id = learner.addr.rsplit("/", 1)[-1]
                ok, landed, why = kill_worker(learner_cfg, run_dir / "worker", learner, learner_id, rng, mid)
            by[target]["points"] += 1
            by[target]["unusable"] += not ok
            by[target]["mid_write"] += landed
            if not ok:
                failures.append(f"{target} point {k}: {why}")
            log(f"kill {k + 1}/{points} {target}{' mid-write' if landed else ''}: {'ok' if ok else why}")
        if points >= 2:  # the last join kill is checked by one more start
            ok, _, why = kill_join(join_cfg, run_dir / "join", rng, False)
            if not ok:
                by["join"]["unusable"] += 1
                failures.append(f"join final check: {why}")
    finally:
        if learner is not None:
            learner.stop()
    return {"points": sum(b["points"] for b in by.values()), "unusable_runs": sum(b["unusable"] for b in by.values()),
            "by_target": by, "cells": kill_checks.count_cells(restarts), "failures": failures}


def main() -> None:
    from simulations.runner import run_cell

    ap = argparse.ArgumentParser(description="run the small attack cell of the kill test in DIR (resumes it)")
    ap.add_argument("what", choices=["cell"])
    ap.add_argument("dir", type=Path)
    ap.add_argument("--file", type=Path, required=True)
    args = ap.parse_args()
    scn = small_cell(load_scenario(args.file))
    run_cell(scn, scn.variants[0], 0, args.dir, log=lambda line: print(line, flush=True))  # "resuming cell ..."


if __name__ == "__main__":
    main()
