"""A node's run directory: its check, metrics.jsonl and the one place a finished step is recorded.

Contract:
- `prepare_run_dir(path)` creates the run dir and proves it writable (else a one-line `UserError`).
- `truncate_metrics(path, last_step)`: after a resume, drop the lines of steps the checkpoint does not hold
  (rewritten atomically; a line cut by a kill is dropped too).
- `StepLog(path, stats, events)`: `write(metrics)` appends one line to metrics.jsonl (flushed), records the step
  in `NodeStats` and calls `events.on_step`: every role (the node loop, an ECHO-2 worker) records a step with it.
  `publish(metrics)` does the last two only (a lockstep simulation's node writes no metrics.jsonl).
- `reward_window(path)`: mean reward of the first and last steps written (the CLI's summary line).
- `NodeEvents` (the CLI's progress callbacks) and `RunSummary` (what a run returns) live here: no torch.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, TYPE_CHECKING, Any

from swarm_node.errors import UserError
from swarm_node.status.stats import NodeStats

if TYPE_CHECKING:
    from swarm_node.train.evaluate import EvalResult

METRICS_FILE = "metrics.jsonl"


@dataclass
class NodeEvents:
    """Callbacks the CLI uses to show progress; all optional."""

    log: Callable[[str], None] = print
    build_progress: Callable[[int, int, str], None] | None = None
    on_step: Callable[[dict[str, Any]], None] | None = None


@dataclass
class RunSummary:
    steps: int
    first_reward: float | None
    last_reward: float | None
    eval: EvalResult | None
    run_dir: Path
    skipped_steps: int
    eval_before: EvalResult | None = None  # the held-out eval before the first step of this run


def prepare_run_dir(path: Path) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".write-test"
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        raise UserError(f"run dir {str(path)!r} is not writable: {exc.strerror or exc}") from exc


def truncate_metrics(path: Path, last_step: int) -> None:
    """After a resume, drop metric lines for steps the checkpoint does not contain (rewritten atomically)."""
    if not path.exists():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            if json.loads(line).get("step", 0) <= last_step:
                kept.append(line)
        except json.JSONDecodeError:
            continue  # a line cut by a kill mid-write
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(line + "\n" for line in kept))
    os.replace(tmp, path)


def reward_window(path: Path) -> tuple[float | None, float | None]:
    """Mean reward over the first and over the last steps in metrics.jsonl (up to 10 each; None without any)."""
    rewards = []
    if path.exists():
        rewards = [m["reward_mean"] for m in map(json.loads, path.read_text().splitlines()) if "reward_mean" in m]
    if not rewards:
        return None, None
    window = max(1, min(10, len(rewards) // 4))
    return sum(rewards[:window]) / window, sum(rewards[-window:]) / window


class StepLog:
    """Records finished steps: metrics.jsonl (when opened on a path), `NodeStats`, and `events.on_step`."""

    def __init__(self, path: Path | None, stats: NodeStats, events: NodeEvents) -> None:
        self.path = path
        self.stats = stats
        self.events = events
        self._file: IO[str] | None = None

    def __enter__(self) -> StepLog:
        if self.path is not None:
            self._file = open(self.path, "a")  # noqa: SIM115 - closed by __exit__
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def write(self, metrics: dict[str, Any]) -> None:
        if self._file is not None:
            self._file.write(json.dumps(metrics) + "\n")
            self._file.flush()
        self.publish(metrics)

    def publish(self, metrics: dict[str, Any]) -> None:
        self.stats.record_step(metrics)
        if self.events.on_step is not None:
            self.events.on_step(metrics)
