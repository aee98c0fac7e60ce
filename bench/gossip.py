"""Rollout sharing throughput of the libp2p transport on both exchange paths: 4 node processes on 127.0.0.1.

`python -m bench.gossip` writes bench/results/gossip.json:
  {"path": "bounded", "nodes", "groups", "delivered_frac", "groups_per_s", "p50_ms", "p99_ms", "stream_mb_s",
   "p99_ms_at_500", "delivered_frac_at_500", "stages_at_500", "rate_high", "round_ms",
   "flood": {"path": "flood", the same figures, "batch", "batch_delay_ms", "paired_ratio_vs_thread", "runs"}}
The top-level figures are the bounded fan-in path's (`share.fanin = "bounded"`, what `join` uses by default); the
flood path's (`"flood"`, every group to every peer, join's path before issue 32) go under "flood", for the record.
- Each node is an OS process (bench/gossip_node.py) with a LibP2PTransport (network host in its own child
  process, join's default) and the protocol's validation; the nodes form a full mesh. Every node offers its share
  of `groups` groups (8 completions x 64 tokens, ~5 KB each, 1 to 7 of them right: every group carries a signal),
  starting at a common time. Every count is of groups, not messages.
  - bounded (bench/gossip_fanin.py): the node's real FaninExchange. Its rounds (flush: announce our queued groups as
    one DigestBatch of at most 64, then pull what the digests heard offer) run every `round_ms` (50); a group is
    delivered when it comes out of the exchange's `drain()`. The per-round caps that bound a node's intake in
    join (J) are raised so that every receiver fetches every group it is offered: the bench measures the path's
    capacity (which caps, and why, and why 50 ms rounds: bench/gossip_fanin.py).
  - flood: RolloutBatches of at most `--batch` groups on the rollout topic, a partial batch sent within
    `--batch-delay-ms` (bench/gossip_groups.py; the defaults, 16 and 50 ms, are the flood exchange's, `--batch 1`
    the path before batching); a group is delivered when its message is.
- groups_per_s, delivered_frac (capacity round): nodes publish as fast as the path's back-pressure lets them (the
  transport's for flood; the round for bounded: a node queues its next group while at most one round's digests
  wait); groups_per_s = groups / (last delivery - start); delivered_frac = deliveries / (groups x (nodes - 1)).
- p50_ms, p99_ms (paced round): publish-to-delivery latency over all deliveries while the nodes together offer
  `--rate` groups/s (100) for `--paced-s` seconds, i.e. the latency at that load rather than queueing at saturation;
  p99_ms_at_500 and delivered_frac_at_500: the same at `--rate-high` (500) groups/s; stages_at_500 (bounded path):
  where that round's latency goes, p50 and p99 of each stage (`gossip_fanin.latency_stages`: waiting for the
  sender's round, digest to the receiver's pulling round, that round).
- stream_mb_s: a 20 MiB blob node 1 -> node 2 over a stream protocol, until the receiver's ack (MB = 1e6 bytes),
  measured in each path's swarm (the transport's streams, not the path).
- Baseline, flood path only: the same workload with isolation="thread" (the network host on a trio thread inside
  the node process). Medians of `--runs` runs, the three arms (bounded, flood, flood on a thread) interleaved
  within each run (who goes first rotates); every arm, per run, with the machine's load average, goes to
  gossip_baseline.json.
- Paired, in "flood": `paired_ratio_vs_thread` {groups_per_s, p50_ms, p99_ms, stream_mb_s}, each the median of the
  per-run ratios process / thread (`bench/paired.py`), and `runs[j]` each run's values of both and its ratios.
`python -m bench.gossip_arch` measures what the network layer costs a training loop in the same process
(steps/s of a torch + Python loop while receiving 100 groups/s) for both isolations: gossip_arch.json, with
`paired_steps_per_s_vs_none` {process, thread}: the median of each run's ratio to the same run's loop without a
network, and each sample's own `steps_per_s_vs_none`.
It reports rates and times, so it refuses to start when the 1-minute load average is above 0.5 unless --loaded.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench import provenance
from bench.gossip_fanin import ROUND_S, latency_stages, percentile
from bench.gossip_node import BLOB_BYTES, PATHS, worker
from bench.load_guard import add_loaded_flag
from bench.paired import paired_ratios, paired_runs, ratio_text, round_order
from bench.procs import JsonProc, event_is

RESULTS = Path(__file__).resolve().parent / "results"
ISOLATIONS = ("process", "thread")  # ours, the baseline
BOUNDED, FLOOD, FLOOD_THREAD = ("bounded", "process"), ("flood", "process"), ("flood", "thread")
ARMS = (BOUNDED, FLOOD, FLOOD_THREAD)  # (path, isolation): the thread baseline is kept for the flood path only
ROUND_PARTS = ("capacity", "paced", "paced_high")
PAIRED_KEYS = ("groups_per_s", "p50_ms", "p99_ms", "stream_mb_s")


# ------------------------------------------------------------------------------------------- the orchestrator
async def spawn(isolation: str, path: str = "flood") -> JsonProc:
    return await JsonProc.start("bench.gossip", "--worker", "--isolation", isolation, "--path", path,
                                name=f"{path} {isolation} node")


async def next_event(proc: JsonProc, event: str, timeout: float = 120.0) -> dict[str, Any]:
    """The node's next `event` (each "done" or "stats" answers one command, so none is read twice)."""
    return await proc.take(event_is(event), timeout)


