"""Pipelined broadcast vs a star from the learner: time until all N receivers hold a policy delta.

`python -m bench.broadcast` writes bench/results/broadcast.json:
  {"chunk_bytes", "bandwidth_mb_s", "simulated": [{"n", "size_mb", "pipelined_s", "star_s", "bound_s"}],
   "libp2p": [same fields + paired ones, below], plus "schedule", "sim_latency_ms", "runs", "load_avg"}
- MB = 2^20 bytes here, so a 64 MB delta is 64 chunks of 1 MiB. B = bandwidth_mb_s is every node's uplink and
  downlink. bound_s = M/B, the physical floor: each receiver must take in M bytes through a downlink of B.
- pipelined = the relay schedule `--schedule` (default stripe:2, protocol.relay); star = every receiver pulls the
  whole payload from the learner (schedule "star", same code).
- simulated: simulations.broadcast_sim, a discrete-event virtual clock (wall time on 2 cores would measure CPU
  load, not the network): each node's uplink and downlink capacity B shared max-min fairly across all of its
  streams, `--latency-ms` per message, N receivers in {2, 4, 8, 16, 32}, M in {8, 64} MB.
- libp2p: a learner and N receivers, each an OS process with a LibP2PTransport (its network host a child process)
  on 127.0.0.1, fully connected, running swarm_node.policy_sync.broadcast.PolicyBroadcaster with app-level shaping
  (swarm_node.transport.shaping: B up and B down per node), for the (N, M) pairs of `--libp2p-cases`. Time from the
  learner's publish call (announce on gossip included) to the last receiver's verified payload, by the shared
  wall clock; medians of `--runs` runs, pipelined and star interleaved within each run (who goes first
  alternates). Each libp2p row adds `paired_ratio_pipelined_over_star` (the median of the per-run ratios,
  `bench/paired.py`) and `runs[j]` {pipelined_s, star_s, ratio}. The default B (4 MB/s) is low enough that
  the processes' CPU does not slow the transfers on a small machine (docs/BENCHMARKS.md).
It reports times, so it refuses to start when the 1-minute load average is above 0.5 unless --loaded.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench import provenance
from bench.child import emit, mesh_commands, serve
from bench.load_guard import add_loaded_flag
from bench.paired import paired_ratio_or_none, ratio_text, round_order
from bench.procs import JsonProc, event_is

RESULTS = Path(__file__).resolve().parent / "results"
MB = 1 << 20


# ------------------------------------------------------------------------------------------- the node process
async def node_main(bandwidth: float, chunk_bytes: int) -> None:
    from protocol.messages import TOPIC_POLICY
    from swarm_node.identity import generate
    from swarm_node.policy_sync.broadcast import PolicyBroadcaster
    from swarm_node.transport.libp2p.ipc import HostSettings
    from swarm_node.transport.libp2p.launch import LibP2PConfig
    from swarm_node.transport.libp2p.transport import LibP2PTransport
    from swarm_node.transport.shaping import Shaper

    transport = LibP2PTransport(generate(), LibP2PConfig(host=HostSettings(listen=("/ip4/127.0.0.1/tcp/0",))))
    node = PolicyBroadcaster(transport, chunk_bytes=chunk_bytes, shaper=Shaper(bandwidth, bandwidth), keep=4)
    await node.start()
    await transport.start()
    emit(event="ready", peer_id=transport.peer_id, addr=transport.listen_addrs()[0])

    async def report() -> None:
        while True:
            announce, payload = await node.completed.get()
            emit(event="received", version=announce.version, t=time.time(),
                 ok=hashlib.sha256(payload).digest() == announce.sha256)

    async def publish(cmd: dict[str, Any]) -> dict[str, Any]:
        payload = os.urandom(cmd["size"])
        t0 = time.time()
        await node.publish(transport.peer_id, cmd["version"], cmd["version"] - 1, "bench", payload,
                           "sha256:bench", cmd["receivers"], schedule=cmd["schedule"])
        return {"event": "published", "version": cmd["version"], "t0": t0}

    async def stats(_cmd: dict[str, Any]) -> dict[str, Any]:
        return {"event": "stats", "bad_chunks": node.stats.bad_chunks, "peer_failures": node.stats.peer_failures}

    reporter = asyncio.ensure_future(report())
    await serve({**mesh_commands(transport, TOPIC_POLICY), "publish": publish, "stats": stats})
    reporter.cancel()
    await node.stop()
    await transport.stop()


# ------------------------------------------------------------------------------------------- the orchestrator
async def spawn(bandwidth: float, chunk_bytes: int) -> JsonProc:
    return await JsonProc.start("bench.broadcast", "--node", "--bandwidth-mb-s", str(bandwidth / MB),
                                "--chunk-bytes", str(chunk_bytes), name="node")


def parse_case(text: str) -> tuple[int, float]:
    """"NxMB", e.g. "4x8": N receivers, an M MB payload."""
    n, _, size = text.partition("x")
    return int(n), float(size)


async def libp2p_part(args: argparse.Namespace, bandwidth: float) -> list[dict[str, Any]]:
    cases = [parse_case(c) for c in args.libp2p_cases]
    receivers_max = max(n for n, _ in cases)
    procs = [await spawn(bandwidth, args.chunk_bytes) for _ in range(receivers_max + 1)]
    rows: list[dict[str, Any]] = []
    try:
        ready = [await p.expect(event_is("ready"), 120) for p in procs]
        for i, proc in enumerate(procs[1:], start=1):
            proc.send(cmd="connect", addrs=[r["addr"] for r in ready[:i]])
            await proc.expect(event_is("connected"), 120)
        for proc in procs:
            proc.send(cmd="wait_subscribed", n=len(procs) - 1)
            await proc.expect(event_is("subscribed"), 120)
        await asyncio.sleep(2.0)  # heartbeats: the gossip mesh grafts everywhere
        learner, workers = procs[0], procs[1:]
        version = 0
        for n, size_mb in cases:
            times: dict[str, list[float]] = {"pipelined": [], "star": []}
            for j in range(args.runs):
                for kind, schedule in round_order((("pipelined", args.schedule), ("star", "star")), j):
                    version += 1
                    learner.send(cmd="publish", version=version, size=int(size_mb * MB), schedule=schedule,
                                 receivers=[r["peer_id"] for r in ready[1:n + 1]])
                    t0 = (await learner.expect(event_is("published", version=version), 120))["t0"]
                    done = [await w.expect(event_is("received", version=version), 300) for w in workers[:n]]
                    assert all(d["ok"] for d in done), done
                    times[kind].append(max(d["t"] for d in done) - t0)
                    print(f"  libp2p n={n} {size_mb:g} MB {kind}: {times[kind][-1]:.2f} s", file=sys.stderr)
                    await asyncio.sleep(0.3)
            rows.append({**row(n, size_mb, statistics.median(times["pipelined"]), statistics.median(times["star"]),
                               bandwidth), **paired_star(times["pipelined"], times["star"])})
    finally:
        for proc in procs:
            await proc.close(quit_grace_s=20)
    return rows


def row(n: int, size_mb: float, pipelined: float, star: float, bandwidth: float) -> dict[str, float]:
    return {"n": n, "size_mb": size_mb, "pipelined_s": round(pipelined, 3), "star_s": round(star, 3),
            "bound_s": round(size_mb * MB / bandwidth, 3)}


def paired_star(pipelined: list[float], star: list[float]) -> dict[str, Any]:
    """A libp2p row's paired fields: the median of the per-run ratios pipelined / star, and each run."""
    ratio = paired_ratio_or_none(pipelined, star)
    return {"paired_ratio_pipelined_over_star": None if ratio is None else round(ratio, 4),
            "runs": [{"pipelined_s": round(p, 3), "star_s": round(s, 3),
                      "ratio": None if (r := paired_ratio_or_none([p], [s])) is None else round(r, 4)}
                     for p, s in zip(pipelined, star, strict=True)]}


