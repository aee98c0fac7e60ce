"""Rollout sharing at swarm scale: today's flood against the bounded fan-in design, N = 10 to 10,000 (issue 32).

`python -m bench.swarm_scale` writes bench/results/swarm_scale.json:
  {"designs": {"flood" | "bounded": {"10" | "100" | "1000" | "10000": {"inbound_msgs_per_round",
   "inbound_kb_per_round", "inbound_kb_per_round_p99", "outbound_kb_per_round_p99", "rounds_with_J_frac",
   "distinct_peers_10_rounds", "distinct_peers_100_rounds", "pulled_by_ge1_frac", "latency_to_k_ms_p50"}}},
   "churn_1000": {"rounds_with_J_frac"}, "real_vs_sim_n16": null, "method": {...}, "flood_check": {...}}
- A virtual-clock, message-level simulation (simulations/scale_sim.py; no training, no wall time: nothing here is
  timed, so no load guard): I = J = 4 groups of 5 KB per node and round, 10 s rounds, signal per group with
  probability 0.6, K = 3, every node's link 100 Mbit/s up and down with 20 ms latency (the scenarios' network),
  2 warm-up rounds then `--rounds` measured ones. KB = 1024 bytes; every message and byte counts, control and
  duplicates included. Per-node figures: each node's mean per measured round, then the median or the 99th
  percentile over nodes. latency_to_k_ms_p50: over the groups that reached K receivers within their round (null:
  none did).
- flood at N >= 1,000 is analytical (scale_flood.flood_counts); `flood_check` holds both the simulator's and the
  model's figures at N = 10 and 100. The flood simulator at N = 100 runs `--flood-100-rounds` measured rounds (each
  costs minutes of CPU; every peer is heard in every round, so the 100-round diversity is that of 1 round).
- churn_1000: the bounded design at N = 1,000 with 30% of the nodes replaced per minute.
- real_vs_sim_n16 comes from real libp2p processes, measured apart by `python -m bench.fanin_real` (issue 32
  item 4), which merges it into the same file; a run of this bench keeps it (null until fanin_real has run).
- It also draws bench/results/swarm_scale_inbound.png (bench/swarm_scale_plot.py, the README's plot) from the
  result; `--plot-only` redraws it from the result file (`--out`) without simulating.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from bench import provenance
from bench.swarm_scale_plot import plot_inbound
from simulations.scale_flood import flood_counts
from simulations.scale_model import ScaleSetup
from simulations.scale_sim import measure

RESULTS = Path(__file__).resolve().parent / "results"
PLOT = RESULTS / "swarm_scale_inbound.png"
SIZES = (10, 100, 1000, 10000)


def finite(figures: dict[str, float]) -> dict[str, float | None]:
    return {k: (round(v, 4) if math.isfinite(v) else None) for k, v in figures.items()}


def bench(args: argparse.Namespace) -> dict[str, Any]:
    base = ScaleSetup(n=10, rounds=args.rounds + 2, seed=args.seed)
    designs: dict[str, dict[str, Any]] = {"flood": {}, "bounded": {}}
    method: dict[str, dict[str, str]] = {"flood": {}, "bounded": {}}
    check: dict[str, dict[str, Any]] = {}
    for n in args.sizes:
        for design in ("flood", "bounded"):
            rounds = args.flood_100_rounds + 2 if design == "flood" and n == 100 else base.rounds
            setup = dataclasses.replace(base, n=n, rounds=rounds)
            t0 = time.monotonic()
            figures, how = measure(design, setup)
            designs[design][str(n)] = finite(figures)
            method[design][str(n)] = f"{how}, {setup.rounds - setup.warmup} measured rounds"
            print(f"  {design} n={n} ({how}): {time.monotonic() - t0:.0f} s", file=sys.stderr)
            if design == "flood" and how == "simulated":
                check[str(n)] = {"simulated": finite(figures), "analytical": finite(flood_counts(setup))}
    churn = dataclasses.replace(base, n=1000, churn_per_min=0.3)
    churned, _ = measure("bounded", churn)
    return {"designs": designs, "churn_1000": {"rounds_with_J_frac": round(churned["rounds_with_J_frac"], 4)},
            "real_vs_sim_n16": None, "method": method, "flood_check": check,
            "setup": {"rounds_measured": args.rounds, "seed": args.seed, "link": dataclasses.asdict(base.link),
                      "group_kb": base.group_bytes / 1024, "groups_per_node": base.groups_per_node,
                      "needed": base.needed, "round_s": base.round_s, "signal_p": base.signal_p,
                      "k_receivers": base.k_receivers, "churn_per_min": churn.churn_per_min}}


def summary(result: dict[str, Any]) -> str:
    b, f = result["designs"]["bounded"], result["designs"]["flood"]
    top = str(max(int(n) for n in b))
    return (f"swarm_scale: at N={top} bounded {b[top]['inbound_kb_per_round']:.0f} KB/round in "
            f"(flood {f[top]['inbound_kb_per_round']:.0f}), J met in {b[top]['rounds_with_J_frac']:.3f} of rounds; "
            f"churn_1000 {result['churn_1000']['rounds_with_J_frac']:.3f}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=100, help="measured rounds (after 2 warm-up rounds)")
    parser.add_argument("--flood-100-rounds", type=int, default=20, help="measured rounds of the flood at N=100")
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS / "swarm_scale.json")
    parser.add_argument("--plot", type=Path, default=PLOT, help="the inbound-cost plot drawn from the result")
    parser.add_argument("--plot-only", action="store_true", help="redraw --plot from --out; simulate nothing")
    args = parser.parse_args(argv)
    if args.plot_only:
        plot_inbound(json.loads(args.out.read_text()), args.plot)
        print(f"swarm_scale: plot {args.plot} from {args.out}")
        return
    run = provenance.begin()
    result = provenance.stamp(bench(args), run, runs=1)
    if args.out.exists():  # bench.fanin_real's part, measured apart
        result["real_vs_sim_n16"] = json.loads(args.out.read_text()).get("real_vs_sim_n16")
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    plot_inbound(result, args.plot)
    print(summary(result))


if __name__ == "__main__":
    main()
