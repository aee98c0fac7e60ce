"""Rollout methods measured by the final policy's held-out accuracy. Part "staleness": corrections of stale rollouts;
part "selection": difficulty-targeted prompts against uniform selection at equal generated tokens; part "april":
partial rollouts against the synchronous step (bench/april_arms.py says what it measures).

Part "staleness" (issue 31, item 2): one node alone trains at a fixed lag S, the batch trained at version v sampled
by version max(0, v - S) (simulations/fixed_lag.py), for every S in --lags, every correction in --corrections
(`train.stale_correction.kind`: none, tis, m2po, vcpo; rl/stale.py) and every seed. A cell (S, correction, seed)
reports the final policy's greedy accuracy on run.eval_problems held-out problems (never drawn for training), not
the training reward (that is the old policy's). Each cell keeps its result in <run-dir>/staleness/S<S>/<correction>/
seed<seed>/result.json with its fingerprint (the cell's config, S, the default model's recipe and the code version,
simulations/code_version.py): a finished cell with the same fingerprint is reused, any other is run again from its
start (a cell is the unit of resumption). Writes bench/results/rollout_methods.json (or --out), keeping the file's
other parts and the lags not given this time: "staleness": {"<S>": {"<correction>": {"heldout_acc_mean",
"heldout_acc_std", "per_seed", "seeds_done"}}}, and prints one line. Every run then draws each part the file holds
to rollout_methods_<part>.png beside it (bench/rollout_methods_plot.py, the README's plots).

    python -m bench.rollout_methods --part staleness [--lags 1 4 16 64] [--corrections none tis m2po vcpo]
                                    [--seeds 0 1 2] [--steps 256] [--run-dir runs/rollout_methods]
                                    [--set train.lr=1e-4 ...] [--finished-only] [--out PATH]

Part "selection" (issue 31, item 3): bench/rollout_selection.py says what it measures and writes.

    python -m bench.rollout_methods --part april [--wall-s 1800] [--max-steps 100000] [--seeds 0]
                                    [--long-tail-set sampler.max_new_tokens=320 ...] [--set ...] [--loaded]

Part "april" writes "april": {"throughput_ratio_vs_sync", "throughput_ratio_long_tail", "heldout_at_equal_wall_time":
{"sync", "april", "paired_diff_ci95"}, "p95_over_median": {"base", "long_tail"}, "arms"} from the first seed given.
Each arm (setting, mode) is a cell kept and reused like the others (<run-dir>/april/<setting>/<mode>/seed<seed>);
it reports rates, so every arm refuses a loaded machine when it starts (bench/load_guard.py) unless --loaded, and
records the load it saw; it first waits up to 5 minutes for the load the previous arm left to decay.

To use several cores, run one process per seed (or per lag) with the same --run-dir, then once more with
--finished-only to gather every cell. Run a long sweep from a pinned worktree (bench/README.md).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from bench import april_arms, provenance
from bench.load_guard import add_loaded_flag, wait_to_settle
from bench.report_rows_scale import april_text
from bench.rollout_cells import cell_log, fingerprint, finished, fresh_cell
from bench.rollout_methods_plot import plot_all
from bench.rollout_selection import ARMS, TOKENS, selection, selection_line, selection_setup
from bench.solo_learning import parse_set
from simulations.fixed_lag import run_fixed_lag_cell
from swarm_node import variants

RESULTS = Path(__file__).parent / "results"
PARTS = ("staleness", "selection", "april")
WALL_S = 1800.0  # april: each arm's wall-time budget
# april: the largest budget the default model's context (512) admits beside its longest prompt (153 ids, gcd): the
# issue asks for one where the 95th percentile of completion lengths is >= 4x the median, which this model never
# reaches (docs/ROLLOUT_METHODS.md); the part reports the ratio it saw ("p95_over_median")
LONG_TAIL = ("sampler.max_new_tokens=320",)
LAGS = (1, 4, 16, 64)
STEPS = 256  # 4 x the largest default lag


def cell_overrides(correction: str, seed: int, steps: int, extra: dict[str, Any]) -> dict[str, Any]:
    """The cell's config as dotted overrides (its run dir is added where it runs)."""
    return {**extra, "run.seed": seed, "run.steps": steps, "run.checkpoint_every": steps, "status.port": -1,
            "train.stale_correction.kind": correction}


def cell_dir(run_dir: Path, lag: int, correction: str, seed: int) -> Path:
    return run_dir / "staleness" / f"S{lag}" / correction / f"seed{seed}"


def run_cell(run_dir: Path, lag: int, correction: str, seed: int, steps: int,
             extra: dict[str, Any]) -> dict[str, Any]:
    """The cell's result: reused when finished on this code and config, else run from its start."""
    overrides = cell_overrides(correction, seed, steps, extra)
    key = fingerprint(lag, overrides)
    root = cell_dir(run_dir, lag, correction, seed)
    if (done := finished(root, key)) is not None:
        return done
    name = f"S={lag} {correction} seed {seed}"
    result = fresh_cell(root, key, overrides, {"correction": correction, "seed": seed},
                        lambda cfg: run_fixed_lag_cell(cfg, lag, log=cell_log(name)))
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


def staleness_setup(args: argparse.Namespace, extra: dict[str, Any], part: dict[str, Any]) -> dict[str, Any]:
    return {"steps": args.steps, "seeds": args.seeds, "overrides": extra,
            "complete": all(len(c["seeds_done"]) == len(args.seeds) for per_lag in part.values()
                            for c in per_lag.values())}


