"""Rollout methods measured by the final policy's held-out accuracy. Part "staleness": corrections of stale rollouts;
part "april": partial rollouts against the synchronous step (bench/april_arms.py says what it measures).

Part "staleness" (issue 31, item 2): one node alone trains at a fixed lag S, the batch trained at version v sampled
by version max(0, v - S) (simulations/fixed_lag.py), for every S in --lags, every correction in --corrections
(`train.stale_correction.kind`: none, tis, m2po, vcpo; rl/stale.py) and every seed. A cell (S, correction, seed)
reports the final policy's greedy accuracy on run.eval_problems held-out problems (never drawn for training), not
the training reward (that is the old policy's). Each cell keeps its result in <run-dir>/staleness/S<S>/<correction>/
seed<seed>/result.json with its fingerprint (the cell's config, S, the default model's recipe and the code version,
simulations/code_version.py): a finished cell with the same fingerprint is reused, any other is run again from its
start (a cell is the unit of resumption). Writes bench/results/rollout_methods.json (or --out), keeping the file's
other parts and the lags not given this time: "staleness": {"<S>": {"<correction>": {"heldout_acc_mean",
"heldout_acc_std", "per_seed", "seeds_done"}}}, and prints one line.

    python -m bench.rollout_methods --part staleness [--lags 1 4 16 64] [--corrections none tis m2po vcpo]
                                    [--seeds 0 1 2] [--steps 256] [--run-dir runs/rollout_methods]
                                    [--set train.lr=1e-4 ...] [--finished-only] [--out PATH]

    python -m bench.rollout_methods --part april [--wall-s 1800] [--max-steps 100000] [--seeds 0]
                                    [--long-tail-set sampler.max_new_tokens=1024 ...] [--set ...] [--loaded]

Part "april" writes "april": {"throughput_ratio_vs_sync", "throughput_ratio_long_tail", "heldout_at_equal_wall_time":
{"sync", "april", "paired_diff_ci95"}, "arms"} from the first seed given; it reports rates, so it refuses a loaded
machine (bench/load_guard.py) unless --loaded (recorded).

To use several cores, run one process per seed (or per lag) with the same --run-dir, then once more with
--finished-only to gather every cell. Run a long sweep from a pinned worktree (bench/README.md).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

from bench import april_arms, provenance
from bench.load_guard import add_loaded_flag
from bench.solo_learning import parse_set
from simulations.code_version import code_version
from simulations.fixed_lag import run_fixed_lag_cell
from swarm_node import variants
from swarm_node.config import load_config
from swarm_node.model.default_model import DefaultModelRecipe

RESULTS = Path(__file__).parent / "results"
PARTS = ("staleness", "april")
WALL_S = 1800.0  # april: each arm's wall-time budget
LONG_TAIL = ("sampler.max_new_tokens=1024",)  # april: a budget where the 95th percentile is >= 4x the median
LAGS = (1, 4, 16, 64)
STEPS = 256  # 4 x the largest default lag
RESULT_FILE = "result.json"


def cell_overrides(correction: str, seed: int, steps: int, extra: dict[str, Any]) -> dict[str, Any]:
    """The cell's config as dotted overrides (its run dir is added where it runs)."""
    return {**extra, "run.seed": seed, "run.steps": steps, "run.checkpoint_every": steps, "status.port": -1,
            "train.stale_correction.kind": correction}


def fingerprint(lag: int, overrides: dict[str, Any]) -> str:
    """What a cell's result depends on: its lag, its config (seed included), the default model and the code."""
    what = {"lag": lag, "overrides": overrides, "default_model": DefaultModelRecipe().key(), "code": code_version()}
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:16]


def cell_dir(run_dir: Path, lag: int, correction: str, seed: int) -> Path:
    return run_dir / "staleness" / f"S{lag}" / correction / f"seed{seed}"


def finished(root: Path, key: str) -> dict[str, Any] | None:
    path = root / RESULT_FILE
    if not path.exists():
        return None
    result: dict[str, Any] = json.loads(path.read_text())
    return result if result.get("fingerprint") == key else None


def run_cell(run_dir: Path, lag: int, correction: str, seed: int, steps: int,
             extra: dict[str, Any]) -> dict[str, Any]:
    """The cell's result: reused when finished on this code and config, else run from its start."""
    overrides = cell_overrides(correction, seed, steps, extra)
    key = fingerprint(lag, overrides)
    root = cell_dir(run_dir, lag, correction, seed)
    if (done := finished(root, key)) is not None:
        return done
    shutil.rmtree(root, ignore_errors=True)  # another fingerprint or a cut run: from its start
    root.mkdir(parents=True)
    cfg = load_config(None, {**overrides, "run.run_dir": str(root / "run")})
    name = f"S={lag} {correction} seed {seed}"
    result = run_fixed_lag_cell(cfg, lag, log=lambda line: print(f"  [{name}] {line}", flush=True))
    result.update(correction=correction, seed=seed, fingerprint=key, overrides=overrides)
    tmp = root / (RESULT_FILE + ".tmp")
    tmp.write_text(json.dumps(result, indent=1))
    tmp.replace(root / RESULT_FILE)  # written last: a cell with one is complete
    print(f"{name}: held-out {result['heldout_acc']} (before {result['heldout_acc_before']}, "
          f"{result['wall_s']:.0f} s)", flush=True)
    return result


