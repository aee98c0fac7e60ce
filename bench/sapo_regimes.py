"""The sharing regime map (issue 30 item 5): does sharing pay where a node's own groups often carry no signal?

Two regimes of the fraction of a solo node's groups without signal, fixed in bench/sapo_regimes.toml
(bench/regimes_file.py): `hard` (>= 40%) and `medium` (<= 20%), each a task mix and G over the base scenario
(simulations/scenarios/sapo_mix.toml: lockstep rounds, in-memory transport). In each regime, N nodes per cell:
- the I/J grid 8/0, 4/4, 2/6 with SAPO's zero-advantage filter on external groups;
- the controls 4/0 and 2/0 (the same local completions, no external groups);
- `solo_ds`: nodes alone with dynamic sampling (`[run.rollout] kind = "dynamic"`: groups until 8 have signal, at
  most 4 x 8 per round; every generated token counted);
- in `hard` only, `4/4-nofilter` (`[share] filter_no_signal = false`), an ablation, never a candidate for "best".
Every cell runs 8/0's settings (the base scenario's and --set's) except what its name changes. Per cell it reports
bench/regimes_summary.CELL_KEYS; per regime the pilot's `no_signal_frac_solo` and the best I/J's gain over 8/0.
Cells resume per round (snapshots every `checkpoint_rounds`); a finished cell is reused. Writes
bench/results/sapo_regimes.json (or --out), a reward plot per regime (against rounds and against local completion
tokens generated, every arm) and the gain of the best I/J over 8/0 against the no-signal fraction, and prints one
line.

    python -m bench.sapo_regimes --pilot [--candidates default harder ...] 8/0, first seed, every candidate
    python -m bench.sapo_regimes [--regimes hard medium] [--seeds K] [--cells 8/0 4/4 ...] [--finished-only]
    common: [--rounds 200] [--seeds 0 1 2] [--nodes 4] [--eval-problems 4000] [--run-dir runs/sapo_regimes]
            [--file bench/sapo_regimes.toml] [--scenario PATH] [--set train.lr=1e-4 ...] [--out PATH]

The pilot's 8/0 cell is the grid's 8/0 cell of that seed (same run dir and fingerprint): the grid reuses it. The
grid refuses a regime that the regimes file has not fixed. To use several cores, run one process per seed
(`--seeds K`, same --run-dir), then once more without --seeds to gather; run it from a pinned worktree
(bench/README.md).
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path
from typing import Any

from bench import provenance
from bench.regimes_budget import GridPlan, grid_plan, solo_ds_factor
from bench.regimes_file import PATH as REGIMES_FILE
from bench.regimes_file import REGIMES, Candidate, Regimes, load_regimes, require_fixed
from bench.regimes_summary import BASELINE, best_ij, no_signal_frac, summarise_cell
from bench.sapo_mix import SCENARIO, curves_of, plot, run_configs, share
from bench.solo_learning import parse_set
from simulations.scenario import Scenario, Variant, parse_scenario
from swarm_node import tasks
from swarm_node.config import nest, read_toml
from swarm_node.errors import UserError
from swarm_node.train.dynamic_sampling import DEFAULT_MAX_FACTOR

RESULTS = Path(__file__).parent / "results"
ROUNDS, NODES, SEEDS, EVAL_PROBLEMS = 200, 4, (0, 1, 2), 4000
CELLS: dict[str, dict[str, Any]] = {  # cell name -> what it changes in 8/0's config
    "8/0": share(8, 0), "4/4": share(4, 4), "2/6": share(2, 6), "4/0": share(4, 0), "2/0": share(2, 0),
    "solo_ds": {**share(8, 0), "run": {"rollout": {"kind": "dynamic", "max_factor": DEFAULT_MAX_FACTOR}}},
    "4/4-nofilter": share(4, 4, filter_no_signal=False),
}
GRID = ("8/0", "4/4", "2/6", "4/0", "2/0", "solo_ds")  # every regime's cells; REGIMES[r].ablations add to them
DYNAMIC = {"solo_ds": DEFAULT_MAX_FACTOR}  # cells that sample dynamically -> their max_factor (their cost)


def regime_cells(regime: str) -> list[str]:
    return [*GRID, *REGIMES[regime].ablations]


def overlay(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    """`base` with `top`'s tables merged in, key by key (top's values win; lists are replaced whole)."""
    out = copy.deepcopy(base)
    for key, value in top.items():
        out[key] = overlay(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) \
            else copy.deepcopy(value)
    return out


def regime_scenario(base: Path, candidate: Candidate, args: argparse.Namespace, seeds: list[int]) -> Scenario:
    """The base scenario with the candidate's mix and G, --set's config and the command line's sizes."""
    data = read_toml(base, "scenario file")
    data["config"] = overlay(overlay(data.get("config", {}), candidate.config()), nest(parse_set(args.set)))
    data["simulation"] = {**data.get("simulation", {}), "rounds": args.rounds, "nodes": args.nodes,
                          "seeds": list(seeds), "eval_problems": args.eval_problems}
    return parse_scenario(data, f"sapo_regimes-{candidate.name}")


