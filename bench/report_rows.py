"""The README's benchmark rows, one renderer per result (the registry: bench/report_registry.py): learning,
sampling, gossip, SAPO, attacks, memory, NAT, broadcast and staleness. The swarm-scale rows follow, in
bench/report_rows_scale.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bench.report_registry import ROWS, Results, Row, pts, row, slash

__all__ = ["ROWS", "Results", "Row"]


@row("solo_learning", "python -m bench.solo_learning --steps 500",
     "held-out greedy accuracy before/after solo GRPO from the embedded default model on the default mix, 3 seeds one "
     "after another (2 threads; the default model built first into an empty cache, timed): means over seeds on "
     "distinct test questions (4,000 by default, 1,000 per specialty), "
     "the gain's 95% interval resampling seeds, then questions; the issue asks for +10 points with the interval above "
     "0 and every specialty improving, at most 30 minutes a seed", "solo_learning.json")
def solo_learning(r: Results) -> str:
    d = r["solo_learning.json"]
    if "gain_ci95" not in d:  # the bench before issue 30 item 4: medians over seeds, sampled reward beside
        return (f"earlier bench: {d['steps']} steps, {d['eval_problems']} draws of at most 236 distinct questions, "
                f"medians of {len(d['seeds'])} seeds: greedy {d['eval_acc_before']:.3f} -> {d['eval_acc_after']:.3f} "
                f"({d['greedy_gain_points']:+.1f} pts), sampled reward {d['sampled_reward_before']:.3f} -> "
                f"{d['sampled_reward_after']:.3f}")
    (low, high), seeds = d["gain_ci95"], slash([pts(g) for g in sorted(p["gain"] for p in d["per_seed"])], "")
    specialties = ", ".join(f"{name} {pts(s['gain'])} [{pts(s['gain_ci95'][0])}, {pts(s['gain_ci95'][1])}]"
                            for name, s in d["per_specialty"].items())
    build = "model cache reused" if d["build_s"] is None else f"build {d['build_s']:.0f} s"
    return (f"{d['steps']} steps, {len(d['seeds'])} seeds: greedy {d['eval_acc_before']:.3f} -> "
            f"{d['eval_acc_after']:.3f} on {d['eval_distinct_questions']} {d['split']} questions, gain "
            f"{pts(d['gain'])} pts (95% interval {pts(low)} to {pts(high)}; seeds {seeds}); per specialty "
            f"{specialties}; well-formed {d['well_formed_frac_before']:.2f} -> {d['well_formed_frac_after']:.2f}; "
            f"{d['solo_s']:.0f} s/seed, {build}")


@row("sampler", "python -m bench.sampler",
     "tokens/s of our vLLM sampler vs raw `LLM.generate` vs the native and transformers samplers, weight-sync "
     "latency", "sampler.json")
def sampler(r: Results) -> str:
    m = r["sampler.json"]["models"][-1]
    if "paired_ratio_ours_over_raw" in m:
        raw, hf, how = m["paired_ratio_ours_over_raw"], m["paired_ratio_ours_over_hf"], "median of paired runs"
    else:
        raw, hf, how = m["ours_tok_s"] / m["raw_vllm_tok_s"], m["ours_tok_s"] / m["hf_tok_s"], "ratios of medians"
    line = (f"{m['params'] / 1e6:.1f}M model: {m['ours_tok_s']:,.0f} tok/s = {raw:.2f}x raw vLLM, {hf:.1f}x "
            f"transformers ({how}); sync {m['weight_sync_ms']:.0f} ms")
    if (d := r["sampler.json"].get("reasoning_default")) is not None:
        line += (f"; the reasoning default (no vLLM kernel): native {d['native_tok_s']:,.0f} tok/s = "
                 f"{d['paired_ratio_native_over_hf']:.1f}x transformers")
    return line


@row("step_rate", "python -m bench.step_rate",
     "steps/min of `solo` and of a two-node loopback `join` (chain_sum, the earlier embedded model "
     "`char-answer-line-v1`, which both versions load): the code of "
     "2026-11-24 (8ef0a4d) vs today's, and today's with one factor set back to its old value (median of paired "
     "rounds)", "step_rate.json")
def step_rate(r: Results) -> str:
    d = r["step_rate.json"]
    rates, ratio = d["steps_per_min_median"], d["ratio_now_over_then"]
    headline = "; ".join(f"{mode} {rates[mode]['old']:.1f} -> {rates[mode]['now']:.1f} steps/min "
                         f"(now/old {ratio[mode]:.2f})" for mode in ratio)
    factors = ", ".join(f"{name} " + " / ".join(f"{mode} {v:.2f}" for mode, v in by_mode.items())
                        for name, by_mode in d["factors"].items())
    return (f"{headline}; each factor's arm over today's (mmap_threshold: fixed at 1 MiB from the start, as nodes did "
            f"before 2026-11-26; prompts_per_step: 16 prompts a step, the old default, against today's 32): {factors}")


@row("flood_recovery", "python -m bench.flood_recovery",
     "two honest gossip stand-ins sharing a group a second on loopback while fresh identities flood one of them with "
     "valid signed groups: the longest gap in honest delivery, either way, from the flood to 2 minutes after it",
     "flood_recovery.json")
def flood_recovery(r: Results) -> str:
    d = r["flood_recovery.json"]
    before, after = d["runs_before"], d["runs_after"]
    return (f"{d['flood_groups']} groups in {d['flood_seconds']:g} s from {d['flood_identities']} identities: longest "
            f"honest gap {d['max_honest_gap_s_before']:.1f} s before the fix (runs "
            f"{slash([x['max_gap_s'] for x in before], '.1f')} s), {d['max_honest_gap_s_after']:.1f} s after (runs "
            f"{slash([x['max_gap_s'] for x in after], '.1f')} s){' on a loaded machine' if d.get('loaded') else ''}")


@row("gossip", "python -m bench.gossip",
     "4 libp2p processes on loopback: groups/s delivered to every peer, latency, stream MB/s", "gossip.json")
def gossip(r: Results) -> str:
    d = r["gossip.json"]
    if "flood" not in d:  # results before the bounded path was measured (issue 32): the flood path alone
        return (f"delivered {d['delivered_frac']:.3f} at {d['groups_per_s']:.0f} groups/s; p50 {d['p50_ms']:.0f} ms, "
                f"p99 {d['p99_ms']:.0f} ms at 100 groups/s" + at_500(d) + f"; stream {d['stream_mb_s']:.0f} MB/s"
                + vs_thread(d))
    flood = d["flood"]
    return (f"bounded fan-in (join's default): {path_figures(d)}; {d['groups']:,} groups, stream "
            f"{d['stream_mb_s']:.0f} MB/s | flood: {path_figures(flood)}; {flood['batch']} groups/message at most"
            + vs_thread(flood))


def path_figures(d: dict[str, Any]) -> str:
    """One path's delivery, rate and latencies (gossip.json's top level, or its "flood")."""
    return (f"delivered {d['delivered_frac']:.3f} at {d['groups_per_s']:.0f} groups/s; p50 {d['p50_ms']:.0f} ms, "
            f"p99 {d['p99_ms']:.0f} ms at 100 groups/s, p99 {d['p99_ms_at_500']:.0f} ms at 500")


def at_500(d: dict[str, Any]) -> str:
    """The paced round at 500 groups/s and the batching it ran with (results before 2026-11-27 have neither)."""
    if "p99_ms_at_500" not in d:
        return ""
    return (f", p99 {d['p99_ms_at_500']:.0f} ms at {d['rate_high']:.0f} groups/s; {d['groups']:,} groups, "
            f"{d['batch']} groups/message at most")


def vs_thread(d: dict[str, Any]) -> str:
    """Against the host on a thread, where the paired ratios were measured (older results have none)."""
    paired = d.get("paired_ratio_vs_thread") or {}
    if paired.get("groups_per_s") is None or paired.get("p50_ms") is None:
        return ""
    return (f" (against the host on a thread: groups/s {paired['groups_per_s']:.2f}x, p50 {paired['p50_ms']:.2f}x, "
            "medians of paired runs)")


@row("fuzz_wire", "python -m bench.fuzz_wire", "random and mutated inputs through the wire decoder", "fuzz_wire.json")
def fuzz_wire(r: Results) -> str:
    d = r["fuzz_wire.json"]
    text = f"{d['inputs']:,} inputs, {d['crashes']} crashes, {round(d['inputs_per_s'], -2):,.0f} inputs/s"
    if d.get("paired_ratio_decode_over_unpackb") is not None:  # older results have none
        text += (f" ({d['paired_ratio_decode_over_unpackb']:.2f}x plain `msgpack.unpackb`, median of paired "
                 "batches)")
    return text


def grid(configs: dict[str, Any], decimals: int, spread: bool, gain_decimals: int) -> str:
    """'8/0 64.8±0.3, 6/2 62.6±0.5 (-3%), ...': cumulative reward per configuration (± its std over seeds when
    `spread`), and its gain against 8/0."""
    parts = []
    for name, c in configs.items():
        text = f"{name} {c['cum_reward_mean']:.{decimals}f}"
        if spread:
            text += f"±{c['cum_reward_std']:.{decimals}f}"
        if name != "8/0" and c.get("gain_vs_8_0_pct") is not None:
            text += f" ({c['gain_vs_8_0_pct']:+.{gain_decimals}f}%)"
        parts.append(text)
    return ", ".join(parts)


def paper_gains(configs: dict[str, Any]) -> str:
    return "/".join(f"{c['paper_gain_vs_8_0_pct']:+.0f}" for n, c in configs.items()
                    if n != "8/0" and c.get("paper_gain_vs_8_0_pct") is not None) + "%"


@row("sapo_sweep", "python -m bench.sapo_sweep --is",
     "SAPO's I/J grid on a simulated 4-node swarm (cumulative reward per local completion, 3 seeds)", "sapo_sweep.json")
def sapo_sweep(r: Results) -> str:
    d = r["sapo_sweep.json"]
    return (f"{d['nodes']} nodes x {d['rounds']} rounds x {len(d['seeds'])} seeds: "
            f"{grid(d['configs'], 1, True, 0)}; paper after 2000 rounds: {paper_gains(d['configs'])}. Here "
            "sharing as on-policy hurts, more with more external groups; with the truncated importance weight "
            "(4/4+is) the loss is gone: identical nodes on one small task (see the closing note of session 3)")


def arms(part: dict[str, Any], own: bool) -> str:
    """Each arm's held-out accuracy; with `own`, a specialist's accuracy on its own specialty in brackets."""
    texts = []
    for name, c in part.items():
        texts.append(f"{name} {c['final_eval_acc_mean']:.3f}")
        if own and name != "solo_generalist":
            texts[-1] += f" ({'own specialty ' if len(texts) == 1 else ''}{c['own_specialty_acc_mean']:.3f})"
    return ", ".join(texts)


def controls(d: dict[str, Any]) -> str:
    homogeneous, parts, positive = d["homogeneous"], [], True
    for name, c in d["controls"].items():
        shared = homogeneous[c["controls"]]
        parts.append(f"{c['controls']} beats {name} ({c['cum_reward_mean']:.2f}±{c['cum_reward_std']:.2f}) by "
                     f"{c['sharing_gain_pct']:+.1f}%")
        positive &= all(s > a for s, a in zip(shared["per_seed"], c["per_seed"], strict=True))
    seeds = " and ".join(str(s) for s in next(iter(d["controls"].values()))["seeds_done"])
    return (f"(`--scenario controls`, seeds {seeds}): " + " and ".join(parts)
            + (", every seed pair positive" if positive else ", not every seed pair positive"))


@row("sapo_mix", "python -m bench.sapo_mix",
     "SAPO on the default 4-specialty mix, held-out eval (`run.eval_problems` 200 draws, at most 167 distinct "
     "questions): homogeneous I/J grid (cumulative reward per local "
     "completion) and a specialised swarm (70% own specialty) against the same nodes alone and generalists alone; "
     "4 nodes, resumable cells", "sapo_mix_pilot.json", "sapo_mix_partial.json")
def sapo_mix(r: Results) -> str:
    pilot, partial = r["sapo_mix_pilot.json"], r["sapo_mix_partial.json"]
    paper = ", ".join(f"{n} {c['paper_cum_reward']:.1f}" + (f" ({c['paper_gain_vs_8_0_pct']:+.0f}%)" if n != "8/0"
                                                             else "")
                      for n, c in pilot["homogeneous"].items() if "paper_cum_reward" in c)
    accs = [c["final_eval_acc_mean"] for c in partial["homogeneous"].values()]
    spec = partial["specialised"]
    swarm = spec["swarm"]["final_eval_acc_mean"]
    seeds = " and ".join(str(s) for s in partial["homogeneous"]["8/0"]["seeds_done"])
    spec_seeds = " and ".join(str(s) for s in spec["swarm"]["seeds_done"])
    return (f"**pilot** ({len(pilot['seeds'])} seed, {pilot['rounds']} rounds, `bench/results/sapo_mix_pilot.json`): "
            f"{grid(pilot['homogeneous'], 2, False, 0)}; the paper after 2000 rounds: {paper}. Specialised "
            f"held-out accuracy: {arms(pilot['specialised'], own=False)} (from 0.205). **Grid so far** "
            f"({partial['rounds']} rounds, seeds {seeds}, `bench/results/sapo_mix_partial.json`): "
            f"{grid(partial['homogeneous'], 2, True, 1)}; held-out accuracy {min(accs):.3f}-{max(accs):.3f} in "
            "every configuration. At equal rounds sharing is level with 8/0, far from the paper's +52-95%. "
            f"**Against the same local completions without peers** {controls(partial)}: a 2/6 node matches 8/0's "
            "reward while generating a quarter of the local completions (held-out accuracy moves by under a point "
            f"either way). **Specialised, seed {spec_seeds}** ({partial['rounds']} rounds): held-out accuracy "
            f"{arms(spec, own=True)}: "
            f"{pts(swarm - spec['solo_generalist']['final_eval_acc_mean'])} and "
            f"{pts(swarm - spec['solo_specialist']['final_eval_acc_mean'])} points, short of the +5 and +10 targets. "
            "**Selection ablation** (4/4, `selection = \"variance\"`, seed 1 only; not in a result file): cum 73.56 "
            "against 4/4's 70.40 and 8/0's 71.23 on the same seed (+3.3% vs 8/0), held-out 0.220. Seed 0 and "
            "specialised seeds 0 and 2 are not run")


def per_fraction(values: dict[str, float], fmt: Callable[[float], str], skip_clean: bool = False) -> str:
    return " / ".join(fmt(v) for f, v in values.items() if not (skip_clean and float(f) == 0.0))


@row("attack", "python -m bench.attack",
     "a byzantine swarm (10 nodes, 100 rounds, seeds 0-4 paired, held-out eval of 400 draws, at most "
     "219 distinct questions) at 0 / 10 / 30 / 50% "
     "attackers of seven kinds, the same honest nodes alone, junk with and without the well-formed defence, one real "
     "`join` under live attackers (3 rounds of every fraction), and kill -9 at 100 points; resumable cells",
     "attack.json")
def attack(r: Results) -> str:
    d = r["attack.json"]
    worst = max(d["honest_eval_acc"], key=float)
    se = d["honest_eval_paired_se"]["vs_solo"][worst]
    external = set(d["external_groups_trained_per_step"].values())
    external_text = (f"{external.pop():.1f} external groups trained per step at every fraction" if len(external) == 1
                     else "external groups trained per step "
                     + per_fraction(d["external_groups_trained_per_step"], lambda v: f"{v:.1f}"))
    bad = sum(d["bad_groups_trained"].values())
    bad_text = ("0 bad groups trained of every kind" if bad == 0 else
                "bad groups trained " + ", ".join(f"{k} {v}" for k, v in d["bad_groups_trained"].items() if v))
    trained = {k: v for k, v in d["attacker_groups_trained"].items() if v}
    if trained:  # sent by attackers, trained with our own re-computed rewards: the design working, not harm
        bad_text += (" (`bad_groups_trained`: a forged claim or a replay that reached the loss); attackers' groups "
                     "trained with our own rewards (`attacker_groups_trained`): "
                     + ", ".join(f"{k} {v}" for k, v in trained.items()))
    kill = d["kill_resume"]
    mid_write = sum(t["mid_write"] for t in kill["by_target"].values())
    return (f"honest held-out accuracy {per_fraction(d['honest_eval_acc'], lambda v: f'{v:.3f}')} (vs clean "
            f"{per_fraction(d['honest_eval_vs_clean'], pts, skip_clean=True)} points; vs the same nodes alone "
            f"{per_fraction(d['honest_eval_vs_solo'], pts)} points, at {100 * float(worst):.0f}% SE {100 * se:.1f} "
            f"over seeds: level with alone), {external_text}, {bad_text}; junk trained "
            f"{d['junk_groups_trained']['with_defence']} with the defence, {d['junk_groups_trained']['without']} "
            f"without; live `join`: max RSS {per_fraction(d['max_rss_mib'], lambda v: f'{v:.0f}')} MiB (worst "
            f"round), steps/min {per_fraction(d['steps_per_min_vs_clean'], lambda v: f'{v:.2f}')} of clean (median "
            f"of {d['scale']['live']['live_repeats']} rounds); kill -9 at {kill['points']} points ({mid_write} "
            f"mid-write{cells_went_on(kill)}): {kill['unusable_runs']} unusable runs")


def cells_went_on(kill: dict[str, Any]) -> str:
    """How the killed cells went on, where counted (results before the checks were tightened have no `cells`)."""
    if "cells" not in kill:  # measured before issue 28 item 4: say what those checks did not look at
        return (", by checks that did not read the step a `join` resumed from, counted a worker's kill near a "
                "version change as mid-write, and took a cell redone from scratch as usable")
    c, workers = kill["cells"], kill["by_target"]["worker"]["mid_write"]
    return (f", of them {workers} workers killed inside a delta's apply; cells: {c['resumed']} resumed, "
            f"{c['redone']} redone from scratch ({c['redone_with_snapshot']} with a snapshot there), "
            f"{c['finished']} finished before the kill")


@row("memory", "python -m bench.memory",
     "peak RSS of `solo` runs under memory budgets (each a separate process, peak from the kernel), and a soak",
     "memory.json", "memory_soak.jsonl")
def memory(r: Results) -> str:
    d, soak = r["memory.json"], r["memory_soak.jsonl"]
    segments = " and ".join(f"{s['rss_growth_frac']:+.1%}" for s in d["soak_segments"])
    within = "all within budget" if d["within_budget"] else "not all within budget"
    ours = [s for s in soak["samples"] if s.get("arm", "ours") == "ours"]  # a baseline node's samples carry its arm
    return (f"budgets {slash(d['budgets_mib'], 'd')} MiB (vLLM sampler, {d['steps']} steps): peaks "
            f"{slash(d['peak_rss_mib'], '.0f')} MiB, {within}. Soak (`--soak-hours {d['soak_target_hours']:g}`, "
            f"{d['soak_hours']:.2f} h of training in {len(d['soak_segments'])} resumed segments, "
            f"{ours[-1]['steps']} steps, on a loaded machine): RSS growth {d['soak_rss_growth_frac']:+.1%} "
            f"(segments {segments}), {soak_baseline(d)}")


def soak_baseline(d: dict[str, Any]) -> str:
    """The soak's baseline: measured beside ours where the result has one, else the earlier soak's figure."""
    base = d.get("soak_baseline")
    if base is None or base.get("rss_growth_frac") is None:
        return ("against +17.9% (an earlier soak, not in a result file) before `ONEDNN_PRIMITIVE_CACHE_CAPACITY=0` "
                "bounded oneDNN's primitive cache")
    return (f"against {base['rss_growth_frac']:+.1%} for a node beside it in the same soak with oneDNN's default "
            "primitive cache (`ONEDNN_PRIMITIVE_CACHE_CAPACITY=1024`; ours sets 0)")


@row("nat", "python -m bench.nat",
     "two nodes behind real NATs (network namespaces, nft masquerade): discovery, reachability, relay, hole "
     "punching, ECHO-2 deltas", "nat.json")
def nat(r: Results) -> str:
    s = {row["name"]: row for row in r["nat.json"]["scenarios"]}
    cone, sym, echo, leaves = s["cone"], s["symmetric"], s["echo_worker_behind_nat"], s["relay_leaves"]
    private = "both private" if cone["reachability_a"] == cone["reachability_b"] == "private" else (
        f"reachability {cone['reachability_a']}/{cone['reachability_b']}")
    blocked = "direct dial blocked" if not cone["direct_dial_before_punch"] else "direct dial open"
    ends = "ends direct (hole punched)" if cone["path"] == "direct" else f"ends {cone['path']}"
    stays = "stays relayed" if sym["path"] == "relay" else f"ends {sym['path']}"
    return (f"cone: found via {cone['discovered_via'].upper()}, {private}, {blocked}, {ends}, "
            f"{cone['groups_exchanged']} groups exchanged; symmetric: {stays}, {sym['groups_exchanged']} groups; "
            f"ECHO-2 worker behind NAT: {echo['deltas_received']} deltas received; relay leaves: re-reserved on "
            f"another relay in {leaves['time_to_reconnect_s']:.1f} s" + bootstrap_leaves(s))


def bootstrap_leaves(scenarios: dict[str, Any]) -> str:
    row = scenarios.get("bootstrap_leaves_after_punch")
    if row is None:
        return ""
    runs = ", ".join(f"{a}/{b}" for a, b in row["runs"])
    return (f"; bootstrap leaves after the punch: groups each way in the 2 minutes after it stopped {runs} "
            f"({len(row['runs'])} runs)")


@row("shared_engine", "python -m bench.shared_engine",
     "a simulated 8-node swarm (LoRA rank 8, G = 8, 8 groups per node per round, 1 thread): one shared vLLM engine "
     "serving every node as an adapter vs a vLLM engine per node vs a transformers sampler per node; s/round and "
     "peak RSS, 3 interleaved repeats", "shared_engine.json")
def shared_engine(r: Results) -> str:
    m = r["shared_engine.json"]["modes"]
    s, v, h = m["shared"], m["vllm_per_node"], m["hf_per_node"]
    return (f"s/round shared {s['round_s_median']:.2f}, vLLM per node {v['round_s_median']:.2f} "
            f"({vs_shared(v)}), HF per node {h['round_s_median']:.2f} ({vs_shared(h)}); "
            f"peak RSS {s['peak_rss_mib_median']:.0f} / {v['peak_rss_mib_median']:.0f} / "
            f"{h['peak_rss_mib_median']:.0f} MiB")


def vs_shared(mode: dict[str, Any]) -> str:
    """A mode's s/round against the shared engine: the paired ratio where measured, else the ratio of medians."""
    if mode.get("paired_round_s_vs_shared") is not None:
        return f"{mode['paired_round_s_vs_shared']:.2f}x, median of paired repeats"
    return f"{mode['round_s_vs_shared']:.2f}x"


