"""What one kill -9 point of simulations/attack_kill.py proved: pure decisions over what was observed.

Contract:
- `resumed_step(lines)`: the step a `join --resume` said it continued from ("resume: continuing from checkpoint
  step N" -> N, "resume: no complete checkpoint found" -> 0), None when it said neither.
- `join_resume_problem(resumed, last_checkpoint, reached, checkpoint_every)`: "" when the restarted node resumed
  from exactly the newest complete checkpoint the kill left (`last_checkpoint`, 0: none) and so lost at most
  `checkpoint_every` of the `reached` steps the killed run had finished; else why not (a silent restart from step 0
  fails here).
- `landed_mid_apply(marker_before, marker_after)`: a worker's kill landed inside an apply when its pause marker
  (swarm_node/roles/apply_pause.py) named the same update before the kill and still did after it (the process
  never left the apply).
- `worker_follow_problem(worker_version, learner_version)`: "" when a restarted worker reached the version its
  learner had at the kill (at least v1: it followed one update), else why not.
- `cell_restart(finished_before, log_lines)`: how the run after a cell's kill went on: "finished"
  (the cell had completed before the kill), "resumed" (the runner's "resuming cell" line) or "redone" (from
  scratch); `cell_restart_problem(kind, snapshot_before)`: a cell redone although a snapshot was there is a failed
  resume.
- `count_cells(kinds)`: {"resumed", "redone", "redone_with_snapshot", "finished"} counts for the result.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

RESUMED = re.compile(r"resume: continuing from checkpoint step (\d+)")
NO_CHECKPOINT = "resume: no complete checkpoint found"
RESUMING_CELL = "resuming cell "


def resumed_step(lines: Iterable[str]) -> int | None:
    for line in lines:
        if match := RESUMED.search(line):
            return int(match.group(1))
        if NO_CHECKPOINT in line:
            return 0
    return None


def join_resume_problem(resumed: int | None, last_checkpoint: int, reached: int, checkpoint_every: int) -> str:
    if resumed is None:
        return "the restarted node never said which checkpoint it resumed from"
    if resumed != last_checkpoint:
        return f"resumed from step {resumed}, but the newest complete checkpoint was step {last_checkpoint}"
    lost = reached - resumed
    if lost > checkpoint_every:
        return (f"lost {lost} steps (the killed run had finished step {reached}, its newest checkpoint was "
                f"step {resumed}): more than checkpoint_every = {checkpoint_every}")
    return ""


def landed_mid_apply(marker_before: str | None, marker_after: str | None) -> bool:
    return marker_before is not None and marker_before == marker_after


def worker_follow_problem(worker_version: int, learner_version: int) -> str:
    target = max(learner_version, 1)
    if worker_version >= target:
        return ""
    return f"the restarted worker reached v{worker_version}, not the learner's v{target} at the kill"


def cell_restart(finished_before: bool, log_lines: Iterable[str]) -> str:
    if finished_before:
        return "finished"
    if any(line.startswith(RESUMING_CELL) for line in log_lines):
        return "resumed"
    return "redone"


def cell_restart_problem(kind: str, snapshot_before: bool) -> str:
    if kind == "redone" and snapshot_before:
        return "redone from scratch although a complete snapshot (progress.json) was there"
    return ""


def count_cells(restarts: Iterable[tuple[str, bool]]) -> dict[str, int]:
    """From (kind, snapshot_before) per cell point."""
    counts = {"resumed": 0, "redone": 0, "redone_with_snapshot": 0, "finished": 0}
    for kind, snapshot_before in restarts:
        counts[kind] += 1
        counts["redone_with_snapshot"] += kind == "redone" and snapshot_before
    return counts
