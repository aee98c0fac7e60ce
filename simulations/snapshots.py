"""Mid-run snapshots of a cell, so that one cell can span several sessions and a kill loses at most a few rounds.

Contract:
- Who: sync and async cells over the memory transport (memory_cell.py), every `[simulation] checkpoint_rounds` = K
  rounds (0: never) and after the last round. Not the libp2p cell (real hosts and wall-clock rounds: nothing to
  replay exactly) nor the echo cell (its learner buffer, the workers' followed policies, the deltas and rollouts in
  flight on the virtual clock are all state outside any node checkpoint): those stay resumable as whole cells.
- Layout, in the cell dir, written in this order:
      node<i>/checkpoints/step-<S>/  node i's own checkpoint (`Node.save_checkpoint`: atomic, verified) at the step S
                                     it has reached (none at step 0; not rewritten when S has not moved); each node
                                     keeps its KEEP_CHECKPOINTS newest, so the previous snapshot's survives a kill
                                     in the middle of this one
      metrics.csv                    every row so far (atomic)
      progress.json                  last (atomic): `Progress`, the snapshot's description
  A snapshot exists once its progress.json does: a kill before that leaves the previous snapshot the valid one.
- Resume rule (`resume_point`, run by the runner before an incomplete cell): the cell resumes when progress.json
  reads, carries the cell's fingerprint, every node's newest checkpoint (after deleting those newer than the
  snapshot: written by a later, unfinished snapshot) is at exactly the snapshot's step, and metrics.csv holds the
  snapshot's rows (rows past it are dropped). Otherwise None: the runner redoes the cell from scratch.
- Restored (`restore`): each node's model, optimizer, task RNG, step, policy version (its checkpoint, with
  `run.resume`); what its checkpoint lacks: the trainer's minibatch RNG, the external-selection RNG and the peer
  drop counts; the network model's clock, loss RNG and link occupancy; the async event queue; the process-global
  python and torch RNGs; the wall time so far. Not restored: messages in flight on the network model and, in async
  mode, those delivered to a node's exchange but not yet drained into its pool (sync: at a round's end every
  message of the round has been drained, unless a busy link still holds it; async: the groups published within
  about one hop time before the snapshot are lost); each node's experience pool of external groups (it refills
  from the next rounds' messages; its replay memory, its `pool_size` column and the `too_old` drops of what it
  held start from empty); the transports' gossip state; NodeStats counters; a shared LoRA engine's adapters (each
  node reloads its policy into it). With J = 0 external groups none of that reaches training: a resumed cell's
  per-round rewards, losses, steps and policy versions equal an uninterrupted one's exactly. With J > 0 they are
  equal only if every pool was empty at the snapshot; otherwise the external groups picked after the resume
  differ and the run continues as another draw of the same process.
"""

from __future__ import annotations

import base64
import json
import os
import random
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from simulations.cells import LogFn, SimNode, peer_name
from simulations.network import NetworkHub
from simulations.results import METRICS_CSV, typed_rows, write_csv
from swarm_node.model import checkpoint

PROGRESS_FILE = "progress.json"
KEEP_CHECKPOINTS = 2  # the snapshot's own and the previous one (a kill mid-snapshot falls back to it)


@dataclass
class Progress:
    """progress.json: the last complete snapshot of a cell."""

    fingerprint: str
    round: int  # rounds done (async: steps done / nodes)
    steps: list[int]  # node i's step: its checkpoint's
    rows: int  # rows in metrics.csv at the snapshot
    rows_through: list[int]  # node i's last row's round
    wall_s: float  # cell compute time so far, over every session
    loop: dict[str, Any] = field(default_factory=dict)  # the round loop's own state (async: queue, steps, done)
    hub: dict[str, Any] = field(default_factory=dict)  # NetworkHub.state()
    nodes: list[dict[str, Any]] = field(default_factory=list)  # per node: what its checkpoint lacks
    global_rng: dict[str, Any] = field(default_factory=dict)  # the process's python and torch RNGs

    @classmethod
    def read(cls, root: Path) -> Progress:
        return cls(**json.loads((root / PROGRESS_FILE).read_text()))


@dataclass
class Resume:
    progress: Progress
    rows: list[dict[str, Any]]  # metrics.csv up to the snapshot, typed