def april(args: argparse.Namespace, extra: dict[str, Any]) -> dict[str, Any]:
    """Both arms on the long-tail setting (the target's: first, so a setting the model cannot run fails early),
    then on the base one, from the first seed; each arm a cell, kept and reused like the other parts' cells."""
    long_tail = {**extra, **parse_set(args.long_tail_set)}
    settings = {setting: {mode: run_april_arm(args, setting, mode, overrides) for mode in april_arms.MODES}
                for setting, overrides in (("long_tail", long_tail), ("base", extra))}
    return april_arms.summarise(settings["base"], settings["long_tail"])


def run_april_arm(args: argparse.Namespace, setting: str, mode: str,
                  extra: dict[str, Any]) -> dict[str, Any] | None:
    """One arm for --wall-s seconds; None: not finished and --finished-only. It reports a rate, so each arm checks
    the machine is idle when it starts (arms may run in different sessions) and records the load it saw."""
    overrides = {**extra, "run.seed": args.seeds[0], "run.steps": args.max_steps,
                 "run.checkpoint_every": args.max_steps, "status.port": -1, "run.rollout.kind": mode}
    key = fingerprint(int(args.wall_s), overrides)  # the wall time stands where a staleness cell has its lag
    root = args.run_dir / "april" / setting / mode / f"seed{args.seeds[0]}"
    if (done := finished(root, key)) is not None or args.finished_only:
        return done
    if not args.loaded:
        wait_to_settle()  # the previous arm, in this process, left the 1-minute load average high
    load = provenance.begin(timed=True, loaded=args.loaded).load_avg_start
    name = f"{setting} {mode}"
    result = fresh_cell(root, key, overrides, {"setting": setting, "load_avg_start": load},
                        lambda cfg: april_arms.run_arm(cfg, args.wall_s, args.max_steps, log=cell_log(name)))
    print(f"{name}: {result['steps']} steps, {result['throughput']:.1f} tokens/s to training, completion length "
          f"p50 {result['completion_len_p50']} p95 {result['completion_len_p95']}, held-out {result['heldout_acc']}",
          flush=True)
    return result


def april_setup(args: argparse.Namespace, extra: dict[str, Any], part: dict[str, Any]) -> dict[str, Any]:
    return {"wall_s": args.wall_s, "max_steps": args.max_steps, "seed": args.seeds[0], "overrides": extra,
            "long_tail": parse_set(args.long_tail_set)}


# part -> (run it, its setup record)
PART_RUNNERS = {"staleness": (staleness, staleness_setup), "selection": (selection, selection_setup),
                "april": (april, april_setup)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", choices=PARTS, default="staleness")
    ap.add_argument("--lags", type=int, nargs="+", default=list(LAGS))
    ap.add_argument("--corrections", nargs="+", choices=variants.STALE_CORRECTIONS,
                    default=list(variants.STALE_CORRECTIONS))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=STEPS)
    ap.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS))
    ap.add_argument("--swarm-external", type=int, default=4, help="selection: external groups per swarm update")
    ap.add_argument("--tokens", type=int, default=TOKENS, help="selection: generated tokens per cell")
    ap.add_argument("--wall-s", type=float, default=WALL_S, help="april: each arm's wall-time budget")
    ap.add_argument("--max-steps", type=int, default=100_000, help="april: each arm's step cap")
    ap.add_argument("--long-tail-set", nargs="*", default=list(LONG_TAIL),
                    help="april: the long-tail setting's overrides, on top of --set")
    add_loaded_flag(ap)
    ap.add_argument("--run-dir", type=Path, default=Path("runs/rollout_methods"))
    ap.add_argument("--set", nargs="*", default=[], help="config overrides for every cell, e.g. train.lr=1e-4")
    ap.add_argument("--finished-only", action="store_true", help="run nothing: gather the cells that completed")
    ap.add_argument("--out", type=Path, default=RESULTS / "rollout_methods.json")
    args = ap.parse_args()
    # staleness and selection report accuracies (no load guard); april reports rates
    run = provenance.begin(timed=args.part == "april" and not args.finished_only, loaded=args.loaded)
    extra = parse_set(args.set)
    started = time.monotonic()
    result: dict[str, Any] = json.loads(args.out.read_text()) if args.out.exists() else {}
    result.pop("provenance", None)
    run_part, setup = PART_RUNNERS[args.part]
    # lags (arms) not given this time keep what the file has (raising S adds to the part instead of replacing it)
    result[args.part] = {**result.get(args.part, {}), **run_part(args, extra)}
    result[f"{args.part}_setup"] = setup(args, extra, result[args.part])
    result["wall_s_this_run"] = time.monotonic() - started
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(provenance.stamp(result, run, runs=len(args.seeds)), indent=1) + "\n")
    print("rollout_methods: " + SUMMARY_LINES[args.part](result[args.part]))
    plot_all(result, args.out.parent)  # every part, not only this run's: the plots follow the file


def summary_line(part: dict[str, Any]) -> str:
    cells = []
    for lag, per_correction in part.items():
        shown = [f"{name} {c['heldout_acc_mean']:.3f}±{c['heldout_acc_std']:.3f}"
                 if c["heldout_acc_mean"] is not None else f"{name} -" for name, c in per_correction.items()]
        cells.append(f"S={lag}: " + ", ".join(shown))
    return "; ".join(cells)


SUMMARY_LINES = {"staleness": summary_line, "selection": selection_line, "april": april_text}  # april: the README's


if __name__ == "__main__":
    main()
