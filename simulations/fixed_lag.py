"""Training at a fixed lag: the batch trained at policy version v is sampled by version max(0, v - S).

`FixedLagSource(node, lag)` is a rollout source (node/sources.py) for one node alone: before each draft it keeps a
host copy of the current policy (version v, in the form the sampler loads), drops the copies older than v - S, and
loads version max(0, v - S) into the sampler, so the draft's groups carry that version and the node trains them as
stale rows with lag min(v, S) (train.stale_correction says how). `sampled_by` records (v, the version that sampled).
It keeps at most S + 1 copies of the sampler's weights on the host: with LoRA that form is the adapter alone.
An eval (inside `paused()`) and the end of the run (`close()`) put the current policy back into the sampler: the
node evaluates whatever its sampler holds, and after a step that trained nothing (no group with signal) nothing
else would replace the lagged version the last draft loaded (before 2026-11-28 the final eval of such a cell
measured version max(0, v - S), at S = 256 the untrained policy).

`run_fixed_lag_cell(cfg, lag)` runs one such node for run.steps (cfg's run dir, fresh) and returns the cell's
result: the final policy's held-out greedy accuracy (node.evaluate: run.eval_problems problems never drawn for
training), the one before training, and the lags it trained at.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from swarm_node.config import NodeConfig
from swarm_node.node.assembly import assemble
from swarm_node.node.core import Node, NodeEvents
from swarm_node.node.sources import BaseSource, Item


class FixedLagSource(BaseSource):
    direct_weights = True  # the node loads each new policy into the sampler; the next draft swaps in the old one

    def __init__(self, node: Node, lag: int) -> None:
        if lag < 0:
            raise ValueError(f"the lag must be >= 0, got {lag}")
        self.node = node
        self.lag = lag
        self.snapshots: dict[int, dict[str, torch.Tensor]] = {}  # policy version -> host copy of its weights
        self.sampled_by: list[tuple[int, int]] = []  # (the version trained next, the version that sampled)

    def __iter__(self) -> Iterator[Item]:
        while True:
            yield self.draft()

    def restore_current(self) -> None:
        """The current policy into the sampler (a draft loads its lagged version again)."""
        self.node.load_policy(self.node.policy_weights(), self.node.version)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        self.restore_current()
        yield

    def close(self) -> None:
        self.restore_current()

    def draft(self) -> Item:
        version = self.node.version
        if version not in self.snapshots:
            self.snapshots[version] = {k: v.detach().to("cpu", copy=True)
                                       for k, v in self.node.policy_weights().items()}
        sampler_version = max(0, version - self.lag)
        for old in [v for v in self.snapshots if v < sampler_version]:
            del self.snapshots[old]
        self.node.load_policy(self.snapshots[sampler_version], sampler_version)
        self.sampled_by.append((version, sampler_version))
        return self.node.draft()


def run_fixed_lag_cell(cfg: NodeConfig, lag: int, log: Callable[[str], None] = print) -> dict[str, Any]:
    """One node trained for run.steps at a fixed lag; its held-out accuracies and the lags it trained at."""
    lags: list[int] = []

    def on_step(metrics: dict[str, Any]) -> None:
        if "lag" in metrics:
            lags.append(int(metrics["lag"]))
        if metrics["step"] % 16 == 0:
            log(f"step {metrics['step']}/{cfg.run.steps} lag {metrics.get('lag')} "
                f"reward {metrics.get('reward_mean', float('nan')):.3f}")

    assembly = assemble(cfg, events=NodeEvents(log=log, on_step=on_step))
    node = assembly.node
    source = FixedLagSource(node, lag)
    started = time.monotonic()
    try:
        summary = node.run(source)
    finally:
        node.close()
    final, before = summary.eval, summary.eval_before
    return {"lag": lag, "steps": summary.steps, "heldout_acc": None if final is None else final.greedy_acc,
            "heldout_acc_before": None if before is None else before.greedy_acc,
            "heldout_problems": None if final is None else final.problems, "trained_lags": lags,
            "sampled_by": source.sampled_by, "wall_s": time.monotonic() - started}
