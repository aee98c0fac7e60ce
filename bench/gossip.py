"""Gossip and stream throughput of the libp2p transport: 4 node processes on 127.0.0.1, realistic RolloutGroups.

`python -m bench.gossip` writes bench/results/gossip.json:
  {"nodes", "groups", "delivered_frac", "groups_per_s", "p50_ms", "p99_ms", "stream_mb_s", "p99_ms_at_500",
   "delivered_frac_at_500", "batch", "batch_delay_ms", "rate_high"}
- Each node is an OS process with a LibP2PTransport (network host in its own child process, the default) and the
  protocol's gossip validator; the nodes form a full mesh. Every node publishes its share of `groups` groups
  (8 completions x 64 tokens, ~5 KB each), starting at a common time, as RolloutBatches of at most `--batch` groups,
  a partial batch sent within `--batch-delay-ms` (bench/gossip_groups.py; the defaults, 16 and 50 ms, are join's
  path, `--batch 1` the path before batching). Every count is of groups, not messages.
- groups_per_s, delivered_frac (capacity round): nodes publish as fast as the transport's back-pressure lets them;
  groups_per_s = groups / (last delivery - start); delivered_frac = deliveries / (groups x (nodes - 1)).
- p50_ms, p99_ms (paced round): publish-to-delivery latency over all deliveries while the nodes together offer
  `--rate` groups/s (100) for `--paced-s` seconds, i.e. the latency at that load rather than queueing at saturation;
  p99_ms_at_500 and delivered_frac_at_500: the same at `--rate-high` (500) groups/s.
- stream_mb_s: a 20 MiB blob node 1 -> node 2 over a stream protocol, until the receiver's ack (MB = 1e6 bytes).
- Baseline, same run: the same workload with isolation="thread" (the network host on a trio thread inside the
  node process). Medians of `--runs` runs, the two isolations interleaved within each run (who goes first
  alternates); both, per run, with the machine's load average, go to gossip_baseline.json.
- Paired, in gossip.json: `paired_ratio_vs_thread` {groups_per_s, p50_ms, p99_ms, stream_mb_s}, each the median
  of the per-run ratios process / thread (`bench/paired.py`), and `runs[j]` each run's values of both and its ratios.
`python -m bench.gossip_arch` measures what the network layer costs a training loop in the same process
(steps/s of a torch + Python loop while receiving 100 groups/s) for both isolations: gossip_arch.json, with
`paired_steps_per_s_vs_none` {process, thread}: the median of each run's ratio to the same run's loop without a
network, and each sample's own `steps_per_s_vs_none`.
It reports rates and times, so it refuses to start when the 1-minute load average is above 0.5 unless --loaded.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import random
import statistics
import time
from pathlib import Path
from typing import Any

from bench import provenance
from bench.child import emit, mesh_commands, serve
from bench.load_guard import add_loaded_flag
from bench.paired import paired_ratios, paired_runs, ratio_text, round_order
from bench.procs import JsonProc, event_is

RESULTS = Path(__file__).resolve().parent / "results"
ISOLATIONS = ("process", "thread")  # ours, the baseline
PAIRED_KEYS = ("groups_per_s", "p50_ms", "p99_ms", "stream_mb_s")
STREAM_PROTOCOL = "/swarm-node/bench-blob/1.0.0"
BLOB_BYTES = 20 << 20


# ------------------------------------------------------------------------------------------- the node process
def rollout_message(peer_id: str, index: int) -> bytes:
    from protocol.codec import encode
    from protocol.messages import RolloutBatch

    return encode(RolloutBatch((rollout_group(peer_id, index),)))


def rollout_group(peer_id: str, index: int) -> Any:
    from protocol.messages import RolloutGroup, TaskRefWire

    return RolloutGroup(
        group_id=os.urandom(16), policy_id=peer_id, policy_version=index, task=TaskRefWire("chain_sum", "{}", 0, index),
        completions=sample_completions(index % COMPLETION_VARIANTS), tokenizer_hash="char-v1", model_family="qwen2",
        created_at=time.time())


COMPLETION_VARIANTS = 256  # a node has its completions in hand when it publishes: drawing them is not timed


@functools.lru_cache(maxsize=COMPLETION_VARIANTS)
def sample_completions(seed: int) -> tuple[Any, ...]:
    from protocol.messages import CompletionWire

    rng = random.Random(seed)
    return tuple(CompletionWire(tuple(rng.randrange(64) for _ in range(64)), "12+30=42 " * 7,
                                tuple(-rng.random() for _ in range(64)), 1.0) for _ in range(8))


def make_validator(accepted: Any = None) -> Any:
    """The node's rollout validator; with `accepted` (an AcceptedMessages), what it accepts is kept for delivery."""
    from protocol.limits import Limits
    from protocol.messages import TOPIC_ROLLOUTS
    from protocol.validation import AcceptPolicy, ReplayGuard, validate_gossip
    from swarm_node.transport.base import ValidationResult

    limits = Limits(vocab_size=64)
    policy = AcceptPolicy(tasks=frozenset({("chain_sum", "{}")}), max_index=1 << 30)
    replay = ReplayGuard(limits.max_age_s)

    def validate(signer: str, data: bytes) -> ValidationResult:
        result = validate_gossip(TOPIC_ROLLOUTS, data, signer, limits=limits, policy=policy, now=time.time(),
                                 replay=replay)
        if accepted is not None and result.message is not None:
            accepted.remember(data, result.message)
        return ValidationResult[result.verdict.name]

    return validate