def check_eval(scn: Scenario, candidate: str) -> int:
    """The distinct held-out questions of the scenario's eval; a one-line UserError when the mix cannot supply
    --eval-problems distinct ones (an eval of repeated questions would claim power it does not have)."""
    source = scn.node_config(scn.variants[0], 0, scn.seeds[0], Path(".")).task.build_source()
    refs = source.eval_refs(scn.eval_problems)  # may itself refuse a split too small, in one line
    distinct = len({(r.dataset, tasks.instance(r).question) for r in refs})
    if distinct < scn.eval_problems:
        raise UserError(f"candidate {candidate!r}: an eval of {scn.eval_problems} held-out problems holds only "
                        f"{distinct} distinct questions (a repeated one adds no power); enlarge the mix's options, "
                        "lower --eval-problems, or draw distinct eval questions")
    return distinct


def pilot(args: argparse.Namespace, regimes: Regimes) -> dict[str, Any]:
    """8/0 on the first seed for each candidate: its no-signal fraction over all rounds, mean local reward,
    seconds per node-step (the cell's wall time, build and eval included, over nodes x rounds)."""
    names = args.candidates or list(regimes.candidates)
    out: dict[str, Any] = {}
    for name in names:
        if name not in regimes.candidates:
            raise UserError(f"--candidates: {name!r} is not one of {', '.join(regimes.candidates)}")
        scn = regime_scenario(args.scenario, regimes.candidates[name], args, args.seeds[:1])
        check_eval(scn, name)
        root = args.run_dir / name
        results = run_configs(scn, [Variant(BASELINE, CELLS[BASELINE])], root, None, args.finished_only)
        if not results[BASELINE]:
            out[name] = None
            continue
        cell = results[BASELINE][0]
        rows = curves_of(root, results)[BASELINE][0]
        rewards = [float(r["reward_mean"]) for r in rows if r.get("reward_mean") not in (None, "")]
        steps = [float(r["step_s"]) for r in rows if r.get("step_s") not in (None, "")]
        out[name] = {"no_signal_frac_solo": no_signal_frac(rows), "reward_mean": sum(rewards) / len(rewards),
                     "final_eval_acc": cell["final_eval_acc"], "group_size": regimes.candidates[name].group_size,
                     # the cell's wall time (build, rounds, final eval) per node-step: what the grid's cells cost
                     "s_per_node_step": cell["wall_s"] / (scn.nodes * scn.rounds),
                     "step_s_mean": sum(steps) / len(steps) if steps else None,  # a step's own generate + train
                     "seed": cell["seed"]}
    return out


def pilot_lines(measures: dict[str, Any], args: argparse.Namespace, regimes: Regimes) -> list[str]:
    lines = []
    for name, m in measures.items():
        if m is None:
            lines.append(f"pilot {name}: not finished")
            continue
        fits = [r.name for r in REGIMES.values() if r.fits(m["no_signal_frac_solo"])]
        lines.append(f"pilot {name}: no_signal_frac_solo {m['no_signal_frac_solo']:.3f} (fits: "
                     f"{', '.join(fits) or 'no regime'}), mean local reward {m['reward_mean']:.3f}, "
                     f"{m['s_per_node_step']:.2f} s per node-step")
        lines += [f"  to fix it: [fixed] {regime} = {{ candidate = {json.dumps(name)}, no_signal_frac_solo = "
                  f"{m['no_signal_frac_solo']:.4f}, pilot = \"<provenance.commit of the pilot's json>\" }}"
                  for regime in fits]
    plan = grid_plan_of(measures, args, regimes)
    if plan is not None:
        lines.append(plan.line())
    return lines


