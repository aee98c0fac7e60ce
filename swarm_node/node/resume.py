"""A node's checkpoints: what a step's checkpoint holds besides the weights, and resuming from the newest one.

Contract:
- `RandomStreams(task, trainer, share, book)`: the node's random streams (task draws, the minibatch shuffle, a SAPO
  peer's external selection) and the task source's pass-rate estimates (`tasks.PassRateBook`, which the adaptive
  selection's draws read); all are checkpointed so that a resumed run continues exactly. `state()` /
  `set_state(state)` are their JSON form (a simulation's cell snapshots keep the trainer and share streams).
- `save(...)` writes one checkpoint atomically (model/checkpoint.py); a failure is counted and logged, never raised
  (training goes on and the next checkpoint tries again).
- `CheckpointSchedule(every_steps, every_s, last_s)`: pure decision of when a step checkpoints: every
  `every_steps` steps, at the last step, or once `every_s` seconds (0: never) passed since the last checkpoint (or
  the start), whichever comes first; `saved(now)` restarts the time.
- `restore_latest(run_dir, resume, ...)`: without `resume`, a run dir that already has checkpoints is a `UserError`
  and a stale metrics file is removed; with it, the newest complete checkpoint is loaded into the model, optimizer
  and streams and the metrics file is cut back to its step (`Restored`), or None when there is none (step 0).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from swarm_node.config import NodeConfig
from swarm_node.errors import UserError
from swarm_node.model import checkpoint
from swarm_node.node.run_files import METRICS_FILE, truncate_metrics
from swarm_node.status.stats import NodeStats
from swarm_node.tasks import PassRateBook
from swarm_node.train.trainer import Trainer


@dataclass(frozen=True)
class RandomStreams:
    task: random.Random
    trainer: random.Random
    share: random.Random
    book: PassRateBook | None = None

    def state(self) -> dict[str, Any]:
        state = {"task_rng": checkpoint.state_to_json(self.task.getstate()),
                 # The minibatch shuffle and the external selection too, so that a resumed run continues exactly.
                 "trainer_rng": checkpoint.state_to_json(self.trainer.getstate()),
                 "share_rng": checkpoint.state_to_json(self.share.getstate())}
        if self.book is not None and (self.book.families or self.book.instances):
            state["pass_rates"] = self.book.state()
        return state

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore the streams `state` holds (checkpoints written before a stream was saved lack it)."""
        for name, rng in (("task_rng", self.task), ("trainer_rng", self.trainer), ("share_rng", self.share)):
            if name in state:
                rng.setstate(checkpoint.state_from_json(state[name]))
        if self.book is not None and "pass_rates" in state:
            self.book.set_state(state["pass_rates"])


@dataclass
class CheckpointSchedule:
    every_steps: int
    every_s: float
    last_s: float  # when the last checkpoint was written (or the run started), on the caller's clock

    def due(self, step: int, last_step: int, now: float) -> bool:
        return (step % self.every_steps == 0 or step == last_step
                or (self.every_s > 0 and now - self.last_s >= self.every_s))

    def saved(self, now: float) -> None:
        self.last_s = now


@dataclass(frozen=True)
class Restored:
    step: int
    version: int
    skipped_steps: int
    path: Path


def save(run_dir: Path, step: int, model: nn.Module, trainer: Trainer, streams: RandomStreams, cfg: NodeConfig,
         stats: NodeStats, log: Callable[[str], None], *, version: int, skipped_steps: int) -> None:
    state = {"policy_version": version, "skipped_steps": skipped_steps, "optimizer_steps": trainer.optimizer_steps,
             **streams.state(), "config": cfg.to_dict()}
    try:
        path = checkpoint.save_checkpoint(run_dir, step, model, trainer.optimizer, state,
                                          keep=cfg.run.keep_checkpoints)
    except checkpoint.CheckpointError as exc:
        stats.count("errors", "checkpoint_failed", 1)
        log(f"warning: {exc}")
        return
    stats.update(last_checkpoint={"step": step, "path": str(path), "time": time.time()})


def restore_latest(run_dir: Path, resume: bool, model: nn.Module, trainer: Trainer, streams: RandomStreams,
                   log: Callable[[str], None]) -> Restored | None:
    if not resume:
        if any((run_dir / checkpoint.CHECKPOINT_DIR).glob("step-*")):
            raise UserError(f"run dir {str(run_dir)!r} already has checkpoints: pass --resume to continue it, or "
                            "choose another --run-dir")
        (run_dir / METRICS_FILE).unlink(missing_ok=True)
        return None
    ckpt = checkpoint.latest_checkpoint(run_dir, warn=log)
    if ckpt is None:
        log("resume: no complete checkpoint found; starting from step 0")
        (run_dir / METRICS_FILE).unlink(missing_ok=True)
        return None
    checkpoint.restore(ckpt, model, trainer.optimizer)
    trainer.optimizer_steps = int(ckpt.state.get("optimizer_steps", 0))
    streams.set_state(ckpt.state)
    truncate_metrics(run_dir / METRICS_FILE, ckpt.step)
    version = int(ckpt.state["policy_version"])
    log(f"resume: continuing from checkpoint step {ckpt.step} (policy version {version})")
    return Restored(ckpt.step, version, int(ckpt.state.get("skipped_steps", 0)), ckpt.path)
