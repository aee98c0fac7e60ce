"""ECHO-2 on a virtual clock: one learner and W workers, real training and generation, simulated time.

Contract:
- Every computation is real (the workers' sampling with their own followed policy, the learner's GRPO steps, the
  delta encode/decode and hash checks); only time is simulated. Each worker batch takes its measured wall time
  divided by the worker's speed factor; each learner step its measured wall time; a policy update reaches each
  worker when `simulations.broadcast_sim` (the same relay state machines as the real broadcast, links of
  `bandwidth_mb_s` shared max-min fairly) says its last chunk is verified there; rollouts reach the learner
  after `latency_s`. So the schedule is what a swarm with these compute and network speeds would do, whatever the load
  on this machine.
- Each worker generates `prompts_per_step / W` groups per batch, when `Worker.may_generate` allows (the bound
  S); the learner starts a step as soon as B groups within S are buffered (S = 0: it waits for rollouts of its
  current version, paying generation + dissemination + training in turn).
- Returns per-step metrics and a summary: virtual seconds per learner step, mean generation and training
  seconds, learner utilisation (training time / elapsed), mean reward.
"""

from __future__ import annotations

import heapq
import itertools
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from protocol.relay import DEFAULT_SCHEDULE
from simulations.broadcast_sim import receiver_names, simulate
from swarm_node.config import load_config
from swarm_node.node.assembly import Assembly, assemble
from swarm_node.node.run_files import NodeEvents
from swarm_node.policy_sync.delta import PolicyUpdate


@dataclass
class EchoSimConfig:
    steps: int = 30
    workers: int = 2
    worker_speeds: list[float] = field(default_factory=list)  # default 1.0 each
    max_staleness: int = 1
    prompts_per_step: int = 8
    group_size: int = 8
    seed: int = 0
    model_path: str = ""  # empty: the embedded default model
    encoding: str = "topk"
    bandwidth_mb_s: float = 12.5  # 100 Mbit/s
    latency_s: float = 0.02
    chunk_bytes: int = 1 << 20
    schedule: str = DEFAULT_SCHEDULE
    overrides: dict[str, Any] = field(default_factory=dict)  # dotted config keys for every node


@dataclass
class EchoSimResult:
    steps: list[dict[str, Any]]
    step_s: float
    gen_s: float
    train_s: float
    utilization: float
    reward: float
    dropped: dict[str, int]

    def summary(self) -> dict[str, Any]:
        return {"step_s": self.step_s, "gen_s": self.gen_s, "train_s": self.train_s,
                "utilization": self.utilization, "reward": self.reward, "dropped": self.dropped}


def dissemination_s(nbytes: int, workers: int, cfg: EchoSimConfig) -> list[float]:
    """Seconds until each worker holds a verified update of `nbytes` (pipelined broadcast on the network model)."""
    result = simulate(cfg.schedule, workers, nbytes, cfg.bandwidth_mb_s * 1e6, chunk_bytes=cfg.chunk_bytes,
                      latency_s=cfg.latency_s)
    return [result.done_at[name] for name in receiver_names(workers)]


def _node(cfg: EchoSimConfig, run_dir: Path, index: int, local_groups: int) -> Assembly:
    overrides = {"run.prompts_per_step": cfg.prompts_per_step, "run.group_size": cfg.group_size,
                 "run.seed": cfg.seed * 1000 + index, "run.run_dir": str(run_dir), "run.steps": cfg.steps,
                 "run.eval_problems": 0, "run.checkpoint_every": cfg.steps + 1, "sampler.kind": "native",
                 "train.max_staleness": cfg.max_staleness, "train.threads": 1, "status.port": -1,
                 "share.local_groups": local_groups, "model.path": cfg.model_path, "echo.encoding": cfg.encoding,
                 **cfg.overrides}
    return assemble(load_config(None, overrides), events=NodeEvents(log=lambda _m: None))


def run_echo(cfg: EchoSimConfig, run_dir: Path, on_step: Callable[[dict[str, Any]], None] | None = None
             ) -> EchoSimResult:
    if cfg.prompts_per_step % cfg.workers:
        raise ValueError("prompts_per_step must be a multiple of the number of workers")
    speeds = cfg.worker_speeds or [1.0] * cfg.workers
    per_worker = cfg.prompts_per_step // cfg.workers
    nodes = [_node(cfg, run_dir / "learner", 0, 0)]
    nodes += [_node(cfg, run_dir / f"worker{i}", i + 1, per_worker) for i in range(cfg.workers)]
    learner = nodes[0].learner()
    workers = [n.worker() for n in nodes[1:]]
    for w in workers:
        if w.base_sha256() != learner.base_sha256:
            raise ValueError("workers and learner must start from the same base model")

    queue: list[tuple[float, int, str, Any]] = []
    order = itertools.count()

    def at(t: float, kind: str, payload: Any) -> None:
        heapq.heappush(queue, (t, next(order), kind, payload))

    now = 0.0
    learner_busy = False
    busy_workers: set[int] = set()
    pending: list[list[PolicyUpdate]] = [[] for _ in workers]
    steps: list[dict[str, Any]] = []
    gen_times: list[float] = []
    train_times: list[float] = []

    try:
        while len(steps) < cfg.steps:
            # Start whatever can start now: workers first (they use the versions they hold at this instant).
            for i, w in enumerate(workers):
                if i in busy_workers:
                    continue
                for update in pending[i]:
                    w.apply(update)
                pending[i].clear()
                if w.may_generate():
                    groups, wall_s, _tokens = w.generate()
                    duration = wall_s / speeds[i]
                    gen_times.append(duration)
                    busy_workers.add(i)
                    at(now + duration, "generated", (i, groups))
            if not learner_busy and learner.ready():
                started = time.monotonic()
                metrics, update = learner.train()
                duration = time.monotonic() - started
                train_times.append(duration)
                learner_busy = True
                at(now + duration, "trained", (metrics, update))
            if not queue:
                raise RuntimeError("echo simulation stalled: nothing scheduled (check max_staleness and workers)")
            now, _, kind, payload = heapq.heappop(queue)
            if kind == "generated":
                i, groups = payload
                busy_workers.discard(i)
                at(now + cfg.latency_s, "rollouts", groups)
            elif kind == "rollouts":
                learner.offer(payload)
            elif kind == "trained":
                metrics, update = payload
                learner_busy = False
                metrics["time_s"] = now
                steps.append(metrics)
                if on_step is not None:
                    on_step(metrics)
                if update is not None:
                    for i, delay in enumerate(dissemination_s(update.size, len(workers), cfg)):
                        at(now + delay, "update", (i, update))
                    for w in workers:  # the announce (small, gossip) arrives long before the chunks
                        w.known_version = max(w.known_version, update.version)
            elif kind == "update":
                i, update = payload
                pending[i].append(update)
    finally:
        for n in nodes:
            n.close()
    rewards = [m["reward_mean"] for m in steps if "reward_mean" in m]
    return EchoSimResult(
        steps=steps, step_s=now / len(steps), gen_s=statistics.fmean(gen_times), train_s=statistics.fmean(train_times),
        utilization=sum(train_times) / now if now > 0 else 0.0, reward=statistics.fmean(rewards) if rewards else 0.0,
        dropped=dict(learner.buffer.dropped))