def grid_plan_of(measures: dict[str, Any], args: argparse.Namespace, regimes: Regimes) -> GridPlan | None:
    """The budget plan from the pilot: each regime's candidate (fixed, else the one named after it)."""
    chosen = {r: (regimes.fixed[r].candidate if r in regimes.fixed else r) for r in REGIMES}
    piloted = {r: measures[c] for r, c in chosen.items() if measures.get(c)}
    if not piloted:
        return None
    seconds = max(m["s_per_node_step"] for m in piloted.values())
    cells = {r: {c: solo_ds_factor(m["no_signal_frac_solo"], DYNAMIC[c]) if c in DYNAMIC else 1.0
                 for c in regime_cells(r)} for r, m in piloted.items()}
    return grid_plan(seconds, cells, len(args.seeds), args.nodes, args.rounds)


def grid(args: argparse.Namespace, regimes: Regimes) -> dict[str, Any]:
    fixed = require_fixed(regimes, args.regimes)
    wanted = set(args.cells) if args.cells else None
    out: dict[str, Any] = {}
    for name in args.regimes:
        candidate = regimes.candidates[fixed[name].candidate]
        scn = regime_scenario(args.scenario, candidate, args, args.seeds)
        check_eval(scn, candidate.name)
        root = args.run_dir / candidate.name
        variants = [Variant(c, CELLS[c]) for c in regime_cells(name)]
        results = run_configs(scn, variants, root, wanted, args.finished_only)
        if BASELINE not in results:  # the pairs' other half: read, never run here
            results[BASELINE] = run_configs(scn, variants[:1], root, None, finished_only=True)[BASELINE]
        rows = curves_of(root, results)
        cells = {c: summarise_cell(results[c], rows[c], results[BASELINE]) for c in regime_cells(name) if c in results}
        out[name] = {"no_signal_frac_solo": fixed[name].no_signal_frac_solo, "candidate": candidate.name,
                     "group_size": candidate.group_size, "cells": cells, "best_ij": best_ij(cells),
                     "seeds_done": {c: [r["seed"] for r in results[c]] for c in cells}}
        plot(rows, args.out.with_name(f"{args.out.stem}_{name}.png"),
             f"Regime {name} (candidate {candidate.name}, G = {candidate.group_size}): {scn.nodes} nodes")
    return out


def complete(regimes: dict[str, Any], seeds: list[int]) -> bool:
    """Every cell of every regime reported has finished every seed (a --cells subset is not the grid)."""
    return all(sorted(r["seeds_done"].get(c, [])) == sorted(seeds) for name, r in regimes.items()
               for c in regime_cells(name))