def simulated_part(args: argparse.Namespace, bandwidth: float) -> list[dict[str, float]]:
    from simulations.broadcast_sim import simulate

    rows = []
    for size_mb in (8.0, 64.0):
        for n in (2, 4, 8, 16, 32):
            kw: dict[str, Any] = dict(chunk_bytes=args.chunk_bytes, latency_s=args.latency_ms / 1000)
            pipelined = simulate(args.schedule, n, int(size_mb * MB), bandwidth, **kw)
            star = simulate("star", n, int(size_mb * MB), bandwidth, **kw)
            assert not pipelined.failed and not star.failed
            rows.append(row(n, size_mb, pipelined.finish_s, star.finish_s, bandwidth))
    return rows


async def bench(args: argparse.Namespace, run: provenance.Run) -> None:
    bandwidth = args.bandwidth_mb_s * MB
    loads = [os.getloadavg()[0]]
    simulated = simulated_part(args, bandwidth)
    libp2p = await libp2p_part(args, bandwidth) if args.libp2p_cases else []
    loads.append(os.getloadavg()[0])
    result = {"chunk_bytes": args.chunk_bytes, "bandwidth_mb_s": args.bandwidth_mb_s, "simulated": simulated,
              "libp2p": libp2p, "schedule": args.schedule, "sim_latency_ms": args.latency_ms, "runs": args.runs,
              "load_avg": loads}
    result = provenance.stamp(result, run, runs=args.runs)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    top = next(r for r in simulated if r["n"] == 32 and r["size_mb"] == 64)
    line = (f"broadcast ({args.schedule}, B = {args.bandwidth_mb_s:g} MB/s, 1 MiB chunks): simulated N=32 64 MB: "
            f"pipelined {top['pipelined_s']:.2f} s = {top['pipelined_s'] / top['bound_s']:.2f}x bound "
            f"{top['bound_s']:.2f} s, star {top['star_s']:.1f} s")
    for r in libp2p:
        line += (f" | libp2p N={r['n']} {r['size_mb']:g} MB: pipelined {r['pipelined_s']:.2f} s "
                 f"({r['pipelined_s'] / r['bound_s']:.2f}x), star {r['star_s']:.2f} s "
                 f"({r['star_s'] / r['bound_s']:.2f}x), pipelined/star "
                 f"{ratio_text(r['paired_ratio_pipelined_over_star'])} paired")
    print(line + f" (medians of {args.runs}, load avg {statistics.median(loads):.1f} on {os.cpu_count()} cores)")


def main() -> None:
    from protocol.relay import DEFAULT_SCHEDULE

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--node", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--bandwidth-mb-s", type=float, default=4.0)
    parser.add_argument("--chunk-bytes", type=int, default=MB)
    parser.add_argument("--schedule", default=DEFAULT_SCHEDULE)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS / "broadcast.json")
    parser.add_argument("--libp2p-cases", nargs="*", default=["2x8", "4x8", "6x8", "4x16", "6x16"],
                        help="NxMB: N receivers (N + 1 processes, each with a host child), an M MB delta")
    add_loaded_flag(parser)
    args = parser.parse_args()
    if args.node:
        asyncio.run(node_main(args.bandwidth_mb_s * MB, args.chunk_bytes))
    else:
        asyncio.run(bench(args, provenance.begin(timed=True, loaded=args.loaded)))


if __name__ == "__main__":
    main()