@row("broadcast", "python -m bench.broadcast",
     "time until N followers hold a policy delta: pipelined (stripe:2) vs a star from the learner vs the floor M/B; "
     "discrete-event simulation (N 2-32, 8 and 64 MB) and libp2p processes on loopback with app-level shaping",
     "broadcast.json")
def broadcast(r: Results) -> str:
    d = r["broadcast.json"]
    sim = max(d["simulated"], key=lambda x: (x["n"], x["size_mb"]))
    lib = max(d["libp2p"], key=lambda x: (x["n"], x["size_mb"]))
    return (f"simulated N={sim['n']}, {sim['size_mb']:g} MB at {d['bandwidth_mb_s']:g} MB/s: pipelined "
            f"{sim['pipelined_s']:.2f} s = {sim['pipelined_s'] / sim['bound_s']:.2f}x the {sim['bound_s']:.1f} s "
            f"floor, star {sim['star_s']:.0f} s; libp2p N={lib['n']}, {lib['size_mb']:g} MB: pipelined "
            f"{lib['pipelined_s']:.2f} s ({lib['pipelined_s'] / lib['bound_s']:.2f}x), star {lib['star_s']:.2f} s"
            + pipelined_over_star(lib))


def pipelined_over_star(libp2p_row: dict[str, Any]) -> str:
    """The libp2p row's paired ratio, where it was measured (older results have none)."""
    ratio = libp2p_row.get("paired_ratio_pipelined_over_star")
    return "" if ratio is None else f" (pipelined/star {ratio:.2f}x, median of paired runs)"