def plot_gain(regimes: dict[str, Any], path: Path) -> None:
    """The gain of 4/4 and 2/6 over 8/0 in cumulative reward against the regime's no-signal fraction (8/0's, over
    the grid's seeds; the pilot's where 8/0 has not finished), the best I/J marked."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, regime in regimes.items():
        cells = regime["cells"]
        base = cells.get(BASELINE, {})
        x = base.get("no_signal_frac") if base.get("no_signal_frac") is not None else regime["no_signal_frac_solo"]
        for cell, marker in (("4/4", "o"), ("2/6", "s")):
            c = cells.get(cell)
            if c is None or c["cum_reward_mean"] is None or not base.get("cum_reward_mean"):
                continue
            gain = 100 * (c["cum_reward_mean"] / base["cum_reward_mean"] - 1)
            best = (regime.get("best_ij") or {}).get("cell") == cell
            ax.scatter([x], [gain], marker=marker, s=80 if best else 30, label=f"{name} {cell}" + (" (best)" * best))
    ax.axhline(0.0, color="grey", linewidth=0.5)
    ax.set_xlabel("fraction of a solo node's groups without signal (8/0)")
    ax.set_ylabel("cumulative reward gain over 8/0 (%)")
    if ax.get_legend_handles_labels()[0]:  # no point before 8/0 and an I/J cell finished a seed
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def summary_line(result: dict[str, Any]) -> str:
    parts = []
    for name, regime in result["regimes"].items():
        best = regime.get("best_ij")
        base = regime["cells"].get(BASELINE, {})
        shown = "-" if best is None else f"best {best['cell']} {best['gain_vs_8_0_pct']:+.1f}% vs 8/0"
        frac = base.get("no_signal_frac")
        parts.append(f"{name} (no signal {regime['no_signal_frac_solo']:.2f} pilot"
                     + ("" if frac is None else f", {frac:.2f} grid") + f"): {shown}")
    return "; ".join(parts) + (f"; {result['nodes']} nodes x {result['rounds']} rounds x {len(result['seeds'])} "
                               "seeds" + ("" if result["complete"] else "; grid INCOMPLETE"))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pilot", action="store_true", help="8/0 on the first seed for every candidate (or --candidates)")
    ap.add_argument("--candidates", nargs="+", help="pilot: only these candidates")
    ap.add_argument("--regimes", nargs="+", default=list(REGIMES), choices=list(REGIMES), help="grid: these regimes")
    ap.add_argument("--cells", nargs="+", choices=list(CELLS), help="grid: only these cells")
    ap.add_argument("--file", type=Path, default=REGIMES_FILE, help="the regimes file [%(default)s]")
    ap.add_argument("--scenario", type=Path, default=SCENARIO, help="the base scenario [%(default)s]")
    ap.add_argument("--rounds", type=int, default=ROUNDS, help="[%(default)s]")
    ap.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS), help="[0 1 2]")
    ap.add_argument("--nodes", type=int, default=NODES, help="[%(default)s]")
    ap.add_argument("--eval-problems", type=int, default=EVAL_PROBLEMS,
                    help="distinct held-out questions each node is evaluated on at the end [%(default)s]")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a node config value for every cell (8/0's best solo hyper-parameters)")
    ap.add_argument("--run-dir", type=Path, default=Path("runs/sapo_regimes"), help="[%(default)s]")
    ap.add_argument("--out", type=Path, default=RESULTS / "sapo_regimes.json", help="[%(default)s]")
    ap.add_argument("--finished-only", action="store_true",
                    help="run nothing: report the cells that completed (`complete` false while some are missing)")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        regimes = load_regimes(args.file)
        run = provenance.begin()  # rewards and accuracies, and the pilot's seconds per node-step (not guarded)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        if args.pilot:
            measures = pilot(args, regimes)
            lines = pilot_lines(measures, args, regimes)
            pilot_out = args.out.with_name(f"{args.out.stem}_pilot.json")
            pilot_out.write_text(json.dumps(provenance.stamp(
                {"candidates": measures, "nodes": args.nodes, "rounds": args.rounds, "seed": args.seeds[0],
                 "eval_problems": args.eval_problems, "overrides": args.set, "lines": lines}, run, runs=1),
                indent=1) + "\n")
            print("\n".join(lines))
            return
        started = time.monotonic()
        result: dict[str, Any] = {"regimes": {}, "seeds": list(args.seeds), "nodes": args.nodes,
                                  "rounds": args.rounds}
        if args.out.exists():  # keep the other regimes' results when only some are run
            result["regimes"].update(json.loads(args.out.read_text()).get("regimes", {}))
        result["regimes"].update(grid(args, regimes))
        result["complete"] = complete(result["regimes"], args.seeds)
        result.update(eval_problems=args.eval_problems, overrides=args.set, wall_s_this_run=time.monotonic() - started)
        plot_gain(result["regimes"], args.out.with_name(f"{args.out.stem}_gain.png"))
        args.out.write_text(json.dumps(provenance.stamp(result, run, runs=len(args.seeds)), indent=1) + "\n")
        print("sapo_regimes: " + summary_line(result))
    except UserError as exc:
        raise SystemExit(f"error: {exc}") from None


if __name__ == "__main__":
    main()
