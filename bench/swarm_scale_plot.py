"""The README's swarm-scale plot: per-node inbound KB per round against N, one line per design (issue 32).

Contract: `inbound_series(result)` (pure) reads a `bench.swarm_scale` result's `designs` and gives, per design, the
sizes N in increasing order with the median and the 99th percentile of per-node inbound KB per round (`None` where the
result holds none); `p99_target_kb(result)` the issue's bound on the 99th percentile, 10 times the bytes of J groups
(from the result's `setup`; None without one); `plot_inbound(result, path)` draws them as a PNG: log-log axes, one
colour per design, the median solid and the 99th percentile dashed, the bound dotted. `python -m bench.swarm_scale
--plot-only` redraws it from the result file alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

Series = tuple[list[int], list[float | None], list[float | None]]


def inbound_series(result: dict[str, Any]) -> dict[str, Series]:
    out: dict[str, Series] = {}
    for design, by_n in result["designs"].items():
        sizes = sorted(int(n) for n in by_n)
        out[design] = (sizes, [by_n[str(n)].get("inbound_kb_per_round") for n in sizes],
                       [by_n[str(n)].get("inbound_kb_per_round_p99") for n in sizes])
    return out


def p99_target_kb(result: dict[str, Any]) -> float | None:
    setup = result.get("setup")
    return 10.0 * setup["needed"] * setup["group_kb"] if setup else None


def plot_inbound(result: dict[str, Any], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, (design, (sizes, median, p99)) in enumerate(inbound_series(result).items()):
        colour = f"C{i}"
        ax.plot(sizes, median, marker="o", color=colour, label=f"{design}: median over nodes")
        ax.plot(sizes, p99, marker="x", linestyle="--", color=colour, label=f"{design}: 99th percentile")
    target = p99_target_kb(result)
    if target is not None:
        ax.axhline(target, color="grey", linestyle=":", label=f"target for bounded: 99th percentile <= {target:.0f} KB")
    ax.set_xscale("log")
    ax.set_yscale("log")  # the flood grows 10x per decade, the bounded design stays flat: both visible only on log y
    ax.set_xlabel("nodes in the swarm (N)")
    ax.set_ylabel("inbound KB per node and round")
    ax.set_title("Rollout sharing: each node's inbound traffic against the swarm's size")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
