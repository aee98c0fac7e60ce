"""A byzantine swarm, measured (issue 14 item 6): what attackers cost honest nodes, with and without the defences.

Parts (--parts, default all; each adds its fields to the results file, keeping the other parts' fields):
- sim: simulations/scenarios/attack.toml (10 nodes, lockstep rounds, in-memory network model) per seed at attacker
  fractions 0 / 0.1 / 0.3 / 0.5 (attackers on the last indices, kinds cycling through simulations/byzantine.py's ATTACKS
  by seed), the same nodes training alone (J = 0), and 30% junk attackers with the well-formed defence on and off
  (simulations/attack_grid.py). Fields: fractions, kinds, honest_eval_acc, honest_eval_vs_clean (paired per node and
  seed), honest_solo_eval_acc, honest_eval_vs_solo (the same pairing against the nodes alone),
  honest_eval_paired_per_seed and honest_eval_paired_se (standard error over seeds), honest_eval_vs_solo_paired
  per fraction and f50_vs_alone_paired (its 0.5 entry: {diff, ci95, seeds, questions}, per question and seed,
  seeds then questions resampled; cells that kept per-question outcomes), bad_groups_trained (per kind,
  summed over cells; forged_reward counts only groups whose claimed rewards reached the loss), junk_groups_trained
  {with_defence, without}, external_groups_trained_per_step (per honest node per step). Cells resume mid-run
  (simulations/snapshots.py).
- junk: the separate small measurement of item 5: one honest node and one peer sending only verifier-passing junk,
  defence on and off, and the node alone (junk_pair: held-out accuracy and junk groups trained).
- live: one real honest `swarm-node join` pinned to core 0 (taskset) against simulations/attack_peers.py pinned to
  core 1 playing the rest of a `--nodes` swarm (honest identities and, at each fraction, attackers), in every run
  including the clean one, in --live-repeats rounds of every fraction: max_rss_mib (worst round) and
  steps_per_min_vs_clean (median of each round's ratio to its own clean run) per fraction, time_to_graylist_s per
  kind.
- kill: kill -9 at random points of real processes (cells mid-snapshot, `join` mid-checkpoint, ECHO-2 workers
  paused inside a delta's apply), then a resume (simulations/attack_kill.py): kill_resume {points, unusable_runs,
  by_target, cells: how the killed cells went on (resumed, redone from scratch, ...), failures}.

    python -m bench.attack [--parts sim junk live kill] [--rounds N] [--seeds 0 1 2] [--nodes N] [--variants V ...]
                           [--eval-problems N] [--live-seconds S] [--live-repeats R] [--kill-points K]
                           [--run-dir runs/attack] [--out P]

Small scale (minutes): --rounds 3 --seeds 0 --nodes 4 --eval-problems 8 --live-seconds 40 --live-repeats 1
--kill-points 3.
To use both cores for the sim part, run one process per seed (--parts sim --seeds K, same --run-dir), or split a
seed's cells with --variants, then once more with every seed to gather the cells. Never run in CI.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path
from typing import Any

from bench import provenance
from bench.load_guard import add_loaded_flag
from simulations.attack_grid import FRACTIONS, JUNK_OFF, JUNK_ON, SOLO, Cell, grid, summarise
from simulations.runner import finished_result, run_cell
from simulations.scenario import Scenario, Variant, load_scenario, with_overrides

RESULTS = Path(__file__).parent / "results"
SCENARIO = Path(__file__).resolve().parents[1] / "simulations" / "scenarios" / "attack.toml"
PARTS = ("sim", "junk", "live", "kill")


def run_cells(cells: list[Cell], run_dir: Path, finished_only: bool = False) -> list[dict[str, Any]]:
    """Each cell's result; with `finished_only`, only the cells that completed, and nothing is run."""
    results = []
    for cell in cells:
        if finished_only:
            if (done := finished_result(cell.scenario, cell.variant, cell.seed, run_dir)) is not None:
                results.append(done)
            continue
        started = time.monotonic()

        def progress(name: str, s: int, rnd: int, total: int, reward: float | None, t: float = started) -> None:
            if rnd % 10 == 0 or rnd == total:
                shown = "-" if reward is None else f"{reward:.3f}"
                print(f"  [{name} seed {s}] round {rnd}/{total} honest reward {shown} ({time.monotonic() - t:.0f} s)",
                      flush=True)

        result = run_cell(cell.scenario, cell.variant, cell.seed, run_dir, progress, log=print)
        print(f"{cell.variant.name} seed {cell.seed}: eval {result['final_eval_acc']}, bad trained "
              f"{result['bad_groups_trained']} ({result['wall_s']:.0f} s)", flush=True)
        results.append(result)
    return results


