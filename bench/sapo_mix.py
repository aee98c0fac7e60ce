"""SAPO on a task mix: does a node that shares learn faster than a node alone?

Two scenarios over simulations/scenarios/sapo_mix.toml (N nodes, lockstep rounds, in-memory transport, the
default task mix):
- homogeneous (the paper's setting): every node draws from the same mix. Five configurations: the I/J grid 8/0,
  6/2, 4/4, 2/6 with the default external correction, and 4/4 with correction "none" (the paper's choice). Every
  configuration uses 8/0's hyper-parameters except I, J and the correction.
- specialised: node i draws 70% of its prompts from specialty i (mod the mix) and 30% from the whole mix, and
  accepts the whole mix from peers. Three arms at equal local completions (I = 4 per round):
  `swarm` (these nodes, J = 4), `solo_specialist` (the same nodes, J = 0), `solo_generalist` (nodes alone,
  drawing the whole mix, J = 0: N of them per seed, for N samples of one node alone).
- controls (not part of the issue's grid; an extra question): is a sharing node's reward bought with its peers'
  data, or would it learn as well from its own few completions? 2/0 and 4/0 are 2/6 and 4/4 without the peers:
  the same local completions per round. `controls[...]["sharing_gain_pct"]` is the sharing configuration's
  cumulative reward over its control's, on the seeds both finished.
Measures: cumulative reward per local completion at equal rounds (the paper's measure: sum over rounds of the
mean reward per LOCAL completion, mean over nodes), final greedy accuracy on held-out problems (never drawn for
training: swarm_node/tasks/heldout.py), per specialty, and reward against local completion tokens generated
(the compute sharing saves). Cells resume mid-run (snapshots every `checkpoint_rounds`), never run in CI.
Writes bench/results/sapo_mix.json (or --out) and one plot per scenario beside it, and prints one line.

    python -m bench.sapo_mix [--scenario homogeneous|specialised|both|controls] [--rounds N] [--seeds 0 1 2]
                             [--nodes N] [--run-dir runs/sapo_mix] [--out PATH] [--cells NAME ...]

To use both cores, run one process per seed (`--seeds K`, same --run-dir), then once more without --seeds to
gather every cell into the results.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from pathlib import Path
from typing import Any

from bench import provenance
from bench.sapo_paper import add_gains_vs_8_0
from simulations.report import moving_average, node_mean_curve
from simulations.runner import cell_dir, finished_result, read_rows, run_cell
from simulations.scenario import Scenario, Variant, load_scenario, with_overrides
from swarm_node import tasks
from swarm_node.config import build_config

RESULTS = Path(__file__).parent / "results"
SCENARIO = Path(__file__).resolve().parents[1] / "simulations" / "scenarios" / "sapo_mix.toml"
OWN_SHARE = 0.7  # specialised: a node's prompts from its own specialty (the rest from the whole mix)


def share(local: int, external: int, **extra: Any) -> dict[str, Any]:
    return {"share": {"local_groups": local, "external_groups": external, **extra}}


HOMOGENEOUS = [Variant("8/0", share(8, 0)), Variant("6/2", share(6, 2)), Variant("4/4", share(4, 4)),
               Variant("2/6", share(2, 6)), Variant("4/4+none", share(4, 4, correction={"kind": "none"}))]
CONTROLS = {"2/0": "2/6", "4/0": "4/4"}  # control (J = 0) -> the sharing configuration with its local completions


def mix_of(scn: Scenario) -> list[dict[str, Any]]:
    """The scenario's mix as config entries (name, options): what every node of the homogeneous scenario draws."""
    cfg = build_config([(scn.config, f" in scenario {scn.name!r}")])
    source = cfg.task.build_source()
    return [{"name": s.name, "options": json.loads(s.config)} for s in source.mix]


def specialised_arms(scn: Scenario) -> tuple[Scenario, Scenario, list[str]]:
    """(the N specialised nodes with node-level mixes, N generalist nodes, each node's specialty). The generalists
    draw the whole mix with J = 0, so each is a node alone: N of them are N samples of `solo_generalist`."""
    mix = mix_of(scn)
    if len(mix) < 2:
        raise SystemExit("the specialised scenario needs a task mix of at least two specialties")
    rest = (1 - OWN_SHARE) / len(mix)
    specs, own = [], []
    for i in range(scn.nodes):
        mine = mix[i % len(mix)]["name"]
        own.append(mine)
        weighted = [{**e, "weight": OWN_SHARE + rest if e["name"] == mine else rest} for e in mix]
        task = {"mix": weighted, "accept": mix, "selection": "weighted"}
        specs.append(dataclasses.replace(scn.node_spec(i), config={"task": task}))
    specialised = dataclasses.replace(scn, node_specs=tuple(specs))
    generalist = dataclasses.replace(scn, node_specs=())
    return specialised, generalist, own