async def worker(isolation: str) -> None:
    from bench.gossip_groups import delivered_groups, publish_groups
    from protocol.limits import Limits
    from protocol.messages import TOPIC_ROLLOUTS
    from swarm_node.identity import generate
    from swarm_node.sharing.accepted import AcceptedMessages
    from swarm_node.sharing.batching import BatchPolicy
    from swarm_node.transport.base import Delivery
    from swarm_node.transport.libp2p.ipc import HostSettings
    from swarm_node.transport.libp2p.launch import LibP2PConfig
    from swarm_node.transport.libp2p.transport import LibP2PTransport

    config = LibP2PConfig(host=HostSettings(listen=("/ip4/127.0.0.1/tcp/0",)), isolation=isolation)
    transport = LibP2PTransport(generate(), config)
    latencies: list[float] = []
    received: dict[str, int] = {}
    last_rx = [0.0]
    limits = Limits(vocab_size=64)

    def on_delivery(delivery: Delivery) -> None:
        now = time.time()
        groups, group_latencies = delivered_groups(delivery.data, limits, now, accepted)  # groups, not messages
        latencies.extend(group_latencies)
        received[delivery.from_peer] = received.get(delivery.from_peer, 0) + groups
        last_rx[0] = now

    async def blob_sink(stream: Any) -> None:
        got = 0
        while chunk := await stream.read(1 << 20):
            got += len(chunk)
        await stream.write(got.to_bytes(8, "big"))
        await stream.close()

    accepted = AcceptedMessages()  # as the node's exchange does: a delivery is not decoded twice
    transport.set_validator(TOPIC_ROLLOUTS, make_validator(accepted))
    await transport.subscribe(TOPIC_ROLLOUTS, on_delivery)
    await transport.serve_stream(STREAM_PROTOCOL, blob_sink)
    await transport.start()
    loop = asyncio.get_running_loop()
    trainer_steps: list[float] = []

    async def go(cmd: dict[str, Any]) -> dict[str, Any]:
        latencies.clear()  # each round is measured on its own
        received.clear()
        last_rx[0] = 0.0
        await asyncio.sleep(max(0.0, cmd["t0"] - time.time()))
        policy = BatchPolicy(cmd.get("batch", 1), cmd.get("batch_delay_ms", 50) / 1000)
        errors = await publish_groups(lambda data: transport.publish(TOPIC_ROLLOUTS, data),
                                      lambda i: rollout_group(transport.peer_id, i), cmd["count"], cmd["t0"],
                                      cmd.get("rate"), policy)
        return {"event": "done", "t_end": time.time(), "errors": errors}

    async def stats(_cmd: dict[str, Any]) -> dict[str, Any]:
        return {"event": "stats", "received": received, "latencies": latencies, "last_rx": last_rx[0],
                "counters": await transport.host_counters(), "trainer_steps": trainer_steps}

    async def send_blob(cmd: dict[str, Any]) -> dict[str, Any]:
        blob = os.urandom(BLOB_BYTES)
        times = []
        for _ in range(cmd["repeat"]):
            t0 = time.perf_counter()
            stream = await transport.open_stream(cmd["peer"], STREAM_PROTOCOL)
            await stream.write(blob)
            await stream.close()
            ack = int.from_bytes(await stream.read_exactly(8), "big")
            times.append(time.perf_counter() - t0)
            assert ack == BLOB_BYTES, ack
        return {"event": "blob", "seconds": times}

    async def train(cmd: dict[str, Any]) -> dict[str, Any]:
        # A stand-in training loop on the main thread: torch matmuls (release the GIL) plus Python work
        # (hold it), the mix of a small-model RL step. Gossip keeps arriving on the loop meanwhile.
        trainer_steps[:] = await loop.run_in_executor(None, train_for, cmd["seconds"])
        return {"event": "trained", "steps": len(trainer_steps)}

    emit(event="ready", peer_id=transport.peer_id, addr=transport.listen_addrs()[0])
    await serve({**mesh_commands(transport, TOPIC_ROLLOUTS), "go": go, "stats": stats, "send_blob": send_blob,
                 "train": train})
    await transport.stop()


def train_for(seconds: float) -> list[float]:
    import torch

    torch.set_num_threads(1)
    weight = torch.randn(256, 256)
    x = torch.randn(64, 256)
    steps: list[float] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        for _ in range(20):
            x = torch.tanh(x @ weight)
        _ = sum(i * i for i in range(20_000))  # Python-side work: sampling bookkeeping, batching, logging
        steps.append(time.perf_counter() - t0)
    return steps


# ------------------------------------------------------------------------------------------- the orchestrator
async def spawn(isolation: str) -> JsonProc:
    return await JsonProc.start("bench.gossip", "--worker", "--isolation", isolation, name=f"{isolation} node")


