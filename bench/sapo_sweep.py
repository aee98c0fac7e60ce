"""SAPO I/J sweep: cumulative reward of a small swarm for the paper's four local/external mixes.

Runs simulations/scenarios/sapo_sweep.toml (N nodes, lockstep rounds, in-memory transport) for every
(configuration, seed) cell, seed-major so that an interrupted run still covers every configuration. Each cell is
resumable: a finished cell (its result.json in the run dir) is loaded, not re-run, so the sweep can span sittings.
Cumulative reward of a run = sum over rounds of the mean reward per LOCAL completion, averaged over nodes; final
eval = greedy held-out accuracy, averaged over nodes. Writes bench/results/sapo_sweep.json and sapo_sweep.png.

    python -m bench.sapo_sweep [--rounds 300] [--seeds 0 1 2] [--nodes 4] [--run-dir runs/sapo_sweep] [--is]

Defaults come from the scenario (cell run times: docs/BENCHMARKS.md). To use both cores, run one process per
seed (`--seeds K`, same --run-dir), then once more without --seeds to gather every cell into the results.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from bench import provenance
from bench.sapo_paper import add_gains_vs_8_0
from simulations.report import plot_reward_curves
from simulations.runner import cell_dir, read_rows, run_cell
from simulations.scenario import Variant, load_scenario, with_overrides

RESULTS = Path(__file__).parent / "results"
SCENARIO = Path(__file__).resolve().parents[1] / "simulations" / "scenarios" / "sapo_sweep.toml"


def window_reward(rows: list[dict[str, str]], first: int, last: int) -> float:
    """Mean over nodes and rounds first..last of the mean reward per local completion."""
    return statistics.fmean(float(r["reward_mean"]) for r in rows
                            if first <= int(r["round"]) <= last and r["reward_mean"] not in ("", None))


def summarise(scn: Any, results: dict[str, list[dict[str, Any]]], total_s: float, run_dir: Path) -> dict[str, Any]:
    window = max(1, scn.rounds // 6)  # learning shows as the reward of the last rounds against the first ones
    configs = {}
    for name, cells in results.items():
        cum = [c["cum_reward"] for c in cells]
        evals = [c["final_eval_acc"] for c in cells if c["final_eval_acc"] is not None]
        rows = [read_rows(cell_dir(run_dir, name, c["seed"]) / "metrics.csv") for c in cells]
        configs[name] = {
            "cum_reward_mean": statistics.fmean(cum) if cum else None,
            "cum_reward_std": statistics.stdev(cum) if len(cum) > 1 else 0.0,
            "per_seed": cum,
            "final_eval_acc_mean": statistics.fmean(evals) if evals else None,
            "seeds_done": [c["seed"] for c in cells],
            "final_eval_acc_per_seed": evals,
            "reward_window_rounds": window,
            "first_window_reward_mean": statistics.fmean(window_reward(r, 1, window) for r in rows) if rows else None,
            "last_window_reward_mean": statistics.fmean(window_reward(r, scn.rounds - window + 1, scn.rounds)
                                                        for r in rows) if rows else None,
        }
    add_gains_vs_8_0(configs)
    return {"nodes": scn.nodes, "rounds": scn.rounds,
            "group_size": scn.node_config(scn.variants[0], 0, 0, Path(".")).run.group_size,
            "seeds": list(scn.seeds), "configs": configs,
            "sizes": {"model": "embedded default (~1.6M-param char Qwen2)", "sampler": "hf", "groups_per_update": 8,
                      "max_new_tokens": 8, "process": "one process, lockstep rounds, in-memory transport",
                      "eval_problems": scn.eval_problems},
            "total_wall_s": total_s,
            # compute time of the cells themselves (resumed cells were run in earlier or parallel invocations)
            "cells_wall_s": sum(c.get("wall_s", 0.0) for cells in results.values() for c in cells),
            "paper_note": "paper: 8 nodes, 2000 rounds, Qwen2.5-0.5B; ours is far smaller"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", type=Path, default=SCENARIO)
    ap.add_argument("--rounds", type=int)
    ap.add_argument("--seeds", type=int, nargs="+")
    ap.add_argument("--nodes", type=int)
    ap.add_argument("--run-dir", type=Path)
    ap.add_argument("--is", dest="with_is", action="store_true", help="add the 4/4+is configuration")
    args = ap.parse_args()
    run = provenance.begin()  # cumulative rewards: no time or rate, no load guard
    scn = with_overrides(load_scenario(args.scenario), rounds=args.rounds, nodes=args.nodes, seeds=args.seeds)
    variants = list(scn.variants)
    if args.with_is:
        variants.append(Variant("4/4+is", {"share": {"local_groups": 4, "external_groups": 4,
                                                     "correction": {"kind": "is"}}}))
    run_dir = args.run_dir or Path(scn.run_dir)
    RESULTS.mkdir(exist_ok=True)
    started = time.monotonic()
    results: dict[str, list[dict[str, Any]]] = {v.name: [] for v in variants}
    for seed in scn.seeds:
        for variant in variants:
            t = time.monotonic()

            def progress(name: str, s: int, rnd: int, total: int, reward: float | None, t: float = t) -> None:
                if rnd % 10 == 0 or rnd == total:
                    print(f"  [{name} seed {s}] round {rnd}/{total} mean local reward {reward:.3f} "
                          f"({time.monotonic() - t:.0f} s)", flush=True)

            result = run_cell(scn, variant, seed, run_dir, progress)
            results[variant.name].append(result)
            print(f"{variant.name} seed {seed}: cum reward {result['cum_reward']:.2f} final eval "
                  f"{result['final_eval_acc']} ({result['wall_s']:.0f} s)", flush=True)
            summary = summarise(scn, results, time.monotonic() - started, run_dir)
            stamped = provenance.stamp(summary, run, runs=len(scn.seeds))
            (RESULTS / "sapo_sweep.json").write_text(json.dumps(stamped, indent=1))
    curves = {name: [read_rows(cell_dir(run_dir, name, c["seed"]) / "metrics.csv") for c in cells]
              for name, cells in results.items()}
    plot_reward_curves(curves, RESULTS / "sapo_sweep.png", title=f"SAPO sweep: {scn.nodes} nodes, G=8")
    c = summary["configs"]
    print("sapo_sweep: " + "; ".join(
        f"{n} cum {c[n]['cum_reward_mean']:.2f}±{c[n]['cum_reward_std']:.2f}"
        + (f" ({c[n]['gain_vs_8_0_pct']:+.0f}% vs 8/0"
           + (f"; paper {c[n]['paper_gain_vs_8_0_pct']:+.0f}%" if "paper_gain_vs_8_0_pct" in c[n] else "") + ")"
           if c[n]['gain_vs_8_0_pct'] is not None and n != "8/0" else "")
        for n in c) + f"; {scn.nodes} nodes x {scn.rounds} rounds x {len(scn.seeds)} seeds in "
        f"{summary['cells_wall_s']:.0f} s of cell compute")


if __name__ == "__main__":
    main()
