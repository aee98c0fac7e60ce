"""Training one node alone up to a budget of generated tokens: what a task selection buys at equal generation cost.

`run_selection_cell(cfg, token_budget)` sets up a node from `cfg` (its run dir fresh), then drafts and trains step
by step until the completions it generated hold at least `token_budget` tokens (or run.steps steps pass), and
returns: the steps, generated tokens, groups generated and those with signal (`signal_frac`, the share of groups
whose rewards are not all equal), the cumulative reward (the sum over steps of the mean reward per local completion,
as simulations/runner.py counts a swarm node's), and the final policy's held-out greedy accuracy with its
per-question outcomes (`heldout_outcomes`, {dataset NUL question: 0/1}), for paired intervals across arms.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from swarm_node.config import NodeConfig
from swarm_node.node.assembly import assemble
from swarm_node.node.core import NodeEvents
from swarm_node.types import Draft


def run_selection_cell(cfg: NodeConfig, token_budget: int, log: Callable[[str], None] = print) -> dict[str, Any]:
    node = assemble(cfg, events=NodeEvents(log=log)).node
    started = time.monotonic()
    tokens = groups = with_signal = steps = 0
    cumulative_reward = 0.0
    try:
        while tokens < token_budget and steps < cfg.run.steps:
            item = node.draft()
            if isinstance(item, Draft):
                tokens += item.gen_tokens
                groups += len(item.groups)
                with_signal += sum(g.has_signal for g in item.groups)
            metrics = node.mix_and_train(item)
            cumulative_reward += metrics.get("reward_mean") or 0.0
            steps += 1
            if steps % 16 == 0:
                log(f"step {steps}: {tokens}/{token_budget} tokens, signal {with_signal}/{groups}")
        final = node.evaluate() if cfg.run.eval_problems else None
    finally:
        node.close()
    return {"steps": steps, "gen_tokens": tokens, "groups": groups, "groups_with_signal": with_signal,
            "signal_frac": with_signal / groups if groups else None, "cum_reward": cumulative_reward,
            "heldout_acc": None if final is None else final.greedy_acc,
            "heldout_outcomes": {} if final is None else final.by_question(),
            "wall_s": time.monotonic() - started}
