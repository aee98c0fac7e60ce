"""The README's plots of bench/rollout_methods.py's comparisons, one PNG per part (issue 31).

Contract: the series functions are pure and read one part of a `bench.rollout_methods` result (its module docstring
defines the JSON); a figure the result does not hold is None (a gap in the plot, never a zero).
- `staleness_series(part)`: correction -> (lags, held-out means, stds), the lags sorted numerically, corrections in
  `STALE_CORRECTIONS` order then any other; an entry without a mean is left out. `staleness_title(part)` says the
  seeds done per entry when they differ.
- `selection_series(part)`: the arms in `ARMS` order then any other, with signal_frac, held-out accuracy and its 95%
  interval as (below, above) error bar lengths.
- `april_series(part)`: the two throughput ratios (april over sync, base and long-tail settings) and the held-out
  accuracy of sync and april at equal wall time with their paired interval.
`plot_all(result, out_dir)` draws each part the result holds to out_dir/rollout_methods_<part>.png (matplotlib, Agg
backend, imported only there) and returns the paths written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

from swarm_node.variants import STALE_CORRECTIONS

PARTS = ("staleness", "selection", "april")
# bench.rollout_selection.ARMS, repeated because that module imports the trainer (tests check they agree)
ARMS = ("uniform", "adaptive", "adaptive_dars", "uniform_swarm", "adaptive_swarm")
APRIL_TARGET = 1.15  # the throughput ratio on the long-tail setting that issue 31 asks of APRIL

StalenessSeries = tuple[list[int], list[float], list[float]]


class SelectionSeries(NamedTuple):
    arms: list[str]
    signal_frac: list[float | None]
    heldout: list[float | None]
    heldout_err: tuple[list[float], list[float]]  # lengths below and above each held-out bar (0 without interval)


class AprilSeries(NamedTuple):
    settings: list[str]
    throughput_ratio: list[float | None]
    modes: list[str]
    heldout: list[float | None]
    paired_diff_ci95: list[float] | None  # april - sync, over held-out questions


def ordered(names: list[str], first: tuple[str, ...]) -> list[str]:
    """`names` with the known ones first in their canonical order, then the rest as they came."""
    return [n for n in first if n in names] + [n for n in names if n not in first]


def staleness_series(part: dict[str, Any]) -> dict[str, StalenessSeries]:
    lags = sorted(part, key=int)  # JSON keys are strings: "16" sorts before "4"
    corrections = ordered(list(dict.fromkeys(c for lag in lags for c in part[lag])), STALE_CORRECTIONS)
    out: dict[str, StalenessSeries] = {}
    for correction in corrections:
        cells = [(int(lag), part[lag][correction]) for lag in lags if correction in part[lag]]
        kept = [(lag, c) for lag, c in cells if c.get("heldout_acc_mean") is not None]
        if kept:
            out[correction] = ([lag for lag, _ in kept], [c["heldout_acc_mean"] for _, c in kept],
                               [c.get("heldout_acc_std") or 0.0 for _, c in kept])
    return out


def seeds_done_counts(part: dict[str, Any]) -> list[int]:
    """The distinct numbers of seeds done over the entries with a mean, increasing."""
    return sorted({len(c.get("seeds_done", [])) for per_lag in part.values() for c in per_lag.values()
                   if c.get("heldout_acc_mean") is not None})


def staleness_title(part: dict[str, Any]) -> str:
    counts = seeds_done_counts(part)
    if not counts:
        seeds = "no entry finished"
    elif len(counts) == 1:
        seeds = f"mean ± std over {counts[0]} seed" + "s" * (counts[0] != 1)
    else:  # a sweep still running: entries of fewer seeds are less certain than their error bars say
        seeds = "mean ± std; seeds done per entry: " + ", ".join(map(str, counts))
    return f"Held-out accuracy against the lag S ({seeds})"


def selection_series(part: dict[str, Any]) -> SelectionSeries:
    arms = ordered(list(part), ARMS)
    heldout = [part[a].get("heldout_acc") for a in arms]
    below, above = [], []
    for arm, acc in zip(arms, heldout, strict=True):
        ci = part[arm].get("heldout_ci95")
        below.append(acc - ci[0] if ci and acc is not None else 0.0)
        above.append(ci[1] - acc if ci and acc is not None else 0.0)
    return SelectionSeries(arms, [part[a].get("signal_frac") for a in arms], heldout, (below, above))


def april_series(part: dict[str, Any]) -> AprilSeries:
    equal = part.get("heldout_at_equal_wall_time") or {}
    return AprilSeries(["base", "long tail"],
                       [part.get("throughput_ratio_vs_sync"), part.get("throughput_ratio_long_tail")],
                       ["sync", "april"], [equal.get("sync"), equal.get("april")], equal.get("paired_diff_ci95"))


def nan(values: list[float | None]) -> list[float]:
    """matplotlib draws nothing for NaN: a missing figure stays a gap."""
    return [float("nan") if v is None else v for v in values]


def plot_staleness(part: dict[str, Any], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    lags: set[int] = set()
    for correction, (xs, means, stds) in staleness_series(part).items():
        ax.errorbar(xs, means, yerr=stds, marker="o", capsize=3, label=correction)
        lags.update(xs)
    if lags:
        if min(lags) > 0:  # lags grow by powers of 2
            ax.set_xscale("log", base=2)
        else:  # a lag of 0 (on-policy) has no place on a log axis: symlog keeps it in view
            ax.set_xscale("symlog", base=2, linthresh=1)
        ax.set_xticks(sorted(lags), [str(lag) for lag in sorted(lags)])
        ax.minorticks_off()  # the lags present are the only ticks worth a label
        ax.legend(title="correction", fontsize=8)
    ax.set_xlabel("lag S (policy versions between sampling and training)")
    ax.set_ylabel("held-out accuracy (final policy)")
    ax.set_title(staleness_title(part), fontsize=10)
    ax.grid(True, alpha=0.3)
    save(fig, path)


def plot_selection(part: dict[str, Any], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = selection_series(part)
    fig, (signal, heldout) = plt.subplots(1, 2, figsize=(9, 4))
    x = list(range(len(s.arms)))  # positions, not category names: an arm without figures keeps its empty slot
    signal.bar(x, nan(s.signal_frac), color="C0")
    signal.set_ylabel("fraction of groups with signal")
    signal.set_title("Groups with signal", fontsize=10)
    heldout.bar(x, nan(s.heldout), yerr=s.heldout_err, capsize=4, color="C1")
    heldout.set_ylabel("held-out accuracy [95% interval]")
    heldout.set_title("Held-out accuracy at equal generated tokens", fontsize=10)
    for ax in (signal, heldout):
        ax.set_xticks(x, s.arms)
        ax.set_xlim(-0.5, len(x) - 0.5)
        ax.tick_params(axis="x", labelrotation=20, labelsize=8)
        ax.grid(True, axis="y", alpha=0.3)
    save(fig, path)


def plot_april(part: dict[str, Any], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = april_series(part)
    fig, (rate, heldout) = plt.subplots(1, 2, figsize=(9, 4))
    rate.bar([0, 1], nan(s.throughput_ratio), color="C0")  # positions: a missing ratio keeps its empty slot
    rate.set_xticks([0, 1], s.settings)
    rate.set_xlim(-0.5, 1.5)
    rate.axhline(APRIL_TARGET, color="grey", linestyle=":", label=f"target {APRIL_TARGET}x (long tail)")
    rate.axhline(1.0, color="black", linewidth=0.5)
    rate.set_ylabel("throughput, april / sync")
    rate.set_title("Tokens to training per second of generation", fontsize=10)
    rate.legend(fontsize=8)
    heldout.bar([0, 1], nan(s.heldout), color=["C2", "C1"])
    heldout.set_xticks([0, 1], s.modes)
    heldout.set_xlim(-0.5, 1.5)
    heldout.set_ylabel("held-out accuracy")
    ci = s.paired_diff_ci95
    paired = "" if ci is None else f"\napril - sync [{100 * ci[0]:+.1f}, {100 * ci[1]:+.1f}] points"
    heldout.set_title("Held-out at equal wall time" + paired, fontsize=10)
    for ax in (rate, heldout):
        ax.grid(True, axis="y", alpha=0.3)
    save(fig, path)


def save(fig: Any, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


PLOTS = {"staleness": plot_staleness, "selection": plot_selection, "april": plot_april}


def plot_all(result: dict[str, Any], out_dir: Path) -> list[Path]:
    """Each part the result holds, drawn to out_dir/rollout_methods_<part>.png; the paths written."""
    paths = []
    for part in PARTS:
        if part in result:
            path = out_dir / f"rollout_methods_{part}.png"
            PLOTS[part](result[part], path)
            paths.append(path)
    return paths