async def start_swarm(nodes: int, isolation: str, path: str = "flood") -> tuple[list[JsonProc], list[dict[str, Any]]]:
    procs = [await spawn(isolation, path) for _ in range(nodes)]
    ready = [await next_event(p, "ready") for p in procs]
    for i, proc in enumerate(procs[1:], start=1):  # full mesh: each node dials every earlier one
        proc.send(cmd="connect", addrs=[r["addr"] for r in ready[:i]])
        await next_event(proc, "connected")
    for proc in procs:
        proc.send(cmd="wait_subscribed", n=nodes - 1)
        await next_event(proc, "subscribed")
    await asyncio.sleep(1.5)  # a heartbeat or two so the mesh is grafted everywhere
    return procs, ready


async def gossip_round(procs: list[JsonProc], groups: int, rate: float | None, batch: int = 1,
                       batch_delay_ms: float = 50.0) -> dict[str, float]:
    n = len(procs)
    per_node = groups // n
    t0 = time.time() + 1.0
    for proc in procs:
        proc.send(cmd="go", t0=t0, count=per_node, rate=(rate / n) if rate else None, batch=batch,
                  batch_delay_ms=batch_delay_ms)
    for proc in procs:
        await next_event(proc, "done", 600)
    expected = per_node * (n - 1)
    deadline = time.time() + 30
    while True:
        stats = []
        for proc in procs:
            proc.send(cmd="stats")
            stats.append(await next_event(proc, "stats"))
        delivered = sum(sum(s["received"].values()) for s in stats)
        if delivered >= expected * n or time.time() > deadline:
            break
        await asyncio.sleep(0.5)
    drops: dict[str, int] = {}
    for s in stats:
        for reason, n in s.get("drops", {}).items():
            drops[reason] = drops.get(reason, 0) + n
    if drops:  # what the receivers refused (bounded path): for the log, not a figure
        print(f"gossip round of {groups} groups: drops {drops}", file=sys.stderr, flush=True)
    latencies = [x for s in stats for x in s["latencies"]]
    last = max(s["last_rx"] for s in stats)
    return {
        "groups": per_node * n,
        "delivered_frac": delivered / (per_node * n * (n - 1)),
        "groups_per_s": per_node * n / (last - t0) if last > t0 else 0.0,
        "p50_ms": 1000 * percentile(latencies, 0.5),
        "p99_ms": 1000 * percentile(latencies, 0.99),
        **{f"stage_{k}": v for k, v in latency_stages(stats).items()},  # bounded path only
    }


async def stream_round(procs: list[JsonProc], ready: list[dict[str, Any]], repeat: int) -> float:
    procs[1].send(cmd="send_blob", peer=ready[2]["peer_id"], repeat=repeat)
    seconds = (await next_event(procs[1], "blob", 300))["seconds"]
    return BLOB_BYTES / statistics.median(seconds) / 1e6


