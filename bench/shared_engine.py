"""Simulated swarm sampling: one shared vLLM engine (every node a LoRA adapter, one batch per round) vs one sampler
per node (transformers, or a vLLM engine each).

Each mode runs the same sync scenario in a fresh child process: N nodes of the embedded default model, LoRA rank 8
on every projection, G = 8, 8 local groups per node per round (8/0, so rounds do not depend on what arrives), all
on 1 thread. Per mode and repeat: the median wall time of a round (its sampling, scoring and every node's update)
after the first (warm-up) round, and the child's peak resident memory; modes interleaved per repeat (the order
rotating, so no mode always goes first), medians over repeats. Against the shared engine, per mode:
`round_s_vs_shared` and `rss_vs_shared` (ratios of the medians, kept for older readers) and the paired
`paired_round_s_vs_shared`, `paired_rss_vs_shared` (the median of each repeat's ratio, `bench/paired.py`), with each
repeat's own ratios in its `runs[j]` (`round_s_vs_shared`, `rss_vs_shared`). Writes bench/results/shared_engine.json
(or --out) and prints one summary line. It reports times, so it refuses to start when the 1-minute load average is
above 0.5 unless --loaded.

    python -m bench.shared_engine [--nodes 8] [--rounds 6] [--repeats 3] [--out PATH] [--loaded]
"""

from __future__ import annotations

import os

from bench import provenance
from bench.load_guard import add_loaded_flag
from bench.paired import paired_ratio_or_none, round_order

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads OpenMP (see vllm_sampler)

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"
VLLM = {"kind": "vllm", "threads": 1, "kv_cache_gb": 0.125}  # [sampler]: the vLLM engine's own settings
MODES = {  # mode -> (simulation.sampler, config.sampler)
    "shared": ("shared-lora", VLLM),
    "vllm_per_node": ("per-node", VLLM),
    "hf_per_node": ("per-node", {"kind": "hf"}),
}


def scenario(mode: str, nodes: int, rounds: int) -> dict[str, Any]:
    sim_sampler, sampler = MODES[mode]
    return {"simulation": {"nodes": nodes, "rounds": rounds, "seeds": [0], "eval_problems": 0, "sampler": sim_sampler},
            "config": {"run": {"group_size": 8},
                       "sampler": dict(sampler),
                       "train": {"threads": 1, "lora_rank": 8, "lora_alpha": 16.0, "lr": 1e-3},
                       "share": {"local_groups": 8, "external_groups": 0}}}


def child(mode: str, nodes: int, rounds: int) -> dict[str, Any]:
    from simulations.runner import run_cell
    from simulations.scenario import parse_scenario

    scn = parse_scenario(scenario(mode, nodes, rounds), f"bench-{mode}")
    ends: list[float] = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        result = run_cell(scn, scn.variants[0], 0, Path(tmp), on_round=lambda *_a: ends.append(time.monotonic()))
    rounds_s = [b - a for a, b in zip(ends, ends[1:], strict=False)]  # after round 1: engines started, warm
    return {"mode": mode, "round_s": statistics.median(rounds_s), "wall_s": time.monotonic() - started,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "cum_reward": result["cum_reward"]}


def run_child(mode: str, nodes: int, rounds: int) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-m", "bench.shared_engine", "--child", mode, "--nodes", str(nodes),
                          "--rounds", str(rounds)], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"{mode} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def paired_vs_shared(mode_runs: list[dict[str, Any]], shared_runs: list[dict[str, Any]]) -> dict[str, float | None]:
    """A mode's paired ratios to the shared engine (median of per-repeat ratios); each repeat's own ratios are
    written into its run."""
    fields = {"round_s": "round_s", "rss": "peak_rss_mib"}
    for run, base in zip(mode_runs, shared_runs, strict=True):
        for name, key in fields.items():
            run[f"{name}_vs_shared"] = paired_ratio_or_none([run[key]], [base[key]])
    return {f"paired_{name}_vs_shared": paired_ratio_or_none([r[key] for r in mode_runs],
                                                             [b[key] for b in shared_runs])
            for name, key in fields.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--child", choices=sorted(MODES))
    ap.add_argument("--out", type=Path, default=RESULTS / "shared_engine.json")
    add_loaded_flag(ap)
    args = ap.parse_args()
    if args.child:
        print(json.dumps({**child(args.child, args.nodes, args.rounds), "sources": provenance.imported_sources()}))
        return
    run = provenance.begin(timed=True, loaded=args.loaded)
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
    child_sources: set[str] = set()
    for repeat in range(args.repeats):
        for mode in round_order(list(MODES), repeat):
            r = run_child(mode, args.nodes, args.rounds)
            child_sources.update(r.pop("sources"))
            runs[mode].append(r)
            print(f"  repeat {repeat + 1}/{args.repeats} {mode}: {r['round_s']:.2f} s/round, "
                  f"{r['peak_rss_mib']:.0f} MiB peak", flush=True)
    summary = {m: {"round_s_median": statistics.median(r["round_s"] for r in rs),
                   "peak_rss_mib_median": statistics.median(r["peak_rss_mib"] for r in rs),
                   "cum_reward_median": statistics.median(r["cum_reward"] for r in rs), "runs": rs}
               for m, rs in runs.items()}
    shared = summary["shared"]
    for m in MODES:
        summary[m]["round_s_vs_shared"] = summary[m]["round_s_median"] / shared["round_s_median"]
        summary[m]["rss_vs_shared"] = summary[m]["peak_rss_mib_median"] / shared["peak_rss_mib_median"]
        summary[m].update(paired_vs_shared(runs[m], runs["shared"]))
    out = {"nodes": args.nodes, "rounds": args.rounds, "repeats": args.repeats, "group_size": 8,
           "groups_per_node": 8, "lora_rank": 8, "threads": 1, "modes": summary,
           "note": "round = every node samples 8x8 completions, scores and trains once; medians over repeats; "
                   "paired_*: medians of each repeat's ratio to the shared engine's run of the same repeat"}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    out = provenance.stamp(out, run, runs=args.repeats, child_sources=sorted(child_sources))
    args.out.write_text(json.dumps(out, indent=1))
    v, h = summary["vllm_per_node"], summary["hf_per_node"]
    print(f"shared_engine: {args.nodes} nodes, s/round shared {shared['round_s_median']:.2f} | vLLM per node "
          f"{v['round_s_median']:.2f} ({v['paired_round_s_vs_shared']:.2f}x paired) | HF per node "
          f"{h['round_s_median']:.2f} ({h['paired_round_s_vs_shared']:.2f}x paired); peak RSS "
          f"{shared['peak_rss_mib_median']:.0f} / "
          f"{v['peak_rss_mib_median']:.0f} / {h['peak_rss_mib_median']:.0f} MiB")


if __name__ == "__main__":
    main()