@row("delta_bytes", "python -m bench.delta_bytes",
     "bytes per policy update (full fp32 / dense bf16 / top-k with error feedback) and reward at equal steps",
     "delta_bytes.json")
def delta_bytes(r: Results) -> str:
    d = r["delta_bytes.json"]
    small, large, reward = d["models"]["default"], d["models"]["larger"], d["reward_at_equal_steps"]
    kinds = ("full_fp32", "dense_bf16", "topk")
    agree = reward["hash_agreement"] and all(m[f"{k}_hash_agreement"] for m in (small, large) for k in kinds)
    mb = " / ".join(f"{small[k + '_bytes'] / 1e6:.2f} MB" for k in kinds)
    return (f"default model: {mb} (top-k "
            f"{reward['topk_fraction']:.0%}); {large['params'] / 1e6:.1f}M model: "
            f"{slash([large[k + '_bytes'] / 1e6 for k in kinds], '.1f')} MB; reward after {reward['steps']} steps "
            f"{slash([reward['full'], reward['dense-bf16'], reward['topk']], '.3f')}; followers' hashes "
            + ("always agree" if agree else "do not always agree"))


@row("staleness", "python -m bench.staleness",
     "ECHO-2 overlap: s/step, generation and training s, learner utilisation and reward for S = 0, 1, 2, 4; virtual "
     "clock (2 workers) and a real learner + worker pinned to one core each", "staleness.json")
def staleness(r: Results) -> str:
    d = r["staleness.json"]
    pinned = {p["s"]: p for p in d["pinned"]}
    s0, s1 = pinned[0], pinned[1]
    rewards = [p["reward"] for p in d["pinned"] + d["virtual"]]
    steps = d["setup"]["steps"]
    return (f"pinned (learner on core 0, worker on core 1): S=0 {s0['step_s']:.3f} s/step (gen {s0['gen_s']:.3f} + "
            f"train {s0['train_s']:.3f}), S=1 {s1['step_s']:.3f} s/step, overlap_ratio {d['overlap_ratio']:.2f}; "
            "virtual learner utilisation " + ", ".join(f"S={v['s']} {v['utilization']:.2f}" for v in d["virtual"])
            + f"; reward at {steps} steps within noise across S ({min(rewards):.3f}-{max(rewards):.3f})")

