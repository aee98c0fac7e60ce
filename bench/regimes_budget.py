"""The regime grid's budget (issue 30 item 5): about 25,000 node-steps, at most about 20 hours of one process.

Contract (pure): `grid_plan(seconds, cells, seeds, nodes, rounds)` projects the grid from the pilot's seconds per
node-step. `cells` maps each regime to its cells' cost factors (1.0 for a step like 8/0's; `solo_ds_factor` for
dynamic sampling, which generates up to max_factor times as many groups). Over the budget it cuts rounds first, not
below `MIN_ROUNDS`, then drops the regimes of `DROPPABLE` in order (at the rounds asked again, cut if needed); if
even that does not fit, the plan keeps the floor and says it is over budget. Hours are those of one process running
every cell in turn (one process per seed divides them by the seeds, on as many free cores).
"""

from __future__ import annotations

from dataclasses import dataclass

BUDGET_H = 20.0
MIN_ROUNDS = 150
DROPPABLE = ("medium",)  # dropped in this order once the rounds are at their floor


def solo_ds_factor(no_signal_frac: float, max_factor: int) -> float:
    """Groups a dynamic-sampling step generates relative to 8/0's, in expectation: 1 / (1 - f), at most
    max_factor (a conservative cost factor for its whole step: generation dominates a step)."""
    if no_signal_frac >= 1.0:
        return float(max_factor)
    return min(float(max_factor), 1.0 / (1.0 - no_signal_frac))


def node_steps(cells: dict[str, dict[str, float]], regimes: tuple[str, ...], seeds: int, nodes: int,
               rounds: int) -> float:
    """Node-steps of the regimes' cells, each weighted by its cost factor."""
    return sum(sum(cells[r].values()) for r in regimes) * seeds * nodes * rounds


@dataclass(frozen=True)
class GridPlan:
    seconds_per_node_step: float
    rounds: int
    regimes: tuple[str, ...]
    node_steps: float  # weighted by the cells' cost factors
    hours: float
    asked_hours: float  # every regime at the rounds asked
    over_budget: bool

    def line(self) -> str:
        head = (f"grid projection: {self.seconds_per_node_step:.2f} s per node-step; as asked {self.asked_hours:.1f} h"
                f" (budget {BUDGET_H:.0f} h)")
        if self.over_budget:
            return (f"{head}; OVER BUDGET even at {self.rounds} rounds on {', '.join(self.regimes)} alone: "
                    f"{self.hours:.1f} h")
        return (f"{head}; plan: {', '.join(self.regimes)} at {self.rounds} rounds, {self.node_steps:,.0f} weighted "
                f"node-steps, {self.hours:.1f} h")


def grid_plan(seconds: float, cells: dict[str, dict[str, float]], seeds: int, nodes: int, rounds: int,
              budget_h: float = BUDGET_H, min_rounds: int = MIN_ROUNDS) -> GridPlan:
    names = tuple(cells)
    asked = node_steps(cells, names, seeds, nodes, rounds) * seconds / 3600
    options = [names] + [tuple(n for n in names if n not in DROPPABLE[:k + 1]) for k in range(len(DROPPABLE))]
    floor = min(min_rounds, rounds)
    kept = names
    for kept in (o for o in options if o):
        hours_per_round = node_steps(cells, kept, seeds, nodes, 1) * seconds / 3600
        fit = rounds if hours_per_round <= 0 else min(rounds, int(budget_h / hours_per_round))
        if fit >= floor:
            return GridPlan(seconds, fit, kept, node_steps(cells, kept, seeds, nodes, fit),
                            hours_per_round * fit, asked, False)
    steps = node_steps(cells, kept, seeds, nodes, floor)
    return GridPlan(seconds, floor, kept, steps, steps * seconds / 3600, asked, True)
