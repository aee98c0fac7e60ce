"""Real against simulated bounded fan-in at N = 16: stand-in processes over libp2p on loopback (issue 32 item 4).

`python -m bench.fanin_real` starts `--nodes` gossip-only stand-ins (bench/fanin_standin.py: the node's
FaninExchange over the real libp2p transport, I = 4 groups of 5 KB per round, signal with probability 0.6, J = 4,
no model), wires them as a random `--connect`-regular graph (simulations.scale_model.regular_graph: each node
dials its higher-numbered neighbours), lets the meshes form for `--settle-s`, runs `--warmup` + `--rounds` rounds
of `--round-s` and runs the simulator (simulations.scale_sim, design "bounded") with the same N, rounds, round
length, publish spread and gossip degree. It merges into bench/results/swarm_scale.json (other fields kept):
  "real_vs_sim_n16": {"inbound_msgs_ratio": real/sim, "inbound_kb_ratio": real/sim, "real": {...}, "sim": {...},
   "setup": {...}, "rss_mb_total": float}
- Real per-node figures (`real_figures`): each node's mean over its measured rounds (flush to flush), then the
  median over nodes: inbound messages = gossipsub RPCs read (data, control, subscriptions) + pull/push frames read;
  inbound KB = every byte read from its TCP connections (Noise, yamux, identify and all) / 1024. The breakdown
  (RPC and frame bytes, the exchange's own RoundStats counts, usable groups) is kept beside them. Each node's
  rounds go to LOGS/rounds.json; `--from-rounds` compares such a file again without starting anything.
- The simulator's inbound messages by kind (`Record.inbound_breakdown`, mean over its seeds) go to "sim_breakdown",
  to set beside the real breakdown: digest_copy ~ publish_msgs, ihave ~ rpc_ihave, control ~ GRAFT/PRUNE/
  subscriptions, pull_request + group + refusal + push ~ frames; "dial" (handshake messages of new
  connections) has no real counterpart in the messages (the real count is RPCs and frames; its bytes are counted).
- "real_router" (`router_summary`): the stand-ins' digest mesh sizes and gossipsub heartbeat intervals over the
  measured rounds (what the simulator's shard mesh and IHAVE schedule assume).
- Every child is ended on exit, on an error and on Ctrl-C or SIGTERM (terminate, then kill after 5 s).
Not a timing measurement (message and byte counts), but 16 py-libp2p hosts load 2 cores: rounds are 10 s so that
every flush finishes well within its round.
"""

from __future__ import annotations

import argparse
import atexit
import dataclasses
import json
import random
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from simulations.scale_bounded import SHARD_GOSSIP, run_bounded
from simulations.scale_model import KB, GossipParams, ScaleSetup, regular_graph

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parents[1]


def real_figures(rounds_by_node: Sequence[Sequence[dict[str, Any]]], warmup: int) -> dict[str, float]:
    """Per-node means over the measured rounds (index >= warmup), then medians over nodes (see the contract)."""
    def median_of(per_round: Any) -> float:
        means = [statistics.fmean(per_round(r) for r in rounds[warmup:]) for rounds in rounds_by_node]
        return float(statistics.median(means))

    return {
        "inbound_msgs_per_round": median_of(lambda r: r["rpcs"] + r["frames"]),
        "inbound_kb_per_round": median_of(lambda r: r["wire_bytes"] / KB),
        "rpcs_per_round": median_of(lambda r: r["rpcs"]),
        "frames_per_round": median_of(lambda r: r["frames"]),
        "rpc_kb_per_round": median_of(lambda r: r["rpc_bytes"] / KB),
        "frame_kb_per_round": median_of(lambda r: r["frame_bytes"] / KB),
        **{f"{kind}_per_round": median_of(lambda r, kind=kind: r.get(kind, 0))
           for kind in ("publish_msgs", "rpc_publish", "rpc_ihave", "rpc_iwant", "rpc_graft", "rpc_prune",
                        "rpc_idontwant", "rpc_subscriptions", "pulls_answered", "pulls_failed",
                        "pulls_timed_out", "groups_refused")},
        "exchange_msgs_per_round": median_of(lambda r: r["inbound_messages"]),
        "exchange_kb_per_round": median_of(lambda r: r["inbound_bytes"] / KB),
        "usable_per_round": median_of(lambda r: r["usable"]),
        "pulls_sent_per_round": median_of(lambda r: r["pulls_sent"]),
        "pushes_sent_per_round": median_of(lambda r: r["pushes_sent"]),
    }


