"""Solo RL learning benchmark: greedy accuracy and sampled reward on held-out problems, before and after.

For each seed: start from the embedded default model, evaluate (greedy exact answers on >= 200 held-out
problems; mean reward of 4 samples per problem at the training temperature), run solo GRPO for a fixed number
of steps, evaluate again. Writes bench/results/solo_learning.json (medians over seeds) and prints one line.

    python -m bench.solo_learning [--seeds 0 1 2] [--steps 300] [--sampler auto] [--parallel]
                                  [--set train.lr=1e-4 ...]

--parallel runs each seed in its own process with one torch thread (2 cores: 3 seeds side by side); without it
the seeds run one after another with all cores.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import tomllib

from bench import provenance
from swarm_node.config import SAMPLER_CONFIGS, load_config
from swarm_node.node.assembly import assemble
from swarm_node.node.run_files import NodeEvents
from swarm_node.train.evaluate import evaluate

RESULTS = Path(__file__).parent / "results"
EVAL_PROBLEMS = 500
EVAL_SAMPLES = 4


def run_seed(seed: int, steps: int, sampler: str, overrides: dict[str, Any], run_root: Path) -> dict[str, Any]:
    shutil.rmtree(run_root / f"seed{seed}", ignore_errors=True)  # scratch space: every bench run starts fresh
    cfg = load_config(None, {"run.seed": seed, "run.steps": steps, "run.run_dir": str(run_root / f"seed{seed}"),
                             "run.eval_problems": 0, "run.checkpoint_every": max(steps, 1), "sampler.kind": sampler,
                             "status.port": -1, **overrides})
    last_print = [time.monotonic()]

    def on_step(m: dict[str, Any]) -> None:
        if time.monotonic() - last_print[0] > 30:
            last_print[0] = time.monotonic()
            print(f"  [seed {seed}] step {m['step']}/{steps} reward {m.get('reward_mean', float('nan')):.3f}",
                  flush=True)

    assembly = assemble(cfg, events=NodeEvents(log=lambda m: print(f"  [seed {seed}] {m}", flush=True),
                                               on_step=on_step))
    node = assembly.node

    def measure() -> tuple[float, float]:
        assert node.sampler is not None
        r = evaluate(node.sampler, node.tokenizer, node.task_source, EVAL_PROBLEMS, node.cfg.sampler.max_new_tokens,
                     samples=EVAL_SAMPLES, temperature=cfg.sampler.temperature, seed=seed,
                     eos_ids=node.eos_ids, prompter=node.prompter)
        return r.greedy_acc, float(r.sampled_reward or 0.0)

    acc_before, reward_before = measure()
    print(f"  [seed {seed}] before: greedy {acc_before:.3f} sampled {reward_before:.3f}", flush=True)
    started = last_print[0] = time.monotonic()
    assembly.run()
    wall = time.monotonic() - started
    acc_after, reward_after = measure()
    assembly.close()
    print(f"  [seed {seed}] after {steps} steps ({wall:.0f} s): greedy {acc_after:.3f} sampled {reward_after:.3f}",
          flush=True)
    return {"seed": seed, "eval_acc_before": acc_before, "eval_acc_after": acc_after,
            "sampled_reward_before": reward_before, "sampled_reward_after": reward_after, "steps": steps,
            "wall_s": wall}


def parse_set(items: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        key, _, raw = item.partition("=")
        try:
            out[key] = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            out[key] = raw
    return out


def run_parallel(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Each seed in its own process (one torch thread), side by side; returns their per-seed results."""
    procs = []
    for seed in args.seeds:
        out = Path(args.run_root) / f"seed{seed}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        # one engine thread where the kind runs an engine (its own setting: [sampler] threads)
        engine = ["sampler.threads=1"] if "threads" in SAMPLER_CONFIGS[args.sampler]().engine_knobs() else []
        cmd = [sys.executable, "-m", "bench.solo_learning", "--seeds", str(seed), "--steps", str(args.steps),
               "--sampler", args.sampler, "--out", str(out), "--run-root", args.run_root,
               "--set", "train.threads=1", *engine, *args.set]
        procs.append((subprocess.Popen(cmd), out))
    results = []
    for proc, out in procs:
        if proc.wait() != 0:
            raise SystemExit(f"seed run failed: {' '.join(proc.args)}")
        results += json.loads(out.read_text())["per_seed"]
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--parallel", action="store_true", help="one process per seed, one thread each")
    ap.add_argument("--sampler", default="auto")
    ap.add_argument("--set", nargs="*", default=[], help="config overrides, e.g. train.lr=1e-4")
    ap.add_argument("--out", default=str(RESULTS / "solo_learning.json"))
    ap.add_argument("--run-root", default=str(Path(__file__).parent / ".runs" / "solo_learning"))
    args = ap.parse_args()
    run = provenance.begin()  # accuracies and rewards: no time or rate, no load guard
    overrides = parse_set(args.set)
    if args.parallel:
        per_seed = run_parallel(args)
    else:
        per_seed = [run_seed(s, args.steps, args.sampler, overrides, Path(args.run_root)) for s in args.seeds]
    fields = ["eval_acc_before", "eval_acc_after", "sampled_reward_before", "sampled_reward_after", "wall_s"]
    result = {k: statistics.median(p[k] for p in per_seed) for k in fields}
    result.update(steps=args.steps, seeds=args.seeds, per_seed=per_seed, sampler=args.sampler,
                  overrides=overrides, eval_problems=EVAL_PROBLEMS, eval_samples=EVAL_SAMPLES,
                  greedy_gain_points=100 * statistics.median(p["eval_acc_after"] - p["eval_acc_before"]
                                                             for p in per_seed))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(provenance.stamp(result, run, runs=len(args.seeds)), indent=1))
    print(f"solo_learning: greedy {result['eval_acc_before']:.3f} -> {result['eval_acc_after']:.3f} "
          f"({result['greedy_gain_points']:+.1f} pts), sampled {result['sampled_reward_before']:.3f} -> "
          f"{result['sampled_reward_after']:.3f}, {args.steps} steps, {result['wall_s']:.0f} s/seed (median of "
          f"{len(args.seeds)} seeds)")


if __name__ == "__main__":
    main()