def stats(values: list[float]) -> tuple[float | None, float | None]:
    if not values:
        return None, None
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def summarise_config(run_dir: Path, name: str, cells: list[dict[str, Any]]) -> dict[str, Any]:
    cum = [c["cum_reward"] for c in cells]
    evals = [c["final_eval_acc"] for c in cells if c["final_eval_acc"] is not None]
    cum_mean, cum_std = stats(cum)
    acc_mean, acc_std = stats(evals)
    return {"cum_reward_mean": cum_mean, "cum_reward_std": cum_std, "per_seed": cum,
            "final_eval_acc_mean": acc_mean, "final_eval_acc_std": acc_std, "final_eval_acc_per_seed": evals,
            "seeds_done": [c["seed"] for c in cells],
            "per_task_eval": per_task_mean([t for c in cells for t in c.get("final_eval_per_task_per_node", [])])}


def per_task_mean(per_node: list[dict[str, float]]) -> dict[str, float]:
    names = sorted({k for d in per_node for k in d})
    return {k: statistics.fmean(d[k] for d in per_node if k in d) for k in names}


def own_specialty_acc(cells: list[dict[str, Any]], own: list[str], generalist: bool = False) -> float | None:
    """Mean over cells and nodes of a node's held-out accuracy on its own specialty (node i owns own[i]). A
    generalist owns none: its number is its accuracy on each of the specialised nodes' specialties."""
    accs = []
    for c in cells:
        for i, per_task in enumerate(c.get("final_eval_per_task_per_node", [])):
            names = own if generalist else [own[i]]
            accs.extend(per_task[n] for n in names if n in per_task)
    return statistics.fmean(accs) if accs else None


def tokens_curve(rows: list[dict[str, Any]]) -> tuple[list[float], list[float]]:
    """(cumulative local completion tokens of the mean node, its moving-average local reward), per round."""
    by_round: dict[int, list[dict[str, Any]]] = {}
    for r in rows:
        by_round.setdefault(int(r["round"]), []).append(r)
    tokens, total = [], 0.0
    for rnd in sorted(by_round):
        gen = [float(r["gen_tokens"]) for r in by_round[rnd] if r.get("gen_tokens") not in ("", None)]
        total += statistics.fmean(gen) if gen else 0.0
        tokens.append(total)
    rewards = moving_average(node_mean_curve(rows))
    n = min(len(tokens), len(rewards))
    return tokens[:n], rewards[:n]


