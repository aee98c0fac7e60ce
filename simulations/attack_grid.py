"""The byzantine grid of bench/attack.py: which attack cells to run, and what their results add up to.

Contract (pure: scenarios in, cell plans out; results in, the bench's fields out):
- `placement(nodes, fraction, seed, slots)`: k = round(fraction * nodes) attackers (at least 1 for a fraction > 0,
  at most nodes - 1) on the LAST k indices, so the honest nodes of every fraction are nodes 0..n-k-1, the same
  nodes with the same seeds as in the clean run: every comparison is paired per node and seed. Their kinds cycle
  through `ATTACKS`, offset by seed * slots (slots: the attackers of the largest fraction), so that across seeds
  every kind runs.
- `grid(scn, fractions, seeds)`: per seed, one cell per fraction (the variant "f<fraction>", defence on; "f0.0" is
  the clean run), "solo" (the same nodes with J = 0: each trains alone), and the well-formed defence measured at
  fraction `JUNK_FRACTION` with every attacker of kind junk, defence on ("junk-defended") and off
  ("junk-undefended", `share.require_well_formed = false`). Cell dirs: run_dir/<variant>/seed<k>.
- `summarise(results, fractions)`: the bench's fields from the cells' result.json (see bench/attack.py), and the
  paired differences per seed (honest nodes' mean accuracy minus the same nodes' in the clean run, or alone) with
  their standard error over seeds; where the cells kept per-question outcomes, the paired difference against the
  same nodes alone per fraction with a 95% interval that resamples seeds, then questions
  (`honest_eval_vs_solo_paired`; its 0.5 entry is `f50_vs_alone_paired`).
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass
from typing import Any

from simulations.scenario import Scenario, Variant
from simulations.variants import ATTACKS
from swarm_node.train import eval_stats

FRACTIONS = (0.0, 0.1, 0.3, 0.5)
JUNK_FRACTION = 0.3
SOLO, JUNK_ON, JUNK_OFF = "solo", "junk-defended", "junk-undefended"


@dataclass(frozen=True)
class Cell:
    scenario: Scenario
    variant: Variant
    seed: int
    fraction: float


def key(fraction: float) -> str:
    return str(float(fraction))


def attackers_for(nodes: int, fraction: float) -> int:
    if fraction <= 0:
        return 0
    return min(nodes - 1, max(1, round(fraction * nodes)))


def placement(nodes: int, fraction: float, seed: int, slots: int, kinds: tuple[str, ...] = ATTACKS
              ) -> tuple[tuple[int, str], ...]:
    k = attackers_for(nodes, fraction)
    return tuple((nodes - k + j, kinds[(seed * slots + j) % len(kinds)]) for j in range(k))


def grid(scn: Scenario, fractions: tuple[float, ...], seeds: tuple[int, ...]) -> list[Cell]:
    slots = max(attackers_for(scn.nodes, f) for f in fractions)
    base = scn.variants[0].config
    share = dict(base.get("share", {}))
    solo = Variant(SOLO, {**base, "share": {**share, "external_groups": 0}})
    off = Variant(JUNK_OFF, {**base, "share": {**share, "require_well_formed": False}})
    cells = []
    for seed in seeds:
        for f in fractions:
            attackers = placement(scn.nodes, f, seed, slots)
            cells.append(Cell(dataclasses.replace(scn, attackers=attackers), Variant(f"f{key(f)}", base), seed, f))
        cells.append(Cell(scn, solo, seed, 0.0))
        junk = tuple((i, "junk") for i, _ in placement(scn.nodes, JUNK_FRACTION, seed, slots))
        for variant in (Variant(JUNK_ON, base), off):
            cells.append(Cell(dataclasses.replace(scn, attackers=junk), variant, seed, JUNK_FRACTION))
    return cells


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _se(values: list[float]) -> float | None:
    """Standard error of the mean over seeds, the independent units (a swarm's nodes share data)."""
    return statistics.stdev(values) / len(values) ** 0.5 if len(values) > 1 else None


def honest_outcomes(result: dict[str, Any], nodes: list[str]) -> dict[str, float]:
    """{question: the mean over `nodes` of its outcome} on the questions all of them answered; empty when the cell
    kept no per-question outcomes (a result from before they were recorded) or lacks one of the nodes."""
    per_node = result.get("final_eval_outcomes_per_node") or {}
    if not nodes or any(n not in per_node for n in nodes):
        return {}
    return eval_stats.mean_over_nodes([per_node[n] for n in nodes])


def paired_vs_solo(cells: list[dict[str, Any]], by: dict[tuple[str, int], dict[str, Any]]) -> dict[str, Any] | None:
    """The honest nodes' held-out accuracy minus the same nodes' alone, paired per seed and question: {"diff",
    "ci95", "seeds", "questions"}; None until some seed has both cells' per-question outcomes."""
    pairs = []
    for c in cells:
        nodes = sorted(c.get("final_eval_acc_per_node") or {}, key=int)
        own = honest_outcomes(c, nodes)
        alone = honest_outcomes(by.get((SOLO, c["seed"]), {}), nodes)
        if own and alone:
            pairs.append(eval_stats.paired_values(own, alone))
    if not pairs:
        return None
    estimate = eval_stats.seeds_then_questions(pairs)
    return {"diff": estimate.mean, "ci95": list(estimate.ci95), "seeds": len(pairs),
            "questions": min(len(p) for p in pairs)}


def summarise(results: list[dict[str, Any]], fractions: tuple[float, ...]) -> dict[str, Any]:
    """The bench's simulation fields from the cells' results (any subset: missing cells are left out)."""
    by = {(r["variant"], r["seed"]): r for r in results}
    seeds = sorted({r["seed"] for r in results})
    acc: dict[str, float | None] = {}
    vs_clean: dict[str, float | None] = {}
    solo: dict[str, float | None] = {}
    paired: dict[str, dict[str, dict[str, float]]] = {"vs_clean": {}, "vs_solo": {}}  # per fraction, per seed
    external: dict[str, float | None] = {}
    vs_solo_ci: dict[str, dict[str, Any] | None] = {}
    bad: dict[str, int] = {}
    used: dict[str, int] = {}  # every attacker group trained on, bad or not (e.g. forged claims re-scored)
    laundered = 0
    for f in fractions:
        name = f"f{key(f)}"
        cells = [by[(name, s)] for s in seeds if (name, s) in by]
        acc[key(f)] = _mean([c["final_eval_acc"] for c in cells if c["final_eval_acc"] is not None])
        external[key(f)] = _mean([c["external_groups_trained_per_step"] for c in cells])
        vs_solo_ci[key(f)] = paired_vs_solo(cells, by)
        alone = []
        by_seed: dict[str, dict[str, float]] = {"vs_clean": {}, "vs_solo": {}}
        for c in cells:
            own = c["final_eval_acc_per_node"]
            clean = by.get((f"f{key(0.0)}", c["seed"]), {}).get("final_eval_acc_per_node", {})
            solo_acc = by.get((SOLO, c["seed"]), {}).get("final_eval_acc_per_node", {})
            if own and all(i in clean for i in own):
                by_seed["vs_clean"][str(c["seed"])] = statistics.fmean(own[i] - clean[i] for i in own)
            if own and all(i in solo_acc for i in own):
                alone.append(statistics.fmean(solo_acc[i] for i in own))
                by_seed["vs_solo"][str(c["seed"])] = statistics.fmean(own[i] - solo_acc[i] for i in own)
        vs_clean[key(f)] = _mean(list(by_seed["vs_clean"].values()))
        solo[key(f)] = _mean(alone)
        for against, diffs in by_seed.items():
            paired[against][key(f)] = diffs
        for c in cells:
            for kind, n in c.get("bad_groups_trained", {}).items():
                bad[kind] = bad.get(kind, 0) + int(n)
            for kind, n in c.get("attacker_groups_trained", {}).items():
                used[kind] = used.get(kind, 0) + int(n)
            laundered += int(c.get("replays_of_attackers", 0))
    junk = {"with_defence": sum(r["bad_groups_trained"].get("junk", 0) for r in results if r["variant"] == JUNK_ON),
            "without": sum(r["bad_groups_trained"].get("junk", 0) for r in results if r["variant"] == JUNK_OFF)}
    junk_eval = {"with_defence": _mean([r["final_eval_acc"] for r in results if r["variant"] == JUNK_ON]),
                 "without": _mean([r["final_eval_acc"] for r in results if r["variant"] == JUNK_OFF])}
    blocks: dict[str, list[int | None]] = {}
    for r in results:
        for kind, rounds in r.get("rounds_to_block", {}).items():
            blocks.setdefault(kind, []).extend(rounds)
    return {"fractions": [float(f) for f in fractions], "kinds": [k for k in ATTACKS if k in bad],
            "honest_eval_acc": acc, "honest_eval_vs_clean": vs_clean, "honest_solo_eval_acc": solo,
            "honest_eval_vs_solo": {f: _mean(list(d.values())) for f, d in paired["vs_solo"].items()},
            "honest_eval_paired_per_seed": paired, "honest_eval_vs_solo_paired": vs_solo_ci,
            "f50_vs_alone_paired": vs_solo_ci.get(key(0.5)),
            "honest_eval_paired_se": {against: {f: _se(list(d.values())) for f, d in per_fraction.items()}
                                      for against, per_fraction in paired.items()},
            "bad_groups_trained": bad, "attacker_groups_trained": used, "replays_of_attackers": laundered,
            "junk_groups_trained": junk, "junk_eval_acc": junk_eval,
            "external_groups_trained_per_step": external, "sim_rounds_to_block": blocks, "sim_seeds": seeds}
