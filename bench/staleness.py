"""Bounded-staleness overlap benchmark: seconds per learner step, utilisation and reward for S in {0, 1, 2, 4}.

Two parts, written to bench/results/staleness.json:
- "virtual": `simulations.echo_sim` (one learner, 2 workers, real generation and training, virtual clock with the
  measured durations): tests the scheduling without this machine's load in the timings.
- "pinned": a real learner process pinned to core 0 and a real worker process pinned to core 1 (one torch thread
  each), rollouts as wire messages (RolloutBatch, re-scored by the learner) and policy updates as delta payloads
  over pipes; every duration is wall time under that pinning.
overlap_ratio = step_s / max(gen_s, train_s) at S = 1 in the pinned part (1.0 = perfect overlap; S = 0 pays
gen + train). Reward = mean training reward over the run's last half (equal steps for every S).

    python -m bench.staleness [--steps 40] [--staleness 0 1 2 4] [--skip-pinned] [--skip-virtual]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import msgpack

from bench import provenance
from bench.load_guard import add_loaded_flag

RESULTS = Path(__file__).parent / "results"
PROMPTS = 8
GROUP = 8


def _last_half_reward(steps: list[dict[str, Any]]) -> float:
    rewards = [m["reward_mean"] for m in steps if "reward_mean" in m]
    half = rewards[len(rewards) // 2:]
    return statistics.fmean(half) if half else 0.0


def virtual_part(staleness: list[int], steps: int, workers: int, seed: int) -> list[dict[str, Any]]:
    from simulations.echo_sim import EchoSimConfig, run_echo

    rows = []
    for s in staleness:
        with tempfile.TemporaryDirectory() as tmp:
            cfg = EchoSimConfig(steps=steps, workers=workers, max_staleness=s, prompts_per_step=PROMPTS,
                                group_size=GROUP, seed=seed)
            result = run_echo(cfg, Path(tmp))
        row = {"s": s, "step_s": result.step_s, "gen_s": result.gen_s, "train_s": result.train_s,
               "utilization": result.utilization, "reward": _last_half_reward(result.steps),
               "dropped": result.dropped}
        print(f"  virtual S={s}: step {row['step_s']:.3f}s gen {row['gen_s']:.3f}s train {row['train_s']:.3f}s "
              f"util {row['utilization']:.2f} reward {row['reward']:.3f}", flush=True)
        rows.append(row)
    return rows


def _config(role_index: int, staleness: int, steps: int, seed: int, run_dir: str, sampler: str) -> Any:
    from swarm_node.config import SAMPLER_CONFIGS, load_config

    # one engine thread where the kind runs an engine (its own setting: [sampler] threads)
    engine = {"sampler.threads": 1} if "threads" in SAMPLER_CONFIGS[sampler]().engine_knobs() else {}
    return load_config(None, {
        "run.prompts_per_step": PROMPTS, "run.group_size": GROUP, "run.seed": seed * 1000 + role_index,
        "run.run_dir": run_dir, "run.steps": steps, "run.eval_problems": 0, "run.checkpoint_every": steps + 1,
        "sampler.kind": sampler, "train.threads": 1, "train.max_staleness": staleness,
        "status.port": -1, **engine})


def _pin(core: int) -> None:
    if hasattr(os, "sched_setaffinity") and core < (os.cpu_count() or 1):
        os.sched_setaffinity(0, {core})


def worker_main(conn: Connection, staleness: int, steps: int, seed: int, run_dir: str, sampler: str) -> None:
    _pin(1)
    import torch

    from protocol.codec import encode
    from protocol.messages import RolloutBatch
    from swarm_node.node.assembly import Sharing, assemble
    from swarm_node.node.run_files import NodeEvents
    from swarm_node.policy_sync.delta import PolicyUpdate

    torch.set_num_threads(1)
    assembly = assemble(_config(1, staleness, steps, seed, run_dir, sampler), Sharing.ROLLOUTS,
                        events=NodeEvents(log=lambda _m: None))
    worker = assembly.worker()
    assert assembly.signer is not None
    conn.send_bytes(msgpack.packb({"ready": True, "base": worker.base_sha256()}))
    try:
        while True:
            while conn.poll(0 if worker.may_generate() else None):
                msg = msgpack.unpackb(conn.recv_bytes())
                if msg.get("stop"):
                    return
                if "announce" in msg:
                    worker.known_version = max(worker.known_version, msg["announce"])
                    continue
                worker.apply(PolicyUpdate(msg["version"], msg["base_version"], msg["encoding"], msg["payload"],
                                          msg["sha256"], msg["state_sha256"]))
            version = worker.version
            groups, gen_s, _tokens = worker.generate()
            wire = assembly.signer.wire(groups, "learner", version, "worker", worker.batches)
            conn.send_bytes(msgpack.packb({"gen_s": gen_s, "batch": encode(RolloutBatch(tuple(wire)))}))
    finally:
        assembly.close()


def learner_main(conn: Connection, staleness: int, steps: int, seed: int, run_dir: str, out: Connection) -> None:
    _pin(0)
    import torch

    from protocol.codec import decode
    from swarm_node.node.assembly import Sharing, assemble
    from swarm_node.node.run_files import NodeEvents
    from swarm_node.sharing.exchange import Received
    from swarm_node.sharing.ingest import Ingest

    torch.set_num_threads(1)
    assembly = assemble(_config(0, staleness, steps, seed, run_dir, "hf"), Sharing.ROLLOUTS,
                        events=NodeEvents(log=lambda _m: None))
    node = assembly.node
    learner = assembly.learner()
    hello = msgpack.unpackb(conn.recv_bytes())
    if hello["base"] != learner.base_sha256:
        raise RuntimeError("worker base model differs from the learner's")
    limits = node.wire_limits()
    assert assembly.context is not None
    # No peer guard: the one worker is ours, and its budget must not shape what is measured.
    ingest = Ingest(assembly.context, node.stats, {"learner": frozenset({"worker"})}, keep_no_signal=True)

    def buffer(ext: Any, sender: str) -> list[tuple[str, str]]:
        reason = learner.admit(ext.group)
        return [(sender, reason)] if reason is not None else []
    rows: list[dict[str, Any]] = []
    gen_times: list[float] = []
    last = time.monotonic()
    try:
        while node.step < steps:
            while not learner.ready() or conn.poll(0):
                msg = msgpack.unpackb(conn.recv_bytes())
                gen_times.append(msg["gen_s"])
                batch = decode(msg["batch"], limits)
                now = time.time()
                ingest([Received("worker", now, wire) for wire in batch.groups], now,  # type: ignore[union-attr]
                       buffer)
            metrics, update = learner.train()
            if update is not None:
                conn.send_bytes(msgpack.packb({"announce": update.version}))
                conn.send_bytes(msgpack.packb({
                    "version": update.version, "base_version": update.base_version, "encoding": update.encoding,
                    "payload": update.payload, "sha256": update.sha256, "state_sha256": update.state_sha256}))
            now_m = time.monotonic()
            metrics["wall_step_s"] = now_m - last
            last = now_m
            rows.append(metrics)
        conn.send_bytes(msgpack.packb({"stop": True}))
    finally:
        assembly.close()
    out.send({"steps": rows, "gen": gen_times, "dropped": dict(learner.buffer.dropped)})


def pinned_part(staleness: list[int], steps: int, seed: int, sampler: str) -> list[dict[str, Any]]:
    ctx = mp.get_context("spawn")
    rows = []
    for s in staleness:
        with tempfile.TemporaryDirectory() as tmp:
            a, b = ctx.Pipe()
            result_recv, result_send = ctx.Pipe(duplex=False)
            worker = ctx.Process(target=worker_main, args=(b, s, steps, seed, f"{tmp}/worker", sampler), daemon=True)
            learner = ctx.Process(target=learner_main, args=(a, s, steps, seed, f"{tmp}/learner", result_send),
                                  daemon=True)
            worker.start()
            learner.start()
            for end in (a, b, result_send):  # the children hold them: a crash then reads as EOF, not a hang
                end.close()
            data = result_recv.recv()
            learner.join(60)
            worker.join(60)
            if worker.is_alive():
                worker.kill()
        measured = data["steps"][2:]  # the first steps include the pipeline filling up
        row = {"s": s,
               "step_s": statistics.median(m["wall_step_s"] for m in measured),
               "gen_s": statistics.median(data["gen"][2:]),
               "train_s": statistics.median(m["train_s"] for m in measured),
               "reward": _last_half_reward(data["steps"]),
               "dropped": data["dropped"]}
        row["utilization"] = min(1.0, row["train_s"] / row["step_s"])
        print(f"  pinned S={s}: step {row['step_s']:.3f}s gen {row['gen_s']:.3f}s train {row['train_s']:.3f}s "
              f"util {row['utilization']:.2f} reward {row['reward']:.3f} lags "
              f"{sorted({m['lag'] for m in data['steps']})}", flush=True)
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--staleness", type=int, nargs="+", default=[0, 1, 2, 4])
    parser.add_argument("--workers", type=int, default=2, help="virtual part")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sampler", default="hf", help="the pinned worker's sampler (hf | vllm)")
    parser.add_argument("--skip-virtual", action="store_true")
    parser.add_argument("--skip-pinned", action="store_true")
    add_loaded_flag(parser)
    args = parser.parse_args()
    run = provenance.begin(timed=True, loaded=args.loaded)  # s/step
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    from swarm_node.model.default_model import ensure_default_model

    ensure_default_model()
    started = time.monotonic()
    out = RESULTS / "staleness.json"
    previous = json.loads(out.read_text()) if out.exists() else {}
    virtual = previous.get("virtual", []) if args.skip_virtual else virtual_part(args.staleness, args.steps,
                                                                                  args.workers, args.seed)
    pinned = previous.get("pinned", []) if args.skip_pinned else pinned_part(args.staleness, args.steps, args.seed,
                                                                              args.sampler)
    s1 = next((r for r in pinned if r["s"] == 1), None)
    ratio = s1["step_s"] / max(s1["gen_s"], s1["train_s"]) if s1 else None
    result = {"virtual": virtual, "pinned": pinned, "overlap_ratio": ratio,
              "setup": {"steps": args.steps, "prompts_per_step": PROMPTS, "group_size": GROUP,
                        "virtual_workers": args.workers, "pinned_worker_sampler": args.sampler,
                        "model": "embedded default", "cpu_count": os.cpu_count()},
              "wall_s": time.monotonic() - started}
    RESULTS.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(provenance.stamp(result, run, runs=1), indent=1))
    s0 = next((r for r in pinned if r["s"] == 0), None)
    line = "staleness:"
    if s0 and s1:
        line += (f" pinned S=0 {s0['step_s']:.3f}s/step (gen {s0['gen_s']:.3f} + train {s0['train_s']:.3f}), "
                 f"S=1 {s1['step_s']:.3f}s/step, overlap_ratio {ratio:.2f};")
    line += " virtual util " + ", ".join(f"S={r['s']} {r['utilization']:.2f}" for r in virtual)
    print(line)


if __name__ == "__main__":
    sys.exit(main())