def select(cells: list[Cell], variants: list[str] | None) -> list[Cell]:
    """The cells of these variants, in the order the variants are named (every cell when none is named)."""
    if not variants:
        return cells
    return sorted((c for c in cells if c.variant.name in variants), key=lambda c: variants.index(c.variant.name))


def sim_part(scn: Scenario, run_dir: Path, variants: list[str] | None = None, finished_only: bool = False
             ) -> dict[str, Any]:
    """`variants` (names such as f0.3, solo, junk-defended) runs only those cells, in that order: one seed split
    over processes, or the cells a question needs first."""
    cells = select(grid(scn, FRACTIONS, scn.seeds), variants)
    results = run_cells(cells, run_dir / "grid", finished_only)
    return {**summarise(results, FRACTIONS), "sim_cells_done": len(results), "sim_cells": len(cells)}


def junk_part(scn: Scenario, run_dir: Path, finished_only: bool = False) -> dict[str, Any]:
    """One honest node beside one junk peer, defence on and off, and alone."""
    pair = dataclasses.replace(scn, nodes=2, attackers=((1, "junk"),))
    base = scn.variants[0].config
    share = dict(base.get("share", {}))
    arms = {"with_defence": (pair, Variant(JUNK_ON, base)),
            "without": (pair, Variant(JUNK_OFF, {**base, "share": {**share, "require_well_formed": False}})),
            "alone": (dataclasses.replace(scn, nodes=1, attackers=()),
                      Variant(SOLO, {**base, "share": {**share, "external_groups": 0}}))}
    out: dict[str, Any] = {}
    done = 0
    for arm, (s, variant) in arms.items():
        cells = [Cell(s, variant, seed, 0.5) for seed in scn.seeds]
        results = run_cells(cells, run_dir / "junk_pair", finished_only)
        done += len(results)
        accs = [r["final_eval_acc_per_node"]["0"] for r in results if r["final_eval_acc_per_node"]]
        out[arm] = {"honest_eval_acc": sum(accs) / len(accs) if accs else None, "per_seed": accs,
                    "junk_groups_trained": sum(r["bad_groups_trained"].get("junk", 0) for r in results)}
    return {"junk_pair": out, "junk_cells_done": done, "junk_cells": len(arms) * len(scn.seeds)}


def live_part(scn: Scenario, run_dir: Path, seconds: float, repeats: int) -> dict[str, Any]:
    from simulations.attack_live import measure_live

    return measure_live(scn, FRACTIONS, run_dir / "live", seconds, log=print, repeats=repeats)


