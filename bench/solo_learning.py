"""Solo RL learning benchmark: held-out greedy accuracy before and after solo GRPO from the embedded default model.

Builds the default model into an empty scratch cache under the run root, timed (`build_s`; `--reuse-cache`: the
existing cache, no build); then per seed: evaluate on `--problems` distinct questions of `--split` (greedy; with
`--samples` N also the mean reward of N samples at the training temperature), run solo GRPO for `--steps` steps
(`solo_s`), evaluate again on the same questions. Statistics: `bench/solo_stats.py`; the fields and how to read
them: docs/BENCHMARKS.md, "bench.solo_learning". Writes `--out` (default bench/results/solo_learning.json,
solo_learning_<split>.json for another split) and prints one line.

    python -m bench.solo_learning [--seeds 0 1 2] [--steps 300] [--problems 4000] [--split test|validation]
                                  [--samples 0] [--sampler auto] [--parallel] [--reuse-cache] [--resume] [--loaded]
                                  [--set train.lr=1e-4 ...] [--out PATH] [--run-root DIR]

--parallel runs each seed in its own process with one torch thread (2 cores: 3 seeds side by side); without it
the seeds run one after another with all cores. It reports times, so it refuses a loaded machine unless --loaded.
Each finished seed's record is kept in <run-root>/seed<k>.json with its fingerprint (the settings that shape it,
the code version and the default model's recipe); `--resume` reuses a kept record whose fingerprint matches, so a
run cut short (a session's end) goes on from the next seed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import tomllib

from bench import provenance
from bench.load_guard import add_loaded_flag
from bench.solo_stats import seed_record, summarize
from swarm_node import tasks
from swarm_node.config import SAMPLER_CONFIGS, load_config
from swarm_node.model.default_model import default_model_key, ensure_default_model
from swarm_node.node.assembly import assemble
from swarm_node.node.run_files import NodeEvents
from swarm_node.train.evaluate import EvalResult, evaluate

RESULTS = Path(__file__).parent / "results"
PROGRESS_EVERY_S = 30.0
CACHE_DIR = "model_cache"  # the scratch model cache, under the run root


def out_file(split: str) -> Path:
    """The default result file of a split: a tuning run on validation never overwrites the test result."""
    return RESULTS / ("solo_learning.json" if split == tasks.DEFAULT_SPLIT else f"solo_learning_{split}.json")


def throttled(print_line: Callable[[str], None]) -> Callable[[str], None]:
    """`print_line` at most once every PROGRESS_EVERY_S seconds (the first call waits that long too)."""
    last = [time.monotonic()]

    def maybe(line: str) -> None:
        if time.monotonic() - last[0] >= PROGRESS_EVERY_S:
            last[0] = time.monotonic()
            print_line(line)
    return maybe


def build_model(run_root: Path, recipe: str, resume: bool = False) -> float:
    """Seconds to build the default model into an empty scratch cache, which the seeds (and their processes) then
    load it from. With `resume`, a build this run root already finished (same recipe) is reused with its time."""
    cache = (run_root / CACHE_DIR).resolve()  # the seeds' processes inherit it: absolute
    os.environ["SWARM_NODE_CACHE"] = str(cache)
    finished, key = run_root / "build.json", default_model_key(recipe)
    if resume and finished.exists() and cache.exists() and (kept := json.loads(finished.read_text()))["key"] == key:
        print(f"  [build] reusing the finished build ({kept['build_s']:.0f} s)", flush=True)
        return float(kept["build_s"])
    shutil.rmtree(cache, ignore_errors=True)
    finished.unlink(missing_ok=True)
    progress = throttled(lambda line: print(f"  [build] {line}", flush=True))
    started = time.monotonic()
    ensure_default_model(lambda done, total, what: progress(f"warm-up step {done}/{total}, {what}"), recipe)
    build_s = time.monotonic() - started
    print(f"  [build] {recipe} in {build_s:.0f} s", flush=True)
    finished.write_text(json.dumps({"key": key, "build_s": build_s}))
    return build_s


def run_seed(seed: int, args: argparse.Namespace, overrides: dict[str, Any]) -> dict[str, Any]:
    """One seed: eval, solo GRPO, eval again; its record (`solo_stats.seed_record`)."""
    run_root = Path(args.run_root)
    shutil.rmtree(run_root / f"seed{seed}", ignore_errors=True)  # scratch space: every bench run starts fresh
    cfg = load_config(None, {"run.seed": seed, "run.steps": args.steps, "run.run_dir": str(run_root / f"seed{seed}"),
                             "run.eval_problems": 0, "run.checkpoint_every": max(args.steps, 1),
                             "sampler.kind": args.sampler, "status.port": -1, **overrides})

    def say(line: str) -> None:
        print(f"  [seed {seed}] {line}", flush=True)

    progress = throttled(say)
    rows: list[dict[str, Any]] = []

    def on_step(m: dict[str, Any]) -> None:
        rows.append(m)
        progress(f"step {m['step']}/{args.steps} reward {m.get('reward_mean', float('nan')):.3f}")

    assembly = assemble(cfg, events=NodeEvents(log=say, on_step=on_step))
    node = assembly.node

    def measure(when: str) -> EvalResult:
        assert node.sampler is not None
        temperature, _ = node.cfg.sampler.temperature_top_p()
        return evaluate(node.sampler, node.tokenizer, node.task_source, args.problems,
                        node.cfg.sampler.max_new_tokens, samples=args.samples, temperature=temperature,
                        seed=seed, eos_ids=node.eos_ids, prompter=node.prompter, split=args.split,
                        progress=lambda done, total: progress(f"eval {when} {done}/{total}"))

    started = time.monotonic()
    before = measure("before")
    eval_s = time.monotonic() - started
    say(f"before: {before}, well-formed {before.well_formed_frac():.3f}")
    started = time.monotonic()
    assembly.run()
    solo_s = time.monotonic() - started
    started = time.monotonic()
    after = measure("after")
    eval_s += time.monotonic() - started
    assembly.close()
    say(f"after {args.steps} steps ({solo_s:.0f} s): {after}, well-formed {after.well_formed_frac():.3f}")
    return seed_record(seed, args.steps, solo_s, eval_s, before, after, rows)


def seed_fingerprint(seed: int, args: argparse.Namespace, overrides: dict[str, Any]) -> str:
    """What a seed's record depends on: its settings, the code and the default model's recipe."""
    from simulations.code_version import code_version

    shaped = {"seed": seed, "steps": args.steps, "problems": args.problems, "split": args.split,
              "samples": args.samples, "sampler": args.sampler, "parallel": args.parallel, "overrides": overrides}
    recipe = load_config(None, overrides).model.recipe
    return json.dumps({**shaped, "code": code_version(), "recipe": default_model_key(recipe)}, sort_keys=True)


def kept_record(path: Path, fingerprint: str) -> dict[str, Any] | None:
    """A finished seed's kept record when its fingerprint matches (else None: the seed runs again)."""
    if not path.exists():
        return None
    kept = json.loads(path.read_text())
    return kept if kept.get("fingerprint") == fingerprint else None