def router_summary(rounds_by_node: Sequence[Sequence[dict[str, Any]]], warmup: int) -> dict[str, Any]:
    """The stand-ins' gossipsub state over the measured rounds (rounds that carry "router"): how many (node, round)
    pairs had each digest mesh size, their mean, and each heartbeat interval seen (seconds -> pairs)."""
    states = [r["router"] for rounds in rounds_by_node for r in rounds[warmup:] if r.get("router")]
    sizes = [size for state in states for size in state["digest_mesh"]]
    return {"digest_mesh_sizes": {str(k): v for k, v in sorted(Counter(sizes).items())},
            "digest_mesh_mean": round(statistics.fmean(sizes), 3) if sizes else None,
            "heartbeat_s": {str(k): v for k, v in sorted(Counter(s["heartbeat_s"] for s in states).items())}}


def compare(real: dict[str, float], sim: dict[str, float]) -> dict[str, Any]:
    return {"inbound_msgs_ratio": round(real["inbound_msgs_per_round"] / sim["inbound_msgs_per_round"], 4),
            "inbound_kb_ratio": round(real["inbound_kb_per_round"] / sim["inbound_kb_per_round"], 4),
            "real": {k: round(v, 3) for k, v in real.items()},
            "sim": {k: round(v, 3) for k, v in sim.items()}}


def mean_breakdown(breakdowns: Sequence[dict[str, float]]) -> dict[str, float]:
    """Each kind's mean over the runs (a kind a run did not see counts 0 there), rounded to 3 places."""
    kinds = sorted(set().union(*breakdowns)) if breakdowns else []
    return {k: round(statistics.fmean(b.get(k, 0.0) for b in breakdowns), 3) for k in kinds}


class Children:
    """The stand-in processes; `end()` terminates each (by its pid), then kills what is left after 5 s."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[str]] = []

    def start(self, args: list[str], log: Path) -> subprocess.Popen[str]:
        with open(log, "w") as err:
            proc = subprocess.Popen([sys.executable, "-m", "bench.fanin_standin", *args], cwd=ROOT, text=True,
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err)
        self.procs.append(proc)
        return proc

    def end(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + 5
        for proc in self.procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def run_real(args: argparse.Namespace, logs: Path) -> tuple[list[list[dict[str, Any]]], float]:
    """(each node's rounds, total peak RSS in MB)."""
    children = Children()
    atexit.register(children.end)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: sys.exit(130))  # SystemExit runs the finally below and atexit
    try:
        procs = [children.start(["--index", str(i), "--nodes", str(args.nodes), "--seed", str(args.seed)],
                                logs / f"standin-{i}.log") for i in range(args.nodes)]
        hello = [json.loads(_line(p, logs / f"standin-{i}.log")) for i, p in enumerate(procs)]
        graph = regular_graph(range(args.nodes), args.connect, random.Random(args.seed))
        start_at = time.time() + args.settle_s
        for i, proc in enumerate(procs):
            plan = {"dial": [hello[j]["addr"] for j in sorted(graph[i]) if j > i], "start_at": start_at,
                    "round_s": args.round_s, "publish_spread_s": args.publish_spread_s,
                    "rounds": args.warmup + args.rounds}
            assert proc.stdin is not None
            proc.stdin.write(json.dumps(plan) + "\n")
            proc.stdin.flush()
        results = [json.loads(_line(p, logs / f"standin-{i}.log")) for i, p in enumerate(procs)]
        for proc in procs:
            proc.wait(timeout=60)
        return [r["rounds"] for r in results], sum(r["rss_kb"] for r in results) / 1024
    finally:
        children.end()


