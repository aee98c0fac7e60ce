"""The README's benchmark rows for sharing at scale, the sharing regimes, the adversarial cell on the reasoning
default and the rollout methods (registered after bench/report_rows.py's, so they follow them in the README table;
the registry: bench/report_registry.py)."""

from __future__ import annotations

from typing import Any

from bench import report_rows  # noqa: F401  (its rows register first: README order is registration order)
from bench.regimes_file import REGIMES
from bench.report_registry import Results, pts, row, slash
from bench.rollout_methods_plot import ARMS, ordered

SIZES = ("10", "100", "1000", "10000")


def per_n(design: dict[str, Any], key: str, fmt: str) -> str:
    return slash([design[n][key] for n in SIZES if n in design], fmt)


@row("swarm_scale", "python -m bench.swarm_scale",
     "per-node inbound cost of rollout sharing at N = 10 / 100 / 1,000 / 10,000 nodes (message-level simulation on a "
     "virtual clock; I = J = 4, 5 KB groups, 10 s rounds; the flood from N = 1,000 in closed form): today's flood "
     "against the bounded fan-in `join` uses by default; 30% churn per minute at N = 1,000; `bench.fanin_real`'s "
     "16 real libp2p processes against the simulator", "swarm_scale.json")
def swarm_scale(r: Results) -> str:
    d = r["swarm_scale.json"]
    flood, bounded = d["designs"]["flood"], d["designs"]["bounded"]
    top = bounded[max(bounded, key=int)]
    real = d.get("real_vs_sim_n16")
    real_text = ("" if real is None else f"; real/simulated at N = 16: messages {real['inbound_msgs_ratio']:.2f}, KB "
                 f"{real['inbound_kb_ratio']:.2f}")
    return (f"inbound KB per node and round, flood {per_n(flood, 'inbound_kb_per_round', ',.0f')}, bounded "
            f"{per_n(bounded, 'inbound_kb_per_round', ',.0f')} (messages "
            f"{per_n(bounded, 'inbound_msgs_per_round', '.0f')}"
            f"; p99 in / out at the largest N {top['inbound_kb_per_round_p99']:.0f} / "
            f"{top['outbound_kb_per_round_p99']:.0f} KB); bounded: J usable groups in "
            f"{per_n(bounded, 'rounds_with_J_frac', '.3f')} of (node, round) pairs, pulled by at least one peer "
            f"{per_n(bounded, 'pulled_by_ge1_frac', '.3f')}, distinct peers heard at the largest N "
            f"{top['distinct_peers_10_rounds']:.0f} in 10 rounds and {top['distinct_peers_100_rounds']:.0f} in 100; "
            f"30% churn per minute at N = 1,000: J in {d['churn_1000']['rounds_with_J_frac']:.3f}" + real_text)


def best_mix(signal_scan: dict[str, Any]) -> tuple[float, str]:
    """The lowest fraction of groups without signal a mix reaches (one option set per specialty, equal weights, as
    the default mix), and its G, over the group sizes every specialty was scanned at."""
    by_specialty: dict[str, list[dict[str, Any]]] = {}
    for name, scan in signal_scan["scans"].items():
        by_specialty.setdefault(signal_scan["option_sets"][name]["name"], []).append(scan)
    sizes = set.intersection(*(set().union(*scans) for scans in by_specialty.values()))

    def mean_of_best(g: str) -> float:
        return sum(min(s[g]["no_signal_frac"] for s in scans if g in s)
                   for scans in by_specialty.values()) / len(by_specialty)
    return min((mean_of_best(g), g) for g in sizes)


def regime_of(no_signal_frac: float) -> str:
    return next((f"`{name}`" for name, regime in REGIMES.items() if regime.fits(no_signal_frac)), "no regime")


@row("sapo_regimes", "python -m bench.sapo_regimes --pilot",
     "the fraction of a solo node's groups without signal, which sets the sharing regime (issue 30 item 5): before "
     "RL per option set and G (`bench.signal_scan`, 64 training problems each), and over a 1-seed 8/0 pilot of 4 "
     "nodes on the default mix; the grid's projected cost", "signal_scan.json", "sapo_regimes_pilot.json")