def run_seeds_in_turn(args: argparse.Namespace, overrides: dict[str, Any]) -> list[dict[str, Any]]:
    """The seeds one after another in this process; each finished seed kept (and with --resume, reused)."""
    records = []
    for seed in args.seeds:
        path, fingerprint = Path(args.run_root) / f"seed{seed}.json", seed_fingerprint(seed, args, overrides)
        if args.resume and (kept := kept_record(path, fingerprint)) is not None:
            print(f"  [seed {seed}] reusing its finished record ({path})", flush=True)
            records.append(kept["record"])
            continue
        record = run_seed(seed, args, overrides)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"fingerprint": fingerprint, "record": record}))
        records.append(record)
    return records


def parse_set(items: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        key, _, raw = item.partition("=")
        try:
            out[key] = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            out[key] = raw
    return out


def run_parallel(args: argparse.Namespace) -> tuple[list[dict[str, Any]], set[str]]:
    """Each seed in its own process (one torch thread), side by side; their records and imported sources."""
    procs = []
    for seed in args.seeds:
        out = Path(args.run_root) / f"seed{seed}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        # one engine thread where the kind runs an engine (its own setting: [sampler] threads)
        engine = ["sampler.threads=1"] if "threads" in SAMPLER_CONFIGS[args.sampler]().engine_knobs() else []
        cmd = [sys.executable, "-m", "bench.solo_learning", "--child", "--seeds", str(seed), "--steps",
               str(args.steps), "--problems", str(args.problems), "--split", args.split, "--samples",
               str(args.samples), "--sampler", args.sampler, "--out", str(out), "--run-root", args.run_root,
               "--set", "train.threads=1", *engine, *args.set]
        procs.append((subprocess.Popen(cmd), out))
    records, sources = [], set()
    for proc, out in procs:
        if proc.wait() != 0:
            raise SystemExit(f"seed run failed: {' '.join(proc.args)}")
        child = json.loads(out.read_text())
        records += child["records"]
        sources.update(child["sources"])
    return records, sources


def summary_line(result: dict[str, Any]) -> str:
    gain, (low, high) = result["gain"], result["gain_ci95"]
    specialties = ", ".join(f"{name} {100 * s['gain']:+.1f}" for name, s in result["per_specialty"].items())
    build = "reused cache" if result["build_s"] is None else f"build {result['build_s']:.0f} s"
    return (f"solo_learning: {result['split']} greedy {result['eval_acc_before']:.3f} -> "
            f"{result['eval_acc_after']:.3f} ({100 * gain:+.1f} pts, 95% [{100 * low:+.1f}, {100 * high:+.1f}]) on "
            f"{result['eval_distinct_questions']} questions; {specialties}; {result['steps']} steps, "
            f"{result['solo_s']:.0f} s/seed (median of {len(result['seeds'])}), {build}")


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--problems", type=int, default=4000, help="distinct eval questions, spread over the mix")
    ap.add_argument("--split", default=tasks.DEFAULT_SPLIT, choices=list(tasks.SPLITS),
                    help="held-out split: test to report, validation to choose hyper-parameters")
    ap.add_argument("--samples", type=int, default=0, help="also the mean reward of N samples per question")
    ap.add_argument("--parallel", action="store_true", help="one process per seed, one thread each")
    ap.add_argument("--sampler", default="auto")
    ap.add_argument("--reuse-cache", action="store_true", help="the existing model cache: no timed build")
    ap.add_argument("--resume", action="store_true", help="reuse the seeds a cut-short run finished (same settings)")
    ap.add_argument("--set", nargs="*", default=[], help="config overrides, e.g. train.lr=1e-4")
    ap.add_argument("--out", type=Path, help="default: bench/results/solo_learning[_<split>].json")
    ap.add_argument("--run-root", default=str(Path(__file__).parent / ".runs" / "solo_learning"))
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)  # a --parallel seed: raw records
    add_loaded_flag(ap)
    return ap.parse_args()


def main() -> None:
    args = parse_args()
    overrides = parse_set(args.set)
    if args.child:
        records = [run_seed(s, args, overrides) for s in args.seeds]
        args.out.write_text(json.dumps({"records": records, "sources": provenance.imported_sources()}))
        return
    run = provenance.begin(timed=True, loaded=args.loaded)  # build and run seconds
    build_s = None if args.reuse_cache else build_model(Path(args.run_root), load_config(None, overrides).model.recipe,
                                                        args.resume)
    if args.parallel:
        records, child_sources = run_parallel(args)
    else:
        records, child_sources = run_seeds_in_turn(args, overrides), set()
    result = {**summarize(records), "build_s": build_s, "split": args.split, "eval_problems": args.problems,
              "eval_samples": args.samples, "steps": args.steps, "seeds": args.seeds, "sampler": args.sampler,
              "parallel": args.parallel, "overrides": overrides}
    out = args.out or out_file(args.split)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(provenance.stamp(result, run, runs=len(args.seeds), child_sources=sorted(child_sources)),
                              indent=1))
    print(summary_line(result))


if __name__ == "__main__":
    main()