def plot(curves: dict[str, list[list[dict[str, Any]]]], path: Path, title: str) -> None:
    """Left: reward against rounds; right: reward against local completion tokens generated (mean node)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_round, by_tokens) = plt.subplots(1, 2, figsize=(11, 4))
    for name, runs in curves.items():
        per_seed = [tokens_curve(rows) for rows in runs if rows]
        if not per_seed:
            continue
        n = min(len(r) for _, r in per_seed)
        reward = [statistics.fmean(r[i] for _, r in per_seed) for i in range(n)]
        toks = [statistics.fmean(t[i] for t, _ in per_seed) for i in range(n)]
        by_round.plot(range(1, n + 1), reward, label=f"{name} ({len(per_seed)} seeds)")
        by_tokens.plot(toks, reward, label=name)
    by_round.set_xlabel("round")
    by_tokens.set_xlabel("local completion tokens generated (mean node)")
    for ax in (by_round, by_tokens):
        ax.set_ylabel("mean local reward (moving avg)")
        ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run_configs(scn: Scenario, variants: list[Variant], run_dir: Path, wanted: set[str] | None,
                finished_only: bool = False) -> dict[str, list[dict[str, Any]]]:
    """Each wanted configuration's cell results, seed by seed; with `finished_only`, only the cells that completed
    (nothing is run: a report of a grid still in progress)."""
    results: dict[str, list[dict[str, Any]]] = {v.name: [] for v in variants if not wanted or v.name in wanted}
    for seed in scn.seeds:
        for variant in variants:
            if variant.name not in results:
                continue
            if finished_only:
                if (done := finished_result(scn, variant, seed, run_dir)) is not None:
                    results[variant.name].append(done)
                continue
            started = time.monotonic()

            def progress(name: str, s: int, rnd: int, total: int, reward: float | None,
                         t: float = started) -> None:
                if rnd % 10 == 0 or rnd == total:
                    shown = "-" if reward is None else f"{reward:.3f}"
                    print(f"  [{name} seed {s}] round {rnd}/{total} mean local reward {shown} "
                          f"({time.monotonic() - t:.0f} s)", flush=True)

            result = run_cell(scn, variant, seed, run_dir, progress, log=print)
            results[variant.name].append(result)
            print(f"{variant.name} seed {seed}: cum reward {result['cum_reward']:.2f}, final eval "
                  f"{result['final_eval_acc']} ({result['wall_s']:.0f} s)", flush=True)
    return results


def curves_of(run_dir: Path, results: dict[str, list[dict[str, Any]]]) -> dict[str, list[list[dict[str, Any]]]]:
    return {name: [read_rows(cell_dir(run_dir, name, c["seed"]) / "metrics.csv") for c in cells]
            for name, cells in results.items()}


def homogeneous(scn: Scenario, run_dir: Path, wanted: set[str] | None, results_file: Path,
                finished_only: bool = False) -> dict[str, Any]:
    results = run_configs(scn, HOMOGENEOUS, run_dir / "homogeneous", wanted, finished_only)
    out = {name: summarise_config(run_dir / "homogeneous", name, cells) for name, cells in results.items()}
    add_gains_vs_8_0(out)
    plot(curves_of(run_dir / "homogeneous", results), results_file.with_name(f"{results_file.stem}_homogeneous.png"),
         f"SAPO on a task mix, homogeneous: {scn.nodes} nodes, G = 8")
    return out


def specialised(scn: Scenario, run_dir: Path, wanted: set[str] | None, results_file: Path,
                finished_only: bool = False) -> dict[str, Any]:
    nodes, alone, own = specialised_arms(scn)
    root = run_dir / "specialised"
    results = run_configs(nodes, [Variant("swarm", share(4, 4)), Variant("solo_specialist", share(4, 0))], root,
                          wanted, finished_only)
    results.update(run_configs(alone, [Variant("solo_generalist", share(4, 0))], root, wanted, finished_only))
    out = {}
    for name, cells in results.items():
        summary = summarise_config(root, name, cells)
        summary["own_specialty_acc_mean"] = own_specialty_acc(cells, own, generalist=name == "solo_generalist")
        out[name] = summary
    plot(curves_of(root, results), results_file.with_name(f"{results_file.stem}_specialised.png"),
         f"SAPO on a task mix, specialised ({OWN_SHARE:.0%} own specialty): {scn.nodes} nodes vs alone")
    return out


def sharing_gain_pct(control: list[dict[str, Any]], sharing: list[dict[str, Any]]) -> tuple[list[int], float | None]:
    """(the seeds both finished, the sharing cells' summed cumulative reward over the control's on them, in %)."""
    mine = {c["seed"]: c["cum_reward"] for c in control}
    theirs = {c["seed"]: c["cum_reward"] for c in sharing if c["seed"] in mine}
    if not theirs:
        return [], None
    return sorted(theirs), 100 * (sum(theirs.values()) / sum(mine[k] for k in theirs) - 1)


def controls(scn: Scenario, run_dir: Path, wanted: set[str] | None, results_file: Path,
             finished_only: bool = False) -> dict[str, Any]:
    """The J = 0 controls, beside the homogeneous cells they control (which are only read, never run here)."""
    root = run_dir / "homogeneous"
    variants = [Variant(name, share(int(name.split("/")[0]), 0)) for name in CONTROLS]
    results = run_configs(scn, variants, root, wanted, finished_only)
    reference = [v for v in HOMOGENEOUS if v.name in ("8/0", *CONTROLS.values())]
    shared = run_configs(scn, reference, root, None, finished_only=True)
    out = {}
    for name, cells in results.items():
        seeds, gain = sharing_gain_pct(cells, shared[CONTROLS[name]])
        out[name] = {**summarise_config(root, name, cells), "controls": CONTROLS[name], "paired_seeds": seeds,
                     "sharing_gain_pct": gain}
    plot(curves_of(root, {**shared, **results}),
         results_file.with_name(f"{results_file.stem}_controls.png"),
         f"Sharing against the same local completions without peers: {scn.nodes} nodes, G = 8")
    return out


def heldout_disjoint(scn: Scenario, draws: int = 2000) -> bool:
    """No training draw of the scenario's mix is a held-out problem (the partition's check, on this mix)."""
    import random

    cfg = build_config([(scn.config, f" in scenario {scn.name!r}")])
    source = cfg.task.build_source()
    train = {tasks.instance(r).question for r in source.draw(random.Random(0), draws)}
    held = {tasks.instance(r).question for r in source.eval_refs(scn.eval_problems)}
    return not train & held


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", choices=["homogeneous", "specialised", "both", "controls"], default="both")
    ap.add_argument("--file", type=Path, default=SCENARIO, help="the base scenario")
    ap.add_argument("--rounds", type=int)
    ap.add_argument("--seeds", type=int, nargs="+")
    ap.add_argument("--nodes", type=int)
    ap.add_argument("--run-dir", type=Path)
    ap.add_argument("--cells", nargs="+", help="only these configurations (e.g. 8/0 4/4)")
    ap.add_argument("--out", type=Path, default=RESULTS / "sapo_mix.json")
    ap.add_argument("--finished-only", action="store_true",
                    help="run nothing: report the cells that completed (a grid still in progress; `complete` false)")
    args = ap.parse_args()
    run = provenance.begin()  # rewards and accuracies: no time or rate, no load guard
    scn = with_overrides(load_scenario(args.file), rounds=args.rounds, nodes=args.nodes, seeds=args.seeds)
    run_dir = args.run_dir or Path(scn.run_dir)
    wanted = set(args.cells) if args.cells else None
    args.out.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    result: dict[str, Any] = {"heldout_disjoint": heldout_disjoint(scn), "nodes": scn.nodes, "rounds": scn.rounds,
                              "seeds": list(scn.seeds), "mix": mix_of(scn), "own_share": OWN_SHARE}
    if args.out.exists():  # keep the other scenario's results when only one is run
        previous = json.loads(args.out.read_text())
        result.update({k: previous[k] for k in ("homogeneous", "specialised", "controls") if k in previous})
    if args.scenario in ("homogeneous", "both"):
        result["homogeneous"] = homogeneous(scn, run_dir, wanted, args.out, args.finished_only)
    if args.scenario in ("specialised", "both"):
        result["specialised"] = specialised(scn, run_dir, wanted, args.out, args.finished_only)
    if args.scenario == "controls":
        result["controls"] = controls(scn, run_dir, wanted, args.out, args.finished_only)
    result["complete"] = all(len(c["seeds_done"]) == len(scn.seeds)
                             for part in ("homogeneous", "specialised") for c in result.get(part, {}).values())
    result["wall_s_this_run"] = time.monotonic() - started
    args.out.write_text(json.dumps(provenance.stamp(result, run, runs=len(scn.seeds)), indent=1) + "\n")
    print("sapo_mix: " + summary_line(result))


def summary_line(result: dict[str, Any]) -> str:
    parts = []
    for name, c in result.get("homogeneous", {}).items():
        if c["cum_reward_mean"] is None:
            parts.append(f"{name} -")
            continue
        gain = c.get("gain_vs_8_0_pct")
        parts.append(f"{name} cum {c['cum_reward_mean']:.2f}±{c['cum_reward_std']:.2f}"
                     + (f" ({gain:+.0f}% vs 8/0)" if gain is not None and name != "8/0" else ""))
    for name, c in result.get("controls", {}).items():
        gain = c.get("sharing_gain_pct")
        parts.append(f"{c['controls']} vs {name} " + ("-" if gain is None else f"{gain:+.1f}%"))
    for name, c in result.get("specialised", {}).items():
        acc, own = c.get("final_eval_acc_mean"), c.get("own_specialty_acc_mean")
        parts.append(f"{name} eval {acc:.3f}" if acc is not None else f"{name} eval -")
        if own is not None:
            parts[-1] += f" (own {own:.3f})"
    return "; ".join(parts) + (f"; {result['nodes']} nodes x {result['rounds']} rounds x {len(result['seeds'])} "
                               f"seeds; held-out disjoint {result['heldout_disjoint']}"
                               + ("" if result.get("complete", True) else "; grid INCOMPLETE"))


if __name__ == "__main__":
    main()