def sapo_regimes(r: Results) -> str:
    scans = r["signal_scan.json"]["scans"]
    at8 = [s["8"]["no_signal_frac"] for s in scans.values() if "8" in s]
    lowest = min((s[g]["no_signal_frac"], name, g) for name, s in scans.items() for g in s)
    mix, mix_g = best_mix(r["signal_scan.json"])
    pilot = r["sapo_regimes_pilot.json"]
    cand = pilot["candidates"]["default"]
    return (f"before RL, G = 8: {min(at8):.2f}-{max(at8):.2f} of groups without signal over "
            f"{len(at8)} option sets (lowest at any G: {lowest[0]:.2f}, {lowest[1]} at G = {lowest[2]}); the best "
            f"mix (one set per specialty) {mix:.2f}, at G = {mix_g}: "
            f"{'reaches' if REGIMES['medium'].fits(mix) else 'no mix reaches'} `medium` "
            f"({REGIMES['medium'].bound()}); pilot (default mix, {pilot['rounds']} rounds): "
            f"{cand['no_signal_frac_solo']:.3f} without signal ({regime_of(cand['no_signal_frac_solo'])}), mean local "
            f"reward {cand['reward_mean']:.3f}, held-out {cand['final_eval_acc']:.3f}; grid projection from its "
            + pilot["lines"][-1].removeprefix("grid projection: "))


GRID_CELLS = ("8/0", "4/4", "2/6", "4/0", "2/0", "solo_ds", "4/4-nofilter")


@row("sapo_regimes_grid", "python -m bench.sapo_regimes --regimes hard --rounds 200",
     "the sharing regime map (issue 30 item 5): 4 nodes x 200 rounds in the `hard` regime, SAPO's I/J grid (8/0, "
     "4/4, 2/6, zero-advantage filter on external groups), the controls 4/0 and 2/0, `solo_ds` (dynamic sampling, "
     "at most 4x 8/0's groups) and 4/4 with the filter off: cumulative reward (per node, the sum over rounds of its "
     "own completions' mean reward; mean ± std over seeds), held-out accuracy on 4,000 test questions and its paired "
     "difference against 8/0 in points [95% interval, seeds and questions resampled]", "sapo_regimes.json")
def sapo_regimes_grid(r: Results) -> str:
    d = r["sapo_regimes.json"]
    texts = []
    for name, regime in d["regimes"].items():
        base = regime["cells"]["8/0"]["cum_reward_mean"]
        cells = []
        for cell in GRID_CELLS:
            c = regime["cells"].get(cell)
            if not c or c["cum_reward_mean"] is None:
                continue
            paired = c["heldout_vs_8_0_paired"]
            gain = "" if cell == "8/0" else f" ({100 * (c['cum_reward_mean'] / base - 1):+.1f}%)"
            vs = "" if cell == "8/0" else (f", {pts(paired['diff'])} [{pts(paired['ci95'][0])}, "
                                           f"{pts(paired['ci95'][1])}] points vs 8/0")
            cells.append(f"{cell} {c['cum_reward_mean']:.1f} ± {c['cum_reward_std']:.1f}{gain}, held-out "
                         f"{c['heldout_acc_mean']:.3f}{vs} ({len(c['per_seed'])} seeds)")
        texts.append(f"{name} (no signal {regime['no_signal_frac_solo']:.2f} in the pilot): " + "; ".join(cells))
    status = "" if d.get("complete") else " (grid incomplete)"
    return "; ".join(texts) + status


@row("attack_f50", "python -m bench.attack --parts sim --variants f0.5 solo --eval-problems 4000 "
     "--out bench/results/attack_f50.json",
     "the open adversarial question on the reasoning default (issue 30 item 6): the honest nodes of a 10-node swarm "
     "with 50% attackers (kinds cycling by seed) against the same nodes trained alone, 100 rounds, seeds 0-2, "
     "held-out accuracy on 4,000 test questions, paired per node, seed and question [95% interval, seeds then "
     "questions resampled]", "attack_f50.json")
def attack_f50(r: Results) -> str:
    d = r["attack_f50.json"]
    paired = d["f50_vs_alone_paired"]
    bad = sum(d["bad_groups_trained"].values())
    return (f"honest held-out {d['honest_eval_acc']['0.5']:.3f} beside 50% attackers, "
            f"{d['honest_solo_eval_acc']['0.5']:.3f} alone: {pts(paired['diff'])} [{pts(paired['ci95'][0])}, "
            f"{pts(paired['ci95'][1])}] points ({paired['seeds']} seeds x {paired['questions']:,} questions); "
            f"{bad} bad groups trained; {d['external_groups_trained_per_step']['0.5']:.1f} external groups trained "
            "per step")


def num(value: float | None, fmt: str = ".3f") -> str:
    return "-" if value is None else format(value, fmt)


def interval_pts(ci: list[float]) -> str:
    return f"[{pts(ci[0])}, {pts(ci[1])}]"