def resume_point(root: Path, fingerprint: str, nodes: int, log: LogFn) -> Progress | None:
    """The snapshot an incomplete cell resumes from, or None (redo from scratch); see the contract. Deletes node
    checkpoints newer than the snapshot."""
    if not (root / PROGRESS_FILE).exists():
        return None
    try:
        progress = Progress.read(root)
    except (OSError, ValueError, TypeError) as exc:
        log(f"{root}: unreadable {PROGRESS_FILE} ({exc}); running the cell again")
        return None
    if progress.fingerprint != fingerprint or len(progress.steps) != nodes:
        log(f"{root}: snapshot of a different scenario or model; running the cell again")
        return None
    for i, step in enumerate(progress.steps):
        run_dir = root / peer_name(i)
        for path in (run_dir / checkpoint.CHECKPOINT_DIR).glob("step-*"):
            match = checkpoint.STEP_DIR.match(path.name)
            if match and int(match.group(1)) > step:
                shutil.rmtree(path)
        ckpt = checkpoint.latest_checkpoint(run_dir, warn=log)
        if (ckpt.step if ckpt is not None else 0) != step:
            log(f"{root}: {peer_name(i)} has no checkpoint at its snapshot step {step}; running the cell again")
            return None
    try:
        rows = read_snapshot(root, progress).rows
    except (OSError, ValueError, KeyError) as exc:
        log(f"{root}: unreadable {METRICS_CSV} ({exc}); running the cell again")
        return None
    if len(rows) != progress.rows:
        log(f"{root}: {METRICS_CSV} has {len(rows)} rows up to the snapshot, not {progress.rows}; running again")
        return None
    return progress


def read_snapshot(root: Path, progress: Progress | None = None) -> Resume:
    """The snapshot `resume_point` accepted: progress.json and the rows up to it."""
    progress = progress or Progress.read(root)
    rows = [r for r in typed_rows(root / METRICS_CSV) if r["round"] <= progress.rows_through[r["node"]]]
    return Resume(progress, rows)


def restore(progress: Progress, nodes: list[SimNode], hub: NetworkHub) -> None:
    """What the nodes' checkpoints lack (call after building the nodes with `run.resume`)."""
    for n, extra in zip(nodes, progress.nodes, strict=True):
        n.node.streams.set_state({k: extra[k] for k in ("trainer_rng", "share_rng")})
        peer = n.assembly.peer
        for sender, reason, count in extra["drops"] if peer is not None else ():
            peer.ingest.peer_drops[(sender, reason)] = count
    hub.restore(progress.hub)
    random.setstate(checkpoint.state_from_json(progress.global_rng["python"]))
    raw = bytearray(base64.b64decode(progress.global_rng["torch"]))
    torch.random.set_rng_state(torch.frombuffer(raw, dtype=torch.uint8).clone())


def clear(root: Path, nodes: int) -> None:
    """After the cell's result.json: its snapshots are of no more use (and the disk is)."""
    (root / PROGRESS_FILE).unlink(missing_ok=True)
    for i in range(nodes):
        shutil.rmtree(root / peer_name(i) / checkpoint.CHECKPOINT_DIR, ignore_errors=True)


class CellSnapshots:
    """A running cell's snapshots: where it resumed from, and `save` every `every` rounds."""

    def __init__(self, root: Path, fingerprint: str, every: int, resumed: Resume | None, log: LogFn) -> None:
        self.root, self.fingerprint, self.every, self.resumed, self.log = root, fingerprint, every, resumed, log
        self.started = time.monotonic()
        self.prior_wall_s = resumed.progress.wall_s if resumed is not None else 0.0

    @property
    def start_round(self) -> int:
        return self.resumed.progress.round if self.resumed is not None else 0

    def loop_state(self) -> dict[str, Any]:
        return self.resumed.progress.loop if self.resumed is not None else {}

    def due(self, done: int, last: int) -> bool:
        return self.every > 0 and (done % self.every == 0 or done == last)

    def save(self, rnd: int, nodes: list[SimNode], rows: list[dict[str, Any]], hub: NetworkHub,
             loop: dict[str, Any] | None = None) -> bool:
        """Snapshot after round `rnd`: False (and the previous snapshot stays the valid one) if a node's checkpoint
        could not be written."""
        for n in nodes:
            node = n.node
            if node.step and not _has_checkpoint(node.run_dir, node.step):
                node.save_checkpoint()  # atomic; on failure it warns and writes nothing
                if not _has_checkpoint(node.run_dir, node.step):
                    self.log(f"{self.root}: snapshot at round {rnd} skipped: {peer_name(n.index)}'s checkpoint "
                             "was not written")
                    return False
        write_csv(self.root / METRICS_CSV, rows)
        through = [0] * len(nodes)
        for r in rows:
            through[int(r["node"])] = max(through[int(r["node"])], int(r["round"]))
        progress = Progress(
            self.fingerprint, rnd, [n.node.step for n in nodes], len(rows), through,
            self.prior_wall_s + time.monotonic() - self.started, loop or {}, hub.state(),
            [_node_extra(n) for n in nodes],
            {"python": checkpoint.state_to_json(random.getstate()),
             "torch": base64.b64encode(torch.random.get_rng_state().numpy().tobytes()).decode()})
        _write_json(self.root / PROGRESS_FILE, asdict(progress))
        return True


def _node_extra(n: SimNode) -> dict[str, Any]:
    streams = n.node.streams.state()
    return {"trainer_rng": streams["trainer_rng"], "share_rng": streams["share_rng"],
            "drops": [[sender, reason, count] for (sender, reason), count in n.assembly.peer_drops.items()]}


def _has_checkpoint(run_dir: Path, step: int) -> bool:
    return (run_dir / checkpoint.CHECKPOINT_DIR / f"step-{step:08d}" / checkpoint.MANIFEST).exists()


def _write_json(path: Path, value: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(value, f)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