async def next_event(proc: JsonProc, event: str, timeout: float = 120.0) -> dict[str, Any]:
    """The node's next `event` (each "done" or "stats" answers one command, so none is read twice)."""
    return await proc.take(event_is(event), timeout)


async def start_swarm(nodes: int, isolation: str) -> tuple[list[JsonProc], list[dict[str, Any]]]:
    procs = [await spawn(isolation) for _ in range(nodes)]
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
    latencies = sorted(x for s in stats for x in s["latencies"])
    last = max(s["last_rx"] for s in stats)
    return {
        "groups": per_node * n,
        "delivered_frac": delivered / (per_node * n * (n - 1)),
        "groups_per_s": per_node * n / (last - t0) if last > t0 else 0.0,
        "p50_ms": 1000 * latencies[len(latencies) // 2] if latencies else float("nan"),
        "p99_ms": 1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))] if latencies else float("nan"),
    }


async def stream_round(procs: list[JsonProc], ready: list[dict[str, Any]], repeat: int) -> float:
    procs[1].send(cmd="send_blob", peer=ready[2]["peer_id"], repeat=repeat)
    seconds = (await next_event(procs[1], "blob", 300))["seconds"]
    return BLOB_BYTES / statistics.median(seconds) / 1e6


async def one_run(args: argparse.Namespace, isolation: str) -> dict[str, dict[str, float]]:
    procs, ready = await start_swarm(args.nodes, isolation)
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


def load_average() -> float:
    return os.getloadavg()[0]


async def bench(args: argparse.Namespace, run: provenance.Run) -> None:
    runs: dict[str, list[dict[str, dict[str, float]]]] = {"process": [], "thread": []}
    loads = [load_average()]
    for j in range(args.runs):
        for isolation in round_order(ISOLATIONS, j):  # interleaved so machine load affects both alike
            runs[isolation].append(await one_run(args, isolation))
            loads.append(load_average())
    summary = {iso: {part: median_run([r[part] for r in rs]) for part in ("capacity", "paced", "paced_high")}
               for iso, rs in runs.items()}
    ours, base = summary["process"], summary["thread"]
    result = {"nodes": args.nodes, "groups": int(ours["capacity"]["groups"]),
              "delivered_frac": round(ours["capacity"]["delivered_frac"], 4),
              "groups_per_s": round(ours["capacity"]["groups_per_s"], 1),
              "p50_ms": round(ours["paced"]["p50_ms"], 1), "p99_ms": round(ours["paced"]["p99_ms"], 1),
              "stream_mb_s": round(ours["capacity"]["stream_mb_s"], 1),
              "p99_ms_at_500": round(ours["paced_high"]["p99_ms"], 1),
              "delivered_frac_at_500": round(ours["paced_high"]["delivered_frac"], 4),
              "batch": args.batch, "batch_delay_ms": args.batch_delay_ms, "rate_high": args.rate_high,
              **paired_part(runs["process"], runs["thread"])}
    out = Path(args.results_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gossip.json").write_text(json.dumps(provenance.stamp(result, run, args.runs), indent=2) + "\n")
    (out / "gossip_baseline.json").write_text(json.dumps(provenance.stamp(
        {"note": "medians of interleaved runs. process = ours (network host in a child process); thread = baseline "
                 "(host on a trio thread in the node process). capacity: publish as fast as back-pressure allows; "
                 f"paced: {args.rate} groups/s offered in total. 1-min load average of the machine before/after "
                 "each run in load_avg.", "load_avg": loads, "median": summary, "runs": runs},
        run, args.runs), indent=2) + "\n")
    print(f"gossip: {args.nodes} nodes, {result['groups']} groups: delivered {result['delivered_frac']:.3f} at "
          f"{result['groups_per_s']:.0f} groups/s; at {args.rate:.0f} groups/s offered p50 {result['p50_ms']:.0f} ms "
          f"p99 {result['p99_ms']:.0f} ms, at {args.rate_high:.0f} p99 {result['p99_ms_at_500']:.0f} ms; "
          f"{args.batch} groups/message at most; stream {result['stream_mb_s']:.0f} MB/s | thread baseline: "
          f"{base['capacity']['groups_per_s']:.0f} groups/s, p50 {base['paced']['p50_ms']:.0f} ms, stream "
          f"{base['capacity']['stream_mb_s']:.0f} MB/s; process/thread paired: groups/s "
          f"{ratio_text(result['paired_ratio_vs_thread']['groups_per_s'])}, p50 "
          f"{ratio_text(result['paired_ratio_vs_thread']['p50_ms'])}, stream "
          f"{ratio_text(result['paired_ratio_vs_thread']['stream_mb_s'])} (medians of {args.runs}, load avg "
          f"{statistics.median(loads):.1f} on {os.cpu_count()} cores)")


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
    add_loaded_flag(parser)
    args = parser.parse_args()
    if args.worker:
        asyncio.run(worker(args.isolation))
    else:
        asyncio.run(bench(args, provenance.begin(timed=True, loaded=args.loaded)))


if __name__ == "__main__":
    main()