def seeds(done: list[int]) -> str:
    return f"{len(done)} seed" + "s" * (len(done) != 1)


def staleness_entry(name: str, c: dict[str, Any]) -> str:
    return f"{name} {c['heldout_acc_mean']:.3f} ± {c['heldout_acc_std']:.3f} ({seeds(c['seeds_done'])})"


def staleness_text(part: dict[str, Any]) -> str:
    lags = []
    for lag in sorted(part, key=int):  # JSON keys are strings: "16" sorts before "4"
        done = {name: c for name, c in part[lag].items() if c.get("heldout_acc_mean") is not None}
        shown = []
        corrections = [name for name in done if name != "none"]
        if corrections:
            best = max(corrections, key=lambda name: done[name]["heldout_acc_mean"])
            shown.append("best " + staleness_entry(best, done[best]))
        if "none" in done:
            shown.append(staleness_entry("none", done["none"]))
        if shown:
            lags.append(f"S = {lag}: " + ", ".join(shown))
    return "; ".join(lags)


def selection_text(part: dict[str, Any]) -> str:
    arms = []
    for arm in ordered(list(part), ARMS):  # uniform first: every other arm is paired with it
        c = part[arm]
        ci = f" [{c['heldout_ci95'][0]:.3f}, {c['heldout_ci95'][1]:.3f}]" if c.get("heldout_ci95") else ""
        vs = "".join(f", {pts(paired['diff'])} {interval_pts(paired['ci95'])} points vs {base}"
                     for base in ("uniform", "uniform_swarm") if (paired := c.get(f"heldout_vs_{base}_paired")))
        arms.append(f"{arm} signal {num(c.get('signal_frac'))}, held-out {num(c.get('heldout_acc'))}{ci}{vs} "
                    f"({seeds(c.get('seeds_done', []))})")
    return "; ".join(arms)


def april_text(part: dict[str, Any]) -> str:
    equal = part.get("heldout_at_equal_wall_time") or {}
    ci = equal.get("paired_diff_ci95")
    paired = f", april - sync {interval_pts(ci)} points" if ci else ""
    tail = part.get("p95_over_median") or {}
    return (f"throughput april / sync x{num(part.get('throughput_ratio_vs_sync'), '.2f')}, long tail "
            f"x{num(part.get('throughput_ratio_long_tail'), '.2f')} (completion length p95 / median: base "
            f"{num(tail.get('base'), '.1f')}, long tail {num(tail.get('long_tail'), '.1f')}); held-out at equal wall "
            f"time sync {num(equal.get('sync'))}, april {num(equal.get('april'))}{paired}")


ROLLOUT_PARTS = {"staleness": staleness_text, "selection": selection_text, "april": april_text}


@row("rollout_methods", "python -m bench.rollout_methods",
     "rollout methods by the final policy's held-out accuracy (issue 31, `docs/ROLLOUT_METHODS.md`): **staleness**, "
     "one node trained with its batches sampled S policy versions back (S = 1 / 4 / 16 / 64 / 256) under each "
     "correction of stale rollouts (`none`, `tis`, `m2po`, `vcpo`), mean ± std over seeds; target: at S = 16 the "
     "best correction within the seed spread of S = 1 where `none` falls below it; **selection**, "
     "difficulty-targeted prompts (`adaptive`, `adaptive_dars`, `adaptive_swarm`: 4 SAPO nodes learning pass rates "
     "from their peers' groups; `uniform_swarm`: the same swarm selecting uniformly) against `uniform` at equal "
     "generated tokens: the fraction of groups with signal, held-out accuracy [95% interval] and its paired "
     "difference against `uniform` (and `uniform_swarm`) in points [95% interval, seeds and questions resampled]; "
     "targets: signal +10 points, the held-out interval's lower end at least -2 points; **april**, partial rollouts "
     "against the synchronous step: throughput (tokens that reach training per second of generation) of april over "
     "sync on the base and a long-tail setting, held-out accuracy at equal wall time with the paired interval of "
     "april - sync; targets: at least 1.15x on the long tail, the interval's lower end at least -2 points",
     "rollout_methods.json", until_measured=True)
def rollout_methods(r: Results) -> str:
    d = r["rollout_methods.json"]
    texts = []
    for part, text in ROLLOUT_PARTS.items():
        if part not in d:
            continue
        incomplete = " (incomplete)" if (d.get(f"{part}_setup") or {}).get("complete") is False else ""
        texts.append(f"**{part}**{incomplete} {text(d[part])}")
    return "; ".join(texts) if texts else "no part measured yet"
