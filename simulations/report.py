"""Reports for a simulation run: combined CSV, PNG reward curves, a markdown summary table.

Contract: reads the per-cell metrics rows and results the runner wrote; writes `metrics.csv` (every node, round,
variant, seed), `rewards_per_node.png` (moving-average reward of every node, one panel per variant, first seed),
`rewards_per_config.png` (moving average of the node-mean reward per variant, averaged over seeds) and
`summary.md` into the run dir. Plots use matplotlib's Agg backend (no display needed).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from simulations.runner import CSV_FIELDS, cell_dir, read_rows

MOVING_AVERAGE = 10


def moving_average(values: list[float], window: int = MOVING_AVERAGE) -> list[float]:
    """Trailing mean over at most `window` values (the first points average what exists so far)."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def node_mean_curve(rows: list[dict[str, Any]]) -> list[float]:
    """Mean over nodes of the local reward, per round."""
    per_round: dict[int, list[float]] = defaultdict(list)
    for r in rows:
        if r["reward_mean"] not in (None, ""):
            per_round[int(r["round"])].append(float(r["reward_mean"]))
    return [statistics.fmean(per_round[k]) for k in sorted(per_round)]


def plot_reward_curves(curves: dict[str, list[list[dict[str, Any]]]], path: Path, title: str) -> None:
    """One line per variant: moving average of the node-mean local reward, averaged over seeds (band = min/max)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, runs in curves.items():
        per_seed = [moving_average(node_mean_curve(rows)) for rows in runs if rows]
        if not per_seed:
            continue
        n = min(len(c) for c in per_seed)
        mean = [statistics.fmean(c[i] for c in per_seed) for i in range(n)]
        xs = list(range(1, n + 1))
        ax.plot(xs, mean, label=f"{name} ({len(per_seed)} seeds)")
        if len(per_seed) > 1:
            ax.fill_between(xs, [min(c[i] for c in per_seed) for i in range(n)],
                            [max(c[i] for c in per_seed) for i in range(n)], alpha=0.15)
    ax.set_xlabel("round")
    ax.set_ylabel(f"mean local reward (moving avg {MOVING_AVERAGE})")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_per_node(rows_by_variant: dict[str, list[dict[str, Any]]], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(rows_by_variant)
    fig, axes = plt.subplots(1, len(names), figsize=(4.5 * len(names), 3.5), squeeze=False, sharey=True)
    for ax, name in zip(axes[0], names, strict=True):
        per_node: dict[int, list[tuple[int, float]]] = defaultdict(list)
        for r in rows_by_variant[name]:
            if r["reward_mean"] not in (None, ""):
                per_node[int(r["node"])].append((int(r["round"]), float(r["reward_mean"])))
        for node, points in sorted(per_node.items()):
            xs = [p[0] for p in points]
            ax.plot(xs, moving_average([p[1] for p in points]), label=f"node{node}")
        ax.set_title(name)
        ax.set_xlabel("round")
    axes[0][0].set_ylabel(f"local reward (moving avg {MOVING_AVERAGE})")
    axes[0][-1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def summary_table(results: list[dict[str, Any]]) -> str:
    by_variant: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in results:
        by_variant[r["variant"]].append(r)
    lines = ["| variant | seeds | cumulative reward (mean ± std) | final greedy eval acc | external drops |",
             "|---|---|---|---|---|"]
    for name, cells in by_variant.items():
        cum = [c["cum_reward"] for c in cells]
        std = statistics.stdev(cum) if len(cum) > 1 else 0.0
        evals = [c["final_eval_acc"] for c in cells if c["final_eval_acc"] is not None]
        acc = f"{statistics.fmean(evals):.3f}" if evals else "-"
        drops: dict[str, int] = defaultdict(int)
        for c in cells:
            for k, v in c["external_drops"].items():
                drops[k] += v
        drop_text = ", ".join(f"{k} {v}" for k, v in sorted(drops.items())) or "-"
        lines.append(f"| {name} | {len(cells)} | {statistics.fmean(cum):.2f} ± {std:.2f} | {acc} | {drop_text} |")
    return "\n".join(lines) + "\n"


def write_report(scn: Any, results: list[dict[str, Any]], run_dir: Path) -> list[Path]:
    """Write the combined CSV, both plots and summary.md; returns the paths written."""
    all_rows: list[dict[str, Any]] = []
    curves: dict[str, list[list[dict[str, Any]]]] = defaultdict(list)
    first_seed: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        rows = read_rows(cell_dir(run_dir, r["variant"], r["seed"]) / "metrics.csv")
        all_rows.extend(rows)
        curves[r["variant"]].append(rows)
        first_seed.setdefault(r["variant"], rows)
    import csv
    csv_path = run_dir / "metrics.csv"
    with open(csv_path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        writer.writeheader()
        writer.writerows(all_rows)
    per_config = run_dir / "rewards_per_config.png"
    plot_reward_curves(dict(curves), per_config, f"{scn.name}: {scn.nodes} nodes, {scn.mode}")
    per_node = run_dir / "rewards_per_node.png"
    plot_per_node(first_seed, per_node)
    md = run_dir / "summary.md"
    md.write_text(f"# {scn.name}\n\n{scn.nodes} nodes, {scn.rounds} rounds, mode {scn.mode}, seeds "
                  f"{list(scn.seeds)}. Cumulative reward = sum over rounds of the mean reward per local completion,"
                  f" averaged over nodes.\n\n" + summary_table(results))
    return [csv_path, per_config, per_node, md]
