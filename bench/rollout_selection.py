"""Part "selection" of bench/rollout_methods.py (issue 31, item 3): difficulty-targeted prompts against uniform
selection at equal generated tokens.

One node alone per arm (`SELECTION_ARMS`: uniform; adaptive, the `adaptive` task selection; adaptive_dars, with the
`dars` rollout allocation too) and seed trains until it generated --tokens completion tokens
(simulations/selection_cell.py), in the regime --set gives (the testbed's `hard` regime for the measurement). Cells
are kept and reused (bench/rollout_cells.py; <run-dir>/selection/<arm>/seed<seed>). The swarm arms (`SWARM_ARMS`):
SWARM_NODES SAPO nodes in one process (simulations/runner.py, sync mode over the memory transport) with
--swarm-external external groups per update, for as many rounds as the uniform cell of the same seed took steps
(each node generates about the uniform cell's tokens): adaptive_swarm, the adaptive selection fed by its peers'
re-scored groups too (`task.adaptive_from_peers`), and its control uniform_swarm, the same swarm selecting
uniformly (what sharing alone does, so that adaptive_swarm's difference from it is the selection's). A swarm cell's
numbers are the means over nodes, its held-out outcomes per question the mean over nodes (the nodes share the task
seed, so the questions are uniform's).

Writes "selection": {"<arm>": {"signal_frac", "gen_tokens", "cum_reward", "heldout_acc", "heldout_ci95",
"seeds_done"}}, every arm but uniform with "heldout_vs_uniform_paired": {"diff", "ci95"} and adaptive_swarm also
with "heldout_vs_uniform_swarm_paired" (swarm_node/train/eval_stats.py: seeds, then questions, resampled; the
pairs are the same held-out questions).

    python -m bench.rollout_methods --part selection [--arms uniform adaptive adaptive_dars uniform_swarm
                                    adaptive_swarm] [--tokens 1150000] [--seeds 0 1 2] [--swarm-external 4]
                                    [--set task.mix=... ...]
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any

from bench.rollout_cells import cell_log, fingerprint, finished, fresh_cell
from simulations.cells import cell_dir as sim_cell_dir
from simulations.results import METRICS_CSV, read_rows
from simulations.runner import finished_result
from simulations.runner import run_cell as run_swarm_cell
from simulations.scenario import parse_scenario
from simulations.selection_cell import run_selection_cell
from swarm_node.config import load_config
from swarm_node.config.loading import nest
from swarm_node.train import eval_stats

# Generated completion tokens per selection cell: what an 8/0 node of the regimes grid generates in its 200 rounds
# (1.14 M, bench/results/sapo_regimes.json), so the selection arms learn over as long a run as the grid's nodes.
TOKENS = 1_150_000
# The selection arms: config overrides over the regime's. "uniform" is the baseline the others pair with.
SELECTION_ARMS: dict[str, dict[str, Any]] = {
    "uniform": {"task.selection": "uniform"},
    "adaptive": {"task.selection": "adaptive"},
    "adaptive_dars": {"task.selection": "adaptive", "run.rollout_allocation": "dars"},
}
BASELINE = "uniform"
# The swarm arms: config overrides over the regime's; SWARM_BASELINE pairs with the others too.
SWARM_ARMS: dict[str, dict[str, Any]] = {
    "uniform_swarm": {"task.selection": "uniform"},
    "adaptive_swarm": {"task.selection": "adaptive", "task.adaptive_from_peers": True},
}
SWARM_BASELINE = "uniform_swarm"
SWARM_NODES = 4
ARMS = (*SELECTION_ARMS, *SWARM_ARMS)


def selection_overrides(arm: str, seed: int, extra: dict[str, Any]) -> dict[str, Any]:
    # run.steps only bounds a cell that never reaches its token budget
    return {"run.steps": 100_000, **extra, **SELECTION_ARMS[arm], "run.seed": seed, "run.checkpoint_every": 100_000,
            "status.port": -1}


def run_selection(run_dir: Path, arm: str, seed: int, tokens: int, extra: dict[str, Any],
                  finished_only: bool) -> dict[str, Any] | None:
    """The arm's cell for one seed: reused when finished on this code and config, else run from its start (None:
    not finished and `finished_only`)."""
    overrides = selection_overrides(arm, seed, extra)
    key = fingerprint(tokens, overrides)  # the token budget stands where a staleness cell has its lag
    root = run_dir / "selection" / arm / f"seed{seed}"
    if (done := finished(root, key)) is not None or finished_only:
        return done
    name = f"{arm} seed {seed}"
    result = fresh_cell(root, key, overrides, {"arm": arm, "seed": seed},
                        lambda cfg: run_selection_cell(cfg, tokens, log=cell_log(name)))
    print(f"{name}: signal {result['signal_frac']}, held-out {result['heldout_acc']} ({result['wall_s']:.0f} s)",
          flush=True)
    return result


def run_swarm(run_dir: Path, arm: str, seed: int, rounds: int, external: int, extra: dict[str, Any],
              finished_only: bool) -> dict[str, Any] | None:
    """A swarm arm's cell for one seed, in a selection cell's terms (module docstring); None: not finished and
    `finished_only`. simulations/runner.py keeps, reuses and resumes it."""
    overrides = {**extra, **SWARM_ARMS[arm], "share.external_groups": external}
    eval_problems = load_config(None, overrides).run.eval_problems
    scn = parse_scenario({"simulation": {"nodes": SWARM_NODES, "rounds": rounds, "eval_problems": eval_problems,
                                         "seeds": [seed], "mode": "sync"},
                          "config": nest(overrides)}, arm)
    root = run_dir / "selection" / arm
    variant = scn.variants[0]
    if finished_only and finished_result(scn, variant, seed, root) is None:
        return None
    print(f"{arm} seed {seed}: {SWARM_NODES} nodes, {rounds} rounds", flush=True)
    result = run_swarm_cell(scn, variant, seed, root, log=cell_log(arm))
    rows = read_rows(sim_cell_dir(root, variant.name, seed) / METRICS_CSV)
    per_node = result.get("final_eval_outcomes_per_node") or []
    return swarm_summary(arm, seed, rows, result, per_node)


def swarm_summary(arm: str, seed: int, rows: list[dict[str, Any]], result: dict[str, Any],
                  per_node: list[dict[str, float]]) -> dict[str, Any]:
    """A swarm cell as a selection cell: means over nodes; held-out outcomes the mean over nodes per question."""
    def total(key: str) -> float:
        return sum(float(r[key]) for r in rows if r.get(key) not in (None, ""))

    nodes = max(1, len({r["node"] for r in rows}))
    groups, with_signal = total("groups_total"), total("groups_used")
    outcomes = eval_stats.mean_over_nodes(per_node)
    return {"arm": arm, "seed": seed, "steps": result["rounds"], "gen_tokens": total("gen_tokens") / nodes,
            "groups": groups / nodes, "groups_with_signal": with_signal / nodes,
            "signal_frac": with_signal / groups if groups else None, "cum_reward": result["cum_reward"],
            "heldout_acc": result.get("final_eval_acc"), "heldout_outcomes": outcomes}


def paired(cells: list[dict[str, Any]], baseline: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The held-out difference of `cells` against `baseline` on their common seeds (None: no common seed)."""
    base = {c["seed"]: c["heldout_outcomes"] for c in baseline if c.get("heldout_outcomes")}
    pairs = [eval_stats.paired_values(c["heldout_outcomes"], base[c["seed"]]) for c in cells
             if c.get("heldout_outcomes") and c["seed"] in base]
    estimate = eval_stats.seeds_then_questions(pairs) if pairs else None
    return None if estimate is None else {"diff": estimate.mean, "ci95": list(estimate.ci95)}


