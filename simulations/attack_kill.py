"""kill -9 at random points, then resume: does any kill leave a run that cannot go on? (bench/attack.py part "kill")

Contract: `kill_resume(scn, run_dir, points, log)` spends `points` kills, in turn on three targets, and returns
{"points", "unusable_runs", "by_target": {target: {"points", "unusable", "mid_write"}}, "failures": [...]}:
- "cell": an attack cell of the scenario, small (3 nodes, one attacker, a snapshot every round), run as a process
  (`python -m simulations.attack_kill cell DIR`). Each kill lands at a random time or, every other time, the moment
  a snapshot is being written (a node's checkpoint temp dir or progress.json's temp file exists: "mid_write"); the
  next run of the same cell dir resumes it (or, per the runner's rule, redoes it). Unusable: a run that fails, or a
  finished cell whose metrics.csv does not hold exactly rounds x honest nodes rows.
- "join": a solo `swarm-node join --resume` in one run dir with a checkpoint every step, killed at a random time
  or while a checkpoint is being written (its temp dir exists); the next start of the same run dir must load the
  newest complete checkpoint and train past it. Unusable: it fails, or starts below the last complete checkpoint.
- "worker": an ECHO-2 `join --role worker` following a `join --role learner` that publishes an update every step;
  the worker is killed at a random time while updates are being applied ("mid_write": within 50 ms of its policy
  version changing, i.e. around an apply), then restarted on the same run dir. Unusable: it fails, or never
  follows the learner again (its policy version does not pass the one it had when killed).
A worker keeps no policy on disk (it catches up from its learner), so its kills test the run dir it does keep.
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

from simulations.attack_live import ROOT, LiveNode, node_tables, write_config
from simulations.scenario import Scenario, load_scenario

LogFn = Callable[[str], None]
TARGETS = ("cell", "join", "worker")
SCENARIO = Path(__file__).parent / "scenarios" / "attack.toml"  # bench/attack.py's default
CELL_ROUNDS = 4


def small_cell(scn: Scenario) -> Scenario:
    return dataclasses.replace(scn, nodes=3, rounds=CELL_ROUNDS, checkpoint_rounds=1, eval_problems=0, seeds=(0,),
                               attackers=((2, "forged_reward"),))


def writing(root: Path) -> bool:
    """A snapshot or checkpoint is being written under `root` (its temp files exist)."""
    return any(root.rglob(".tmp-step-*")) or any(root.rglob("*.json.tmp"))


def kill_when(proc: subprocess.Popen[Any], root: Path, mid_write: bool, after_s: float, limit_s: float) -> bool:
    """SIGKILL the process group at `after_s`, or (mid_write) the first time a write is seen under `root`; True if
    the kill landed mid-write. False, without a kill, if the process ended first."""
    started = time.monotonic()
    while proc.poll() is None and time.monotonic() - started < limit_s:
        if mid_write and writing(root):
            _killpg(proc)
            return True
        if not mid_write and time.monotonic() - started >= after_s:
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


def _cell_proc(scn_file: Path, root: Path) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "simulations.attack_kill", "cell", str(root), "--file",
                             str(scn_file)], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True, text=True)


def kill_cell(scn_file: Path, root: Path, rng: random.Random, mid_write: bool) -> tuple[bool, bool, str]:
    """One kill of the cell process, then a run to the end: (usable, killed mid-write, why not usable)."""
    landed = kill_when(_cell_proc(scn_file, root), root, mid_write, rng.uniform(3.0, 25.0), 120.0)
    finish = _cell_proc(scn_file, root)
    try:
        code = finish.wait(timeout=600)
    except subprocess.TimeoutExpired:
        _killpg(finish)
        return False, landed, "the resumed cell did not finish in 600 s"
    from simulations.cells import cell_dir
    from simulations.results import METRICS_CSV, read_rows

    done = cell_dir(root, small_cell(load_scenario(scn_file)).variants[0].name, 0)
    rows = read_rows(done / METRICS_CSV) if (done / METRICS_CSV).exists() else []
    ok = code == 0 and (done / "result.json").exists() and len(rows) == CELL_ROUNDS * 2
    shutil.rmtree(root, ignore_errors=True)  # the next point starts a fresh cell
    return ok, landed, "" if ok else f"exit {code}, {len(rows)} rows"


def _steps(run_dir: Path) -> int:
    from swarm_node.model import checkpoint

    ckpt = checkpoint.latest_checkpoint(run_dir, warn=lambda _m: None)
    return ckpt.step if ckpt is not None else 0


def kill_join(config: Path, run_dir: Path, rng: random.Random, mid_write: bool) -> tuple[bool, bool, str]:
    """Start (resume) the solo node, check it resumed from its newest complete checkpoint, kill it."""
    before = _steps(run_dir)
    node = LiveNode.start(run_dir, config, extra=["--resume"])
    try:
        deadline = time.monotonic() + 300
        while node.status().get("step", 0) <= before:  # resumed at `before`, then trained past it
            if time.monotonic() > deadline or node.proc.poll() is not None:
                return False, False, f"did not train past its checkpoint at step {before}"
            time.sleep(0.2)
        landed = kill_when(node.proc, run_dir / "checkpoints", mid_write, rng.uniform(0.0, 10.0), 60.0)
        return True, landed, ""
    finally:
        node.stop()


def kill_worker(config: Path, run_dir: Path, learner: LiveNode, learner_id: str, rng: random.Random,
                mid_write: bool) -> tuple[bool, bool, str]:
    """Start (restart) the worker, check it follows the learner past the version it had, kill it."""
    seen = run_dir.with_name(run_dir.name + ".version")  # the version it had when last killed (outside its run dir)
    before = int(seen.read_text()) if seen.exists() else 0
    worker = LiveNode.start(run_dir, config, extra=["--role", "worker", "--learner", learner_id, "--bootstrap",
                                                    learner.addr])
    try:
        deadline = time.monotonic() + 300
        while (version := int(worker.status().get("policy_version", 0))) <= before:
            if time.monotonic() > deadline or worker.proc.poll() is not None:
                return False, False, f"never followed the learner past v{before}"
            time.sleep(0.1)
        landed = False
        wait_until = time.monotonic() + rng.uniform(0.0, 10.0)
        while time.monotonic() < wait_until or mid_write:
            now = int(worker.status().get("policy_version", 0))
            if mid_write and now != version:  # an update was just applied: the next ones follow it closely
                landed = True
                break
            version = now
            time.sleep(0.05)
        seen.write_text(str(version))
        _killpg(worker.proc)
        return True, landed, ""
    finally:
        worker.stop()


def kill_resume(scn: Scenario, run_dir: Path, points: int, log: LogFn, scn_file: Path | None = None,
                seed: int = 0) -> dict[str, Any]:
    rng = random.Random(seed)
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    tables = node_tables(scn)
    tables["run"].update({"checkpoint_every": 1, "keep_checkpoints": 2})
    join_cfg = write_config(run_dir / "join.toml", tables)
    learner_tables = node_tables(scn)
    learner_tables.setdefault("train", {})["max_staleness"] = 1
    learner_cfg = write_config(run_dir / "echo.toml", learner_tables)
    by = {t: {"points": 0, "unusable": 0, "mid_write": 0} for t in TARGETS}
    failures: list[str] = []
    learner: LiveNode | None = None
    try:
        for k in range(points):
            target = TARGETS[k % len(TARGETS)]
            mid = (k // len(TARGETS)) % 2 == 1
            if target == "cell":
                ok, landed, why = kill_cell(scn_file or SCENARIO, run_dir / "cell", rng, mid)
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
            "by_target": by, "failures": failures}


def main() -> None:
    from simulations.runner import run_cell

    ap = argparse.ArgumentParser(description="run the small attack cell of the kill test in DIR (resumes it)")
    ap.add_argument("what", choices=["cell"])
    ap.add_argument("dir", type=Path)
    ap.add_argument("--file", type=Path, required=True)
    args = ap.parse_args()
    scn = small_cell(load_scenario(args.file))
    run_cell(scn, scn.variants[0], 0, args.dir)


if __name__ == "__main__":
    main()
