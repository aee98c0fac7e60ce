"""The cost of receiving gossip to a training loop, per host isolation.

    python -m bench.gossip_arch [--runs 3] [--train-s 8]

Trainer steps/s (a stand-in: torch matmuls and Python work on one thread) on node A while node B publishes 100
groups/s to it, with the network host in a child process or on a thread, against the same loop with no network;
repeated and interleaved, the order rotating each run. Writes gossip_arch.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

from bench import provenance
from bench.gossip import ISOLATIONS, RESULTS, load_average, next_event, start_swarm
from bench.gossip_node import train_for
from bench.load_guard import add_loaded_flag
from bench.paired import paired_ratio_or_none, ratio_text, round_order

ARCH_ARMS = ("none", "process", "thread")  # the training loop alone (the baseline), then with each isolation


def arch_paired(samples: dict[str, list[dict[str, Any]]]) -> dict[str, float | None]:
    """Per isolation, the median over runs of its steps/s over the same run's steps/s without a network."""
    alone = [s["steps_per_s"] for s in samples["none"]]
    return {iso: paired_ratio_or_none([s["steps_per_s"] for s in samples[iso]], alone) for iso in ISOLATIONS}



async def arch_sample(isolation: str, train_s: float) -> dict[str, Any]:
    """One arm of an arch run: the training loop alone ("none"), or on node A while node B sends 100 groups/s."""
    if isolation == "none":
        steps = train_for(train_s)
        return {"steps_per_s": len(steps) / train_s, "load_avg": load_average()}
    procs, _ = await start_swarm(2, isolation)
    try:
        count = int(100 * train_s)
        t0 = time.time() + 1.0
        procs[0].send(cmd="train", seconds=train_s + 1.0)
        procs[1].send(cmd="go", t0=t0, count=count, rate=100.0)
        trained = (await next_event(procs[0], "trained", 600))["steps"]
        await next_event(procs[1], "done", 600)
        await asyncio.sleep(2.0)
        procs[0].send(cmd="stats")
        stats = await next_event(procs[0], "stats")
        lat = sorted(stats["latencies"])
        return {"steps_per_s": trained / (train_s + 1.0), "received": sum(stats["received"].values()),
                "sent": count, "p50_ms": 1000 * lat[len(lat) // 2] if lat else None,
                "p99_ms": 1000 * lat[int(0.99 * (len(lat) - 1))] if lat else None, "load_avg": load_average()}
    finally:
        for proc in procs:
            await proc.close(quit_grace_s=15)


async def arch(args: argparse.Namespace, run: provenance.Run) -> None:
    """Trainer steps/s on node A while node B sends it 100 groups/s, per isolation, against no network at all.

    Repeated and interleaved (the order rotating each run) because the machine is shared; medians reported, and
    per isolation the median of each run's ratio to that run's loop alone."""
    samples: dict[str, list[dict[str, Any]]] = {arm: [] for arm in ARCH_ARMS}
    for j in range(args.runs):
        for arm in round_order(ARCH_ARMS, j):
            samples[arm].append(await arch_sample(arm, args.train_s))
        for iso in ISOLATIONS:
            alone = samples["none"][j]["steps_per_s"]
            samples[iso][j]["steps_per_s_vs_none"] = paired_ratio_or_none([samples[iso][j]["steps_per_s"]], [alone])
    median = {iso: {k: statistics.median(x[k] for x in xs) for k in xs[0] if xs[0][k] is not None}
              for iso, xs in samples.items()}
    paired = arch_paired(samples)
    result = {"note": "trainer stand-in (torch matmuls + Python work, 1 torch thread) on node A while node B "
                      "publishes 100 groups/s to it; medians of interleaved runs; paired_steps_per_s_vs_none: "
                      "the median of each run's ratio to the same run's loop alone", "train_s": args.train_s,
              "cpus": os.cpu_count(), "median": median,
              "paired_steps_per_s_vs_none": {k: None if v is None else round(v, 4) for k, v in paired.items()},
              "samples": samples}
    out = Path(args.results_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gossip_arch.json").write_text(json.dumps(provenance.stamp(result, run, args.runs), indent=2) + "\n")
    print(f"arch: trainer {median['none']['steps_per_s']:.1f} steps/s alone, {median['process']['steps_per_s']:.1f} "
          f"with the host in a child process (p50 {median['process']['p50_ms']:.0f} ms), "
          f"{median['thread']['steps_per_s']:.1f} with it on a thread (p50 {median['thread']['p50_ms']:.0f} ms), "
          f"receiving 100 groups/s (medians of {args.runs}); paired vs alone: process "
          f"{ratio_text(paired['process'])}, thread {ratio_text(paired['thread'])}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--train-s", type=float, default=8.0)
    parser.add_argument("--results-dir", default=str(RESULTS), help="where gossip_arch.json goes")
    add_loaded_flag(parser)
    args = parser.parse_args()
    asyncio.run(arch(args, provenance.begin(timed=True, loaded=args.loaded)))


if __name__ == "__main__":
    main()