def _line(proc: subprocess.Popen[str], log: Path) -> str:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"stand-in {proc.pid} ended early:\n{log.read_text()[-3000:]}")
    return line


def sim_setup(args: argparse.Namespace) -> ScaleSetup:
    return ScaleSetup(n=args.nodes, rounds=args.warmup + args.rounds, warmup=args.warmup, round_s=args.round_s,
                      publish_spread_s=args.publish_spread_s, seed=args.seed)


def bench(args: argparse.Namespace) -> dict[str, Any]:
    logs = args.logs
    logs.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    if args.from_rounds:  # an earlier run's rounds, compared again (after a change to the simulator)
        rounds, rss_mb = (saved := json.loads(args.from_rounds.read_text()))["rounds"], saved["rss_mb_total"]
    else:
        rounds, rss_mb = run_real(args, logs)
        (logs / "rounds.json").write_text(json.dumps({"rounds": rounds, "rss_mb_total": rss_mb}))
    wall_s = time.monotonic() - t0
    records = [run_bounded(dataclasses.replace(sim_setup(args), seed=s)) for s in range(args.sim_seeds)]
    sims = [r.metrics() for r in records]
    sim = {k: statistics.fmean(f[k] for f in sims) for k in ("inbound_msgs_per_round", "inbound_kb_per_round",
                                                              "rounds_with_J_frac", "pulled_by_ge1_frac")}
    out = compare(real_figures(rounds, args.warmup), sim)
    out["sim_breakdown"] = mean_breakdown([r.inbound_breakdown() for r in records])
    out["real_router"] = router_summary(rounds, args.warmup)
    out.update({"rss_mb_total": round(rss_mb, 1), "wall_s": round(wall_s, 1),
                "setup": {"nodes": args.nodes, "round_s": args.round_s, "warmup": args.warmup,
                          "rounds_measured": args.rounds, "publish_spread_s": args.publish_spread_s,
                          "connect": args.connect, "sim_mesh_degree": SHARD_GOSSIP.degree, "seed": args.seed,
                          "sim_seeds": args.sim_seeds}})
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--round-s", type=float, default=10.0)
    parser.add_argument("--publish-spread-s", type=float, default=ScaleSetup(n=1).publish_spread_s)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=6, help="measured rounds")
    parser.add_argument("--connect", type=int, default=GossipParams().connect, help="connections per node")
    parser.add_argument("--settle-s", type=float, default=15.0, help="from the dials to the first round")
    parser.add_argument("--sim-seeds", type=int, default=5, help="simulator runs averaged")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--logs", type=Path, default=Path("/tmp/fanin_real"))
    parser.add_argument("--from-rounds", type=Path, help="a run's LOGS/rounds.json: compare it, start nothing")
    parser.add_argument("--out", type=Path, default=RESULTS / "swarm_scale.json")
    args = parser.parse_args(argv)
    result = bench(args)
    merged = json.loads(args.out.read_text()) if args.out.exists() else {}
    merged["real_vs_sim_n16" if args.nodes == 16 else f"real_vs_sim_n{args.nodes}"] = result
    args.out.write_text(json.dumps(merged, indent=2) + "\n")
    print(f"fanin_real: N={args.nodes} inbound msgs real/sim {result['inbound_msgs_ratio']:.2f}, "
          f"KB {result['inbound_kb_ratio']:.2f} (real {result['real']['inbound_kb_per_round']:.1f} KB, sim "
          f"{result['sim']['inbound_kb_per_round']:.1f} KB per round), {result['rss_mb_total']:.0f} MB RSS")


if __name__ == "__main__":
    main()