def summarise(cells: list[dict[str, Any]]) -> dict[str, Any]:
    accs = [c["heldout_acc"] for c in cells if c["heldout_acc"] is not None]
    return {"heldout_acc_mean": statistics.fmean(accs) if accs else None,
            "heldout_acc_std": (statistics.stdev(accs) if len(accs) > 1 else 0.0) if accs else None,
            "per_seed": accs, "seeds_done": [c["seed"] for c in cells if c["heldout_acc"] is not None]}


def staleness(args: argparse.Namespace, extra: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for lag in args.lags:
        out[str(lag)] = {}
        for correction in args.corrections:
            cells = []
            for seed in args.seeds:
                if args.finished_only:
                    key = fingerprint(lag, cell_overrides(correction, seed, args.steps, extra))
                    if (done := finished(cell_dir(args.run_dir, lag, correction, seed), key)) is not None:
                        cells.append(done)
                    continue
                cells.append(run_cell(args.run_dir, lag, correction, seed, args.steps, extra))
            out[str(lag)][correction] = summarise(cells)
    return out


def april(args: argparse.Namespace, extra: dict[str, Any]) -> dict[str, Any]:
    """Both arms on the base setting and on the long-tail one, from the first seed; each arm in its own run dir."""
    long_tail = {**extra, **parse_set(args.long_tail_set)}
    settings: dict[str, dict[str, Any]] = {}
    for setting, overrides in (("base", extra), ("long_tail", long_tail)):
        settings[setting] = {}
        for mode in april_arms.MODES:
            root = args.run_dir / "april" / setting / mode / f"seed{args.seeds[0]}"
            shutil.rmtree(root, ignore_errors=True)
            cfg = load_config(None, {**overrides, "run.seed": args.seeds[0], "run.steps": args.max_steps,
                                     "run.checkpoint_every": args.max_steps, "status.port": -1,
                                     "run.rollout.kind": mode, "run.run_dir": str(root)})
            arm = april_arms.run_arm(cfg, args.wall_s, args.max_steps,
                                     log=lambda line, s=setting, m=mode: print(f"  [{s} {m}] {line}", flush=True))
            print(f"{setting} {mode}: {arm['steps']} steps, {arm['throughput']:.1f} tokens/s to training, "
                  f"held-out {arm['heldout_acc']}", flush=True)
            settings[setting][mode] = arm
    return april_arms.summarise(settings["base"], settings["long_tail"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", choices=PARTS, default="staleness")
    ap.add_argument("--lags", type=int, nargs="+", default=list(LAGS))
    ap.add_argument("--corrections", nargs="+", choices=variants.STALE_CORRECTIONS,
                    default=list(variants.STALE_CORRECTIONS))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=STEPS)
    ap.add_argument("--run-dir", type=Path, default=Path("runs/rollout_methods"))
    ap.add_argument("--set", nargs="*", default=[], help="config overrides for every cell, e.g. train.lr=1e-4")
    ap.add_argument("--finished-only", action="store_true", help="run nothing: gather the cells that completed")
    ap.add_argument("--out", type=Path, default=RESULTS / "rollout_methods.json")
    ap.add_argument("--wall-s", type=float, default=WALL_S, help="april: each arm's wall-time budget")
    ap.add_argument("--max-steps", type=int, default=100_000, help="april: each arm's step cap")
    ap.add_argument("--long-tail-set", nargs="*", default=list(LONG_TAIL),
                    help="april: the long-tail setting's overrides, on top of --set")
    add_loaded_flag(ap)
    args = ap.parse_args()
    # staleness reports accuracies (no load guard); april reports rates
    run = provenance.begin(timed=args.part == "april", loaded=args.loaded)
    extra = parse_set(args.set)
    started = time.monotonic()
    result: dict[str, Any] = json.loads(args.out.read_text()) if args.out.exists() else {}
    result.pop("provenance", None)
    if args.part == "april":
        result["april"] = april(args, extra)
        result["april_setup"] = {"wall_s": args.wall_s, "max_steps": args.max_steps, "seed": args.seeds[0],
                                 "overrides": extra, "long_tail": parse_set(args.long_tail_set)}
        result["wall_s_this_run"] = time.monotonic() - started
        write(args.out, provenance.stamp(result, run, runs=1))
        april_part = result["april"]
        print(f"rollout_methods: april throughput x{april_part['throughput_ratio_vs_sync']} "
              f"(long tail x{april_part['throughput_ratio_long_tail']}), held-out "
              f"{april_part['heldout_at_equal_wall_time']}")
        return
    # lags not given this time keep what the file has (raising S adds to the part instead of replacing it)
    result[args.part] = {**result.get(args.part, {}), **staleness(args, extra)}
    result[f"{args.part}_setup"] = {"steps": args.steps, "seeds": args.seeds, "overrides": extra,
                                    "complete": all(len(c["seeds_done"]) == len(args.seeds)
                                                    for per_lag in result[args.part].values()
                                                    for c in per_lag.values())}
    result["wall_s_this_run"] = time.monotonic() - started
    write(args.out, provenance.stamp(result, run, runs=len(args.seeds)))
    print("rollout_methods: " + summary_line(result[args.part]))


def write(out: Path, result: dict[str, Any]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")


def summary_line(part: dict[str, Any]) -> str:
    cells = []
    for lag, per_correction in part.items():
        shown = [f"{name} {c['heldout_acc_mean']:.3f}±{c['heldout_acc_std']:.3f}"
                 if c["heldout_acc_mean"] is not None else f"{name} -" for name, c in per_correction.items()]
        cells.append(f"S={lag}: " + ", ".join(shown))
    return "; ".join(cells)


if __name__ == "__main__":
    main()
