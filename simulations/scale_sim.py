"""The swarm-scale simulation's entry point: one design at one N -> the issue's per-design figures (issue 32 item 3).

Contract:
- `DESIGNS` (names in simulations/variants.py `SCALE_DESIGNS`): each design's message-level simulator and, where
  one exists, its analytical model: "flood" (today: every group to every node, simulations/scale_flood.py),
  "bounded" (shards, digests, pulls; swarm_node/sharing/fanin.py driven by simulations/scale_bounded.py, the push
  fallback where FaninExchange does it: `push_after_s` after the digest, within the round), "bounded-flush-push"
  (the same with the node's earlier push, at the sender's next flush: an ablation).
- `measure(design, setup, analytical_from)`: the simulator's figures, or the analytical model's where the design
  has one and `setup.n >= analytical_from` (flooding 1,000 nodes message by message does not fit a small machine;
  the model matches the simulator at N = 10 and 100: tests/unit/test_scale_sim.py, bench.swarm_scale's
  `flood_check`). Figures are `Record.metrics()`'s (simulations/scale_model.py); virtual time only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from simulations.scale_bounded import simulate_bounded, simulate_bounded_flush_push
from simulations.scale_flood import flood_counts, simulate_flood
from simulations.scale_model import ScaleSetup
from simulations.variants import SCALE_DESIGNS
from swarm_node.variants import Registry

Figures = dict[str, float]


@dataclass(frozen=True)
class Design:
    simulate: Callable[[ScaleSetup], Figures]
    analytical: Callable[[ScaleSetup], Figures] | None = None


DESIGNS: Registry[Design] = Registry("scale design", SCALE_DESIGNS)
DESIGNS.add("flood", Design(simulate_flood, flood_counts))
DESIGNS.add("bounded", Design(simulate_bounded))
DESIGNS.add("bounded-flush-push", Design(simulate_bounded_flush_push))


def measure(design: str, setup: ScaleSetup, analytical_from: int = 1000) -> tuple[Figures, str]:
    """(figures, "simulated" or "analytical")."""
    chosen = DESIGNS[design]
    if chosen.analytical is not None and setup.n >= analytical_from:
        return chosen.analytical(setup), "analytical"
    return chosen.simulate(setup), "simulated"