async def one_run(args: argparse.Namespace, arm: tuple[str, str]) -> dict[str, dict[str, float]]:
    """One swarm of `arm` = (path, isolation): the paced rounds, the capacity round and the stream round."""
    path, isolation = arm
    procs, ready = await start_swarm(args.nodes, isolation, path)
    batching = {"batch": args.batch, "batch_delay_ms": args.batch_delay_ms}
    try:  # paced rounds offer `rate` groups/s for `paced_s` seconds
        paced = await gossip_round(procs, int(args.rate * args.paced_s), rate=args.rate, **batching)
        paced_high = await gossip_round(procs, int(args.rate_high * args.paced_s), rate=args.rate_high, **batching)
        capacity = await gossip_round(procs, args.groups, rate=None, **batching)
        capacity["stream_mb_s"] = await stream_round(procs, ready, repeat=3)
        return {"paced": paced, "paced_high": paced_high, "capacity": capacity}
    finally:
        for proc in procs:
            await proc.close(quit_grace_s=15)


def median_run(runs: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def headline(run: dict[str, dict[str, float]]) -> dict[str, float]:
    """One run's reported figures: rate and stream from the capacity round, latencies from the paced one."""
    return {"groups_per_s": run["capacity"]["groups_per_s"], "p50_ms": run["paced"]["p50_ms"],
            "p99_ms": run["paced"]["p99_ms"], "stream_mb_s": run["capacity"]["stream_mb_s"]}


def paired_part(process: list[dict[str, dict[str, float]]], thread: list[dict[str, dict[str, float]]]
                ) -> dict[str, Any]:
    """gossip.json's paired fields: per key the median of the per-run ratios process / thread, and each run."""
    ours, base = [headline(r) for r in process], [headline(r) for r in thread]
    ratios = paired_ratios(ours, base, PAIRED_KEYS)
    return {"paired_ratio_vs_thread": {k: None if v is None else round(v, 4) for k, v in ratios.items()},
            "runs": paired_runs(ours, base, PAIRED_KEYS, names=ISOLATIONS)}


def path_figures(path: str, median: dict[str, dict[str, float]]) -> dict[str, Any]:
    """One path's gossip.json fields from the medians of its rounds (capacity, paced, paced_high)."""
    capacity, paced, high = median["capacity"], median["paced"], median["paced_high"]
    stages = {k.removeprefix("stage_"): v for k, v in high.items() if k.startswith("stage_")}  # bounded path only
    return {"path": path, "groups": int(capacity["groups"]), "delivered_frac": round(capacity["delivered_frac"], 4),
            "groups_per_s": round(capacity["groups_per_s"], 1), "p50_ms": round(paced["p50_ms"], 1),
            "p99_ms": round(paced["p99_ms"], 1), "stream_mb_s": round(capacity["stream_mb_s"], 1),
            "p99_ms_at_500": round(high["p99_ms"], 1), "delivered_frac_at_500": round(high["delivered_frac"], 4),
            **({"stages_at_500": stages} if stages else {})}


def gossip_result(args: argparse.Namespace, runs: dict[tuple[str, str], list[dict[str, dict[str, float]]]]
                  ) -> dict[str, Any]:
    """gossip.json: the bounded path's figures at the top (join's default), the flood path's under "flood" with
    its levers and its paired process/thread baseline."""
    summary = {arm: {part: median_run([r[part] for r in rs]) for part in ROUND_PARTS} for arm, rs in runs.items()}
    flood = {**path_figures("flood", summary[FLOOD]), "batch": args.batch, "batch_delay_ms": args.batch_delay_ms,
             **paired_part(runs[FLOOD], runs[FLOOD_THREAD])}
    return {"nodes": args.nodes, **path_figures("bounded", summary[BOUNDED]), "rate_high": args.rate_high,
            "round_ms": round(1000 * ROUND_S, 1), "flood": flood}


def load_average() -> float:
    return os.getloadavg()[0]


async def bench(args: argparse.Namespace, run: provenance.Run) -> None:
    runs: dict[tuple[str, str], list[dict[str, dict[str, float]]]] = {arm: [] for arm in ARMS}
    loads = [load_average()]
    for j in range(args.runs):
        for arm in round_order(ARMS, j):  # interleaved so machine load affects all alike
            runs[arm].append(await one_run(args, arm))
            loads.append(load_average())
    result = gossip_result(args, runs)
    out = Path(args.results_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gossip.json").write_text(json.dumps(provenance.stamp(result, run, args.runs), indent=2) + "\n")
    named = {"/".join(arm): rs for arm, rs in runs.items()}
    (out / "gossip_baseline.json").write_text(json.dumps(provenance.stamp(
        {"note": "medians of interleaved runs of each arm path/isolation. bounded = join's default path (digests, "
                 "pulls); flood = every group gossiped. process = ours (network host in a child process); thread = "
                 "baseline (host on a trio thread in the node process), flood path only. capacity: publish as fast "
                 f"as back-pressure allows; paced: {args.rate} groups/s offered in total. 1-min load average of the "
                 "machine before/after each run in load_avg.", "load_avg": loads,
         "median": {name: {part: median_run([r[part] for r in rs]) for part in ROUND_PARTS}
                    for name, rs in named.items()}, "runs": named},
        run, args.runs), indent=2) + "\n")
    print(summary_line(args, result, loads))


def summary_line(args: argparse.Namespace, result: dict[str, Any], loads: list[float]) -> str:
    flood, paired = result["flood"], result["flood"]["paired_ratio_vs_thread"]
    thread = {k: statistics.median(r[k]["thread"] for r in flood["runs"]) for k in PAIRED_KEYS}
    return (f"gossip: {args.nodes} nodes, {result['groups']} groups. bounded (join's default): delivered "
            f"{result['delivered_frac']:.3f} at {result['groups_per_s']:.0f} groups/s; at {args.rate:.0f} groups/s "
            f"offered p50 {result['p50_ms']:.0f} ms p99 {result['p99_ms']:.0f} ms, at {args.rate_high:.0f} p99 "
            f"{result['p99_ms_at_500']:.0f} ms; stream {result['stream_mb_s']:.0f} MB/s | flood: delivered "
            f"{flood['delivered_frac']:.3f} at {flood['groups_per_s']:.0f} groups/s; p50 {flood['p50_ms']:.0f} ms "
            f"p99 {flood['p99_ms']:.0f} ms, at {args.rate_high:.0f} p99 {flood['p99_ms_at_500']:.0f} ms; "
            f"{args.batch} groups/message at most | flood thread baseline: {thread['groups_per_s']:.0f} groups/s, "
            f"p50 {thread['p50_ms']:.0f} ms, stream {thread['stream_mb_s']:.0f} MB/s; process/thread paired: "
            f"groups/s {ratio_text(paired['groups_per_s'])}, p50 {ratio_text(paired['p50_ms'])}, stream "
            f"{ratio_text(paired['stream_mb_s'])} (medians of {args.runs}, load avg {statistics.median(loads):.1f} "
            f"on {os.cpu_count()} cores)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--groups", type=int, default=12000,
                        help="groups published by all nodes together in the capacity round")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--rate", type=float, default=100.0, help="offered groups/s (all nodes) for latency")
    parser.add_argument("--rate-high", type=float, default=500.0, help="offered groups/s of the p99_ms_at_500 round")
    parser.add_argument("--paced-s", type=float, default=12.0, help="seconds each paced round offers groups")
    parser.add_argument("--batch", type=int, default=16,
                        help="lever: groups per message at most (16: join's default; 1: one message per group)")
    parser.add_argument("--batch-delay-ms", type=float, default=50.0, help="lever: a partial batch waits at most this")
    parser.add_argument("--results-dir", default=str(RESULTS),
                        help="where gossip.json goes (a spot check: elsewhere)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--isolation", default="process", help=argparse.SUPPRESS)
    parser.add_argument("--path", default="flood", choices=sorted(PATHS), help=argparse.SUPPRESS)
    add_loaded_flag(parser)
    args = parser.parse_args()
    if args.worker:
        asyncio.run(worker(args.isolation, args.path))
    else:
        asyncio.run(bench(args, provenance.begin(timed=True, loaded=args.loaded)))


if __name__ == "__main__":
    main()
