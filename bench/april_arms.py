"""Part "april" of bench/rollout_methods.py: APRIL's partial rollouts against the synchronous step (issue 31, item 1).

An arm is one node alone, `[run.rollout] kind` = "sync" or "april", trained step by step until its wall-time budget
(or its step cap) is spent, then evaluated greedily on the held-out problems. Its rollout throughput is the tokens
that reach training (every completion of the groups a step hands the trainer) divided by all generation wall time
(`Draft.gen_s`: APRIL's discarded and re-prefilled work is inside it). The part runs both arms on the base setting
(equal wall time: the learning comparison) and on a long-tail setting (a larger generation budget, `--long-tail-set`),
and reports {"throughput_ratio_vs_sync", "throughput_ratio_long_tail", "heldout_at_equal_wall_time": {"sync",
"april", "paired_diff_ci95"}} with the paired interval over held-out questions (swarm_node/train/eval_stats.py),
plus each arm's raw numbers under "arms". It reports rates: it runs only on an idle machine (bench/load_guard.py).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from typing import Any

from swarm_node.config import NodeConfig
from swarm_node.node.core import Node, NodeEvents
from swarm_node.train.eval_stats import paired_diff, per_question
from swarm_node.types import Draft

MODES = ("sync", "april")


def trained_tokens(draft: Draft) -> int:
    """The completion tokens of the groups a step hands the trainer."""
    return sum(len(c.token_ids) for g in draft.groups for c in g.completions)


def length_percentiles(lengths: list[int]) -> dict[str, int | None]:
    """The median and 95th percentile (nearest rank) of completion lengths (the long-tail setting: p95 >= 4 x p50)."""
    ordered = sorted(lengths)

    def rank(q: float) -> int | None:
        return ordered[max(0, math.ceil(q * len(ordered)) - 1)] if ordered else None

    return {"completion_len_p50": rank(0.5), "completion_len_p95": rank(0.95)}


def tail_ratio(arm: Mapping[str, Any] | None) -> float | None:
    """p95 / median of the completions an arm trained on (the sync arm's: every completion it generated)."""
    if arm is None or not arm.get("completion_len_p50"):
        return None
    return arm["completion_len_p95"] / arm["completion_len_p50"]


def throughput(drafts: list[tuple[int, float]]) -> float:
    """Tokens that reach training per second of generation, over (trained tokens, generation seconds) per step."""
    seconds = sum(s for _, s in drafts)
    return sum(t for t, _ in drafts) / seconds if seconds > 0 else 0.0


def run_arm(cfg: NodeConfig, wall_s: float, max_steps: int, log: Callable[[str], None] = print,
            clock: Callable[[], float] = time.monotonic) -> dict[str, Any]:
    """Train one node until `wall_s` seconds (training included) or `max_steps` steps, then evaluate it."""
    node = Node(cfg, events=NodeEvents(log=log))
    node.setup()
    steps: list[tuple[int, float]] = []
    lengths: list[int] = []
    counts: dict[str, int] = {}
    try:
        started = clock()
        while len(steps) < max_steps and clock() - started < wall_s:
            item = node.draft()
            if isinstance(item, Draft):
                steps.append((trained_tokens(item), item.gen_s))
                lengths.extend(len(c.token_ids) for g in item.groups for c in g.completions)
                for name, n in item.rollout:
                    counts[name] = counts.get(name, 0) + n
            node.train_on(item)
        wall = clock() - started
        result = node.evaluate() if cfg.run.eval_problems else None
    finally:
        node.close()
    outcomes = per_question((f"{d}\x00{q}", s) for d, q, s in result.outcomes) if result is not None else {}
    return {"mode": cfg.run.rollout.kind, "steps": len(steps), "wall_s": wall, "throughput": throughput(steps),
            "trained_tokens": sum(t for t, _ in steps), "gen_s": sum(s for _, s in steps),
            "heldout_acc": result.greedy_acc if result is not None else None, "outcomes": outcomes,
            "rollout_counts": counts, **length_percentiles(lengths)}


def ratio(arms: Mapping[str, Mapping[str, Any] | None]) -> float | None:
    april, sync = arms.get("april"), arms.get("sync")
    return april["throughput"] / sync["throughput"] if april and sync and sync["throughput"] > 0 else None


def summarise(base: Mapping[str, Mapping[str, Any] | None],
              long_tail: Mapping[str, Mapping[str, Any] | None]) -> dict[str, Any]:
    """The part's result from the two settings' arms ({"sync": arm, "april": arm} each; an arm not run yet is None
    and what needs it is None)."""
    sync, april = base.get("sync"), base.get("april")
    diff = paired_diff(april["outcomes"], sync["outcomes"]) if sync and april else None
    return {"throughput_ratio_vs_sync": ratio(base), "throughput_ratio_long_tail": ratio(long_tail),
            "heldout_at_equal_wall_time": {"sync": sync and sync["heldout_acc"],
                                           "april": april and april["heldout_acc"],
                                           "paired_diff_ci95": list(diff.ci95) if diff else None},
            "p95_over_median": {"base": tail_ratio(sync), "long_tail": tail_ratio(long_tail.get("sync"))},
            "arms": {setting: {mode: {k: v for k, v in arm.items() if k != "outcomes"} for mode, arm in arms.items()
                               if arm is not None}
                     for setting, arms in (("base", base), ("long_tail", long_tail))}}