def summarise_arm(cells: list[dict[str, Any]], baselines: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """An arm over its seeds, with the paired held-out difference against each baseline's cells ("heldout_vs_<name>
    _paired")."""
    def mean(key: str) -> float | None:
        values = [c[key] for c in cells if c.get(key) is not None]
        return statistics.fmean(values) if values else None

    evaluated = [c for c in cells if c.get("heldout_outcomes")]
    out: dict[str, Any] = {"signal_frac": mean("signal_frac"), "gen_tokens": mean("gen_tokens"),
                           "cum_reward": mean("cum_reward"), "heldout_acc": mean("heldout_acc"),
                           "heldout_ci95": None, "seeds_done": [c["seed"] for c in cells]}
    if evaluated:
        out["heldout_ci95"] = list(eval_stats.seeds_then_questions([c["heldout_outcomes"] for c in evaluated]).ci95)
    for name, baseline in baselines.items():
        out[f"heldout_vs_{name}_paired"] = paired(cells, baseline)
    return out


def selection(args: argparse.Namespace, extra: dict[str, Any]) -> dict[str, Any]:
    arms = [BASELINE] + [a for a in args.arms if a != BASELINE]  # the baseline's cells pair with every arm
    cells = {arm: [c for seed in args.seeds
                   if (c := run_selection(args.run_dir, arm, seed, args.tokens, extra, args.finished_only))]
             for arm in arms if arm in SELECTION_ARMS}
    for arm in (a for a in SWARM_ARMS if a in arms):  # as many rounds as the uniform cell of its seed took steps
        cells[arm] = [c for base in cells[BASELINE]
                      if (c := run_swarm(args.run_dir, arm, base["seed"], base["steps"], args.swarm_external, extra,
                                         args.finished_only))]

    def baselines(arm: str) -> dict[str, list[dict[str, Any]]]:  # a swarm arm pairs with the swarm's too
        names = [BASELINE, SWARM_BASELINE] if arm in SWARM_ARMS else [BASELINE]
        return {name: cells[name] for name in names if name != arm and name in cells}

    return {arm: summarise_arm(cells[arm], baselines(arm)) for arm in arms}


def selection_setup(args: argparse.Namespace, extra: dict[str, Any], part: dict[str, Any]) -> dict[str, Any]:
    return {"tokens": args.tokens, "seeds": args.seeds, "overrides": extra,
            "complete": all(len(arm["seeds_done"]) == len(args.seeds) for arm in part.values())}


def selection_line(part: dict[str, Any]) -> str:
    def num(value: float | None) -> str:
        return "-" if value is None else f"{value:.3f}"
    return "; ".join(f"{arm}: signal {num(c['signal_frac'])}, held-out {num(c['heldout_acc'])}"
                     for arm, c in part.items())
