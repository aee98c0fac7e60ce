"""The SAPO paper's I/J grid beside ours: each configuration's gain over 8/0, and the paper's for the same one.

Contract: `add_gains_vs_8_0(configs)` adds to every configuration summary (name -> fields with "cum_reward_mean")
"gain_vs_8_0_pct" (None when 8/0 or the configuration has no cumulative reward yet) and, for the paper's four
configurations, "paper_cum_reward" and "paper_gain_vs_8_0_pct".
"""

from __future__ import annotations

from typing import Any

# SAPO (arXiv 2509.08721), cumulative reward after 2000 rounds, 8 nodes, Qwen2.5-0.5B, ReasoningGYM mix.
PAPER = {"8/0": 561.79, "6/2": 854.43, "4/4": 1093.31, "2/6": 945.87}


def add_gains_vs_8_0(configs: dict[str, dict[str, Any]]) -> None:
    base = configs.get("8/0", {}).get("cum_reward_mean")
    for name, c in configs.items():
        c["gain_vs_8_0_pct"] = 100 * (c["cum_reward_mean"] / base - 1) if base and c["cum_reward_mean"] else None
        if name in PAPER:
            c["paper_cum_reward"] = PAPER[name]
            c["paper_gain_vs_8_0_pct"] = 100 * (PAPER[name] / PAPER["8/0"] - 1)
