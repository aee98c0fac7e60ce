"""The names a scenario file may choose among (mode, transport, sampler, attacker kind), declared in one leaf module.

`scenario.py` validates a scenario against these lists (it cannot import the registries: they import it). The
registries `runner.CELL_RUNNERS` and `byzantine.ATTACKS` are declared with their list (`swarm_node.variants.Registry`):
registering an undeclared name raises at import, and the tests check that every declared name is registered. Adding
a variant is two edits: its name here, its implementation beside its registry. None of these names is the node's:
`swarm_node/` never imports `simulations/`.
"""

from __future__ import annotations

SIM_MODES = ("sync", "async", "echo", "attack")  # runner.CELL_RUNNERS: lockstep, virtual clock, ECHO-2, attackers
SIM_TRANSPORTS = ("memory", "libp2p")  # runner.CELL_LOOPS
SIM_SAMPLERS = ("per-node", "shared-lora")  # cells.py: a sampler per node, or one vLLM engine serving every node's LoRA
# scale_sim.DESIGNS: rollout sharing at swarm scale (issue 32)
SCALE_DESIGNS = ("flood", "bounded", "bounded-flush-push")
ATTACKS = ("forged_reward", "oov_tokens", "over_length", "junk", "stale", "replay", "sybil")  # byzantine.ATTACKS