def kill_part(scn: Scenario, run_dir: Path, points: int, scn_file: Path) -> dict[str, Any]:
    from simulations.attack_kill import kill_resume

    return {"kill_resume": kill_resume(scn, run_dir / "kill", points, log=print, scn_file=scn_file)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    ap.add_argument("--file", type=Path, default=SCENARIO, help="the base scenario")
    ap.add_argument("--rounds", type=int)
    ap.add_argument("--seeds", type=int, nargs="+")
    ap.add_argument("--nodes", type=int)
    ap.add_argument("--variants", nargs="+", help="sim part: only these cells, in this order "
                    "(f0.0 f0.1 f0.3 f0.5 solo junk-defended junk-undefended), to split a seed over processes")
    ap.add_argument("--eval-problems", type=int)
    ap.add_argument("--live-seconds", type=float, default=180.0, help="measured time per fraction (live part)")
    ap.add_argument("--live-repeats", type=int, default=3, help="rounds of every fraction (live part): medians")
    ap.add_argument("--kill-points", type=int, default=100)
    ap.add_argument("--run-dir", type=Path)
    ap.add_argument("--out", type=Path, default=RESULTS / "attack.json")
    ap.add_argument("--finished-only", action="store_true", help="sim and junk parts: run nothing, report the cells "
                    "that completed (a run still in progress: `complete` false)")
    add_loaded_flag(ap)
    args = ap.parse_args()
    run = provenance.begin(timed="live" in args.parts, loaded=args.loaded)
    scn = with_overrides(load_scenario(args.file), rounds=args.rounds, nodes=args.nodes,
                         eval_problems=args.eval_problems, seeds=args.seeds)
    run_dir = args.run_dir or Path(scn.run_dir)
    started = time.monotonic()
    result: dict[str, Any] = json.loads(args.out.read_text()) if args.out.exists() else {}
    scale = result.get("scale", {})
    for part in PARTS:
        if part not in args.parts:
            continue
        if part == "sim":
            result.update(sim_part(scn, run_dir, args.variants, args.finished_only))
        elif part == "junk":
            result.update(junk_part(scn, run_dir, args.finished_only))
        elif part == "live":
            result.update(live_part(scn, run_dir, args.live_seconds, args.live_repeats))
        else:
            result.update(kill_part(scn, run_dir, args.kill_points, args.file))
        scale[part] = {"nodes": scn.nodes, "rounds": scn.rounds, "seeds": list(scn.seeds),
                       "eval_problems": scn.eval_problems, "live_seconds": args.live_seconds,
                       "live_repeats": args.live_repeats, "kill_points": args.kill_points}
    result["scale"] = scale
    result["complete"] = complete(result)
    result["wall_s_this_run"] = time.monotonic() - started
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result = provenance.stamp(result, run, runs=args.live_repeats if "live" in args.parts else None)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print("attack: " + summary_line(result))


def complete(result: dict[str, Any]) -> bool:
    """Every part present, and every cell of the sim and junk parts finished (--finished-only may report fewer)."""
    return (all(k in result for k in ("honest_eval_acc", "junk_pair", "max_rss_mib", "kill_resume"))
            and result["sim_cells_done"] == result["sim_cells"] and result["junk_cells_done"] == result["junk_cells"])


def summary_line(result: dict[str, Any]) -> str:
    parts = []
    for f, acc in result.get("honest_eval_acc", {}).items():
        vs = result.get("honest_eval_vs_clean", {}).get(f)
        parts.append(f"{f}: eval {acc:.3f}" + (f" ({vs:+.3f} vs clean)" if vs is not None else "")
                     if acc is not None else f"{f}: eval -")
    if "honest_eval_vs_solo" in result:
        se = result["honest_eval_paired_se"]["vs_solo"]
        parts.append("vs alone " + ", ".join(f"{f}: {d:+.3f}" + (f" (SE {se[f]:.3f})" if se.get(f) else "")
                                            for f, d in result["honest_eval_vs_solo"].items() if d is not None))
    if (f50 := result.get("f50_vs_alone_paired")) is not None:
        low, high = f50["ci95"]
        parts.append(f"f0.5 vs alone paired {100 * f50['diff']:+.1f} pts [{100 * low:+.1f}, {100 * high:+.1f}] "
                     f"({f50['seeds']} seeds x {f50['questions']} questions)")
    if "bad_groups_trained" in result:
        parts.append(f"bad trained {sum(result['bad_groups_trained'].values())}")
    if "junk_groups_trained" in result:
        parts.append(f"junk trained {result['junk_groups_trained']}")
    if "junk_pair" in result:
        parts.append("junk pair " + ", ".join(f"{arm} eval {v['honest_eval_acc']} (junk trained "
                                             f"{v['junk_groups_trained']})" for arm, v in result["junk_pair"].items()))
    if "steps_per_min_vs_clean" in result:
        parts.append(f"steps/min vs clean {result['steps_per_min_vs_clean']}")
    if "kill_resume" in result:
        parts.append(f"kill_resume {result['kill_resume']}")
    return "; ".join(parts) + ("" if result.get("complete") else "; INCOMPLETE")


if __name__ == "__main__":
    main()
