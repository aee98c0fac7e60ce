"""Paired ratios in every benchmark that compares ours with a baseline: the helpers (bench/paired.py), each
bench's paired fields from hand-made runs (gossip, gossip_arch, shared_engine, broadcast's libp2p part), and the
README rows reading the paired ratio where a result has it, the old field where it does not."""

from __future__ import annotations

import math

import pytest

from bench.paired import paired_ratio_or_none, paired_ratios, paired_runs, round_order
from bench.report_rows import ROWS


def test_round_order_rotates_so_each_arm_goes_first_in_turn() -> None:
    assert [round_order(("a", "b"), j) for j in range(3)] == [["a", "b"], ["b", "a"], ["a", "b"]]
    assert [round_order(["x", "y", "z"], j)[0] for j in range(4)] == ["x", "y", "z", "x"]


def test_an_undefined_run_ratio_makes_the_paired_ratio_none_rather_than_dropping_the_run() -> None:
    assert paired_ratio_or_none([2.0, 3.0, 9.0], [1.0, 2.0, 3.0]) == 2.0  # ratios 2, 1.5, 3
    assert paired_ratio_or_none([2.0, 3.0], [1.0, 0.0]) is None
    assert paired_ratio_or_none([math.nan, 3.0], [1.0, 2.0]) is None


def test_paired_runs_and_ratios_per_key() -> None:
    ours = [{"rate": 10.0, "ms": 4.0}, {"rate": 30.0, "ms": 6.0}, {"rate": 8.0, "ms": 1.0}]
    base = [{"rate": 5.0, "ms": 2.0}, {"rate": 10.0, "ms": 6.0}, {"rate": 8.0, "ms": 2.0}]
    assert paired_ratios(ours, base, ("rate", "ms")) == {"rate": 2.0, "ms": 1.0}  # rate 2, 3, 1; ms 2, 1, 0.5
    runs = paired_runs(ours, base, ("rate",), names=("process", "thread"))
    assert runs == [{"rate": {"process": 10.0, "thread": 5.0, "ratio": 2.0}},
                    {"rate": {"process": 30.0, "thread": 10.0, "ratio": 3.0}},
                    {"rate": {"process": 8.0, "thread": 8.0, "ratio": 1.0}}]
    with pytest.raises(ValueError):
        paired_runs(ours, base[:2], ("rate",))


def _gossip_run(rate: float, p50: float, p99: float, stream: float) -> dict[str, dict[str, float]]:
    return {"capacity": {"groups": 1200, "delivered_frac": 1.0, "groups_per_s": rate, "p50_ms": 900.0,
                         "p99_ms": 990.0, "stream_mb_s": stream},
            "paced": {"groups": 1200, "delivered_frac": 1.0, "groups_per_s": 99.0, "p50_ms": p50, "p99_ms": p99}}


def test_gossip_pairs_each_run_of_the_process_host_with_the_same_runs_thread_host() -> None:
    from bench.gossip import paired_part

    process = [_gossip_run(200.0, 10.0, 40.0, 100.0), _gossip_run(300.0, 30.0, 60.0, 50.0)]
    thread = [_gossip_run(100.0, 20.0, 40.0, 100.0), _gossip_run(100.0, 10.0, 30.0, 100.0)]
    part = paired_part(process, thread)
    # groups/s ratios 2 and 3 (median 2.5, not 250 / 100); p50 0.5 and 3; p99 1 and 2; stream 1 and 0.5
    assert part["paired_ratio_vs_thread"] == {"groups_per_s": 2.5, "p50_ms": 1.75, "p99_ms": 1.5, "stream_mb_s": 0.75}
    assert part["runs"][1]["groups_per_s"] == {"process": 300.0, "thread": 100.0, "ratio": 3.0}
    assert part["runs"][0]["p50_ms"] == {"process": 10.0, "thread": 20.0, "ratio": 0.5}  # the paced round's latency


def test_gossip_arch_pairs_each_isolation_with_the_same_runs_loop_alone() -> None:
    from bench.gossip_arch import arch_paired

    samples = {"none": [{"steps_per_s": 10.0}, {"steps_per_s": 5.0}, {"steps_per_s": 8.0}],
               "process": [{"steps_per_s": 9.0}, {"steps_per_s": 5.0}, {"steps_per_s": 4.0}],
               "thread": [{"steps_per_s": 5.0}, {"steps_per_s": 5.0}, {"steps_per_s": 2.0}]}
    assert arch_paired(samples) == {"process": 0.9, "thread": 0.5}  # 0.9, 1, 0.5 and 0.5, 1, 0.25


def test_shared_engine_pairs_each_mode_with_the_same_repeats_shared_engine() -> None:
    from bench.shared_engine import paired_vs_shared

    shared = [{"round_s": 2.0, "peak_rss_mib": 1000.0}, {"round_s": 4.0, "peak_rss_mib": 1000.0},
              {"round_s": 3.0, "peak_rss_mib": 2000.0}]
    vllm = [{"round_s": 4.0, "peak_rss_mib": 1500.0}, {"round_s": 4.0, "peak_rss_mib": 2000.0},
            {"round_s": 9.0, "peak_rss_mib": 2000.0}]
    assert paired_vs_shared(vllm, shared) == {"paired_round_s_vs_shared": 2.0, "paired_rss_vs_shared": 1.5}
    assert [(r["round_s_vs_shared"], r["rss_vs_shared"]) for r in vllm] == [(2.0, 1.5), (1.0, 2.0), (3.0, 1.0)]


def test_broadcast_libp2p_rows_pair_pipelined_with_the_same_runs_star() -> None:
    from bench.broadcast import paired_star

    assert paired_star([2.0, 3.0, 2.5], [4.0, 4.0, 10.0]) == {
        "paired_ratio_pipelined_over_star": 0.5,
        "runs": [{"pipelined_s": 2.0, "star_s": 4.0, "ratio": 0.5}, {"pipelined_s": 3.0, "star_s": 4.0, "ratio": 0.75},
                 {"pipelined_s": 2.5, "star_s": 10.0, "ratio": 0.25}]}


def _shared_engine_result(paired: bool) -> dict:
    modes = {}
    for name, round_s, vs in (("shared", 5.0, 1.0), ("vllm_per_node", 10.0, 2.0), ("hf_per_node", 15.0, 3.0)):
        modes[name] = {"round_s_median": round_s, "peak_rss_mib_median": 1000.0, "round_s_vs_shared": vs}
        if paired:
            modes[name]["paired_round_s_vs_shared"] = vs - 0.25 if vs != 1.0 else 1.0
    return {"modes": modes}


def test_shared_engine_row_reads_the_paired_ratio_and_falls_back_to_the_old_one() -> None:
    render = ROWS["shared_engine"].render
    assert render({"shared_engine.json": _shared_engine_result(paired=False)}) == (
        "s/round shared 5.00, vLLM per node 10.00 (2.00x), HF per node 15.00 (3.00x); peak RSS 1000 / 1000 / 1000 MiB")
    assert render({"shared_engine.json": _shared_engine_result(paired=True)}) == (
        "s/round shared 5.00, vLLM per node 10.00 (1.75x, median of paired repeats), HF per node 15.00 (2.75x, "
        "median of paired repeats); peak RSS 1000 / 1000 / 1000 MiB")


def test_broadcast_row_adds_the_paired_ratio_only_where_measured() -> None:
    row = {"n": 6, "size_mb": 16.0, "pipelined_s": 5.0, "star_s": 20.0, "bound_s": 4.0}
    d = {"bandwidth_mb_s": 4.0, "simulated": [{**row, "n": 32}], "libp2p": [row]}
    old = ROWS["broadcast"].render({"broadcast.json": d})
    assert old.endswith("libp2p N=6, 16 MB: pipelined 5.00 s (1.25x), star 20.00 s")
    d["libp2p"] = [{**row, "paired_ratio_pipelined_over_star": 0.3}]
    assert ROWS["broadcast"].render({"broadcast.json": d}) == old + (
        " (pipelined/star 0.30x, median of paired runs)")


def test_gossip_and_fuzz_rows_add_the_paired_ratio_only_where_measured() -> None:
    gossip = {"delivered_frac": 1.0, "groups_per_s": 237.7, "p50_ms": 16.2, "p99_ms": 52.8, "stream_mb_s": 112.0}
    old = ROWS["gossip"].render({"gossip.json": gossip})
    assert old == "delivered 1.000 at 238 groups/s; p50 16 ms, p99 53 ms at 100 groups/s; stream 112 MB/s"
    paired = {**gossip, "paired_ratio_vs_thread": {"groups_per_s": 1.1, "p50_ms": 0.8, "p99_ms": 1.0,
                                                   "stream_mb_s": 0.9}}
    assert ROWS["gossip"].render({"gossip.json": paired}) == old + (
        " (against the host on a thread: groups/s 1.10x, p50 0.80x, medians of paired runs)")
    # Both paths (issue 32): the bounded one at the top, the flood one with its batching and paired ratios.
    figures = {**gossip, "p99_ms_at_500": 71.4, "delivered_frac_at_500": 1.0}
    both = {**figures, "path": "bounded", "groups": 12000, "rate_high": 500.0, "round_ms": 50.0,
            "flood": {**paired, "p99_ms_at_500": 90.0, "path": "flood", "batch": 16, "batch_delay_ms": 50.0}}
    assert ROWS["gossip"].render({"gossip.json": both}) == (
        "bounded fan-in (join's default): delivered 1.000 at 238 groups/s; p50 16 ms, p99 53 ms at 100 groups/s, "
        "p99 71 ms at 500; 12,000 groups, stream 112 MB/s | flood: delivered 1.000 at 238 groups/s; p50 16 ms, "
        "p99 53 ms at 100 groups/s, p99 90 ms at 500; 16 groups/message at most (against the host on a thread: "
        "groups/s 1.10x, p50 0.80x, medians of paired runs)")
    fuzz = {"inputs": 200000, "crashes": 0, "inputs_per_s": 41234.0}
    assert ROWS["fuzz_wire"].render({"fuzz_wire.json": fuzz}) == "200,000 inputs, 0 crashes, 41,200 inputs/s"
    assert ROWS["fuzz_wire"].render({"fuzz_wire.json": {**fuzz, "paired_ratio_decode_over_unpackb": 0.25}}) == (
        "200,000 inputs, 0 crashes, 41,200 inputs/s (0.25x plain `msgpack.unpackb`, median of paired batches)")


def _soak_sample(t: float, rss: float, segment: int = 1, arm: str | None = None) -> dict:
    sample = {"t": t, "rss_mib": rss, "steps": int(t), "segment": segment, "phase": "train"}
    return sample if arm is None else {**sample, "arm": arm}


def test_the_soak_baseline_is_measured_beside_ours_and_kept_apart() -> None:
    import os

    from bench.memory import BASELINE, OURS, arm_samples, sample_of, soak_part

    samples = [_soak_sample(0, 100.0), _soak_sample(0, 200.0, arm=BASELINE),
               _soak_sample(3600, 110.0), _soak_sample(3600, 260.0, arm=BASELINE),
               _soak_sample(7200, 120.0, segment=2), _soak_sample(7200, 300.0, segment=2, arm=BASELINE)]
    assert [s["rss_mib"] for s in arm_samples(samples, OURS)] == [100.0, 110.0, 120.0]  # no arm: ours
    # window = min(600 s, half the soak): first and last samples alone; 120/100 - 1 and 300/200 - 1
    assert soak_part(samples, OURS) == {"hours": 2.0, "rss_growth_frac": 0.2, "segments": [
        {"segment": 1, "hours": 1.0, "rss_growth_frac": 0.1}, {"segment": 2, "hours": 0.0, "rss_growth_frac": None}]}
    assert soak_part(samples, BASELINE)["rss_growth_frac"] == 0.5
    mine = sample_of(BASELINE, os.getpid(), 12.34, 3, steps_before=0)
    assert mine is not None and mine["arm"] == BASELINE and mine["t"] == 12.3 and mine["rss_mib"] > 0
    assert "arm" not in (sample_of(OURS, os.getpid(), 1.0, 1, 0) or {"arm": "missing"})  # as samples were before


def test_the_memory_row_reads_the_baseline_where_the_soak_measured_one() -> None:
    d = {"budgets_mib": [950, 1100, 1400], "peak_rss_mib": [800.0, 900.0, 1000.0], "within_budget": True,
         "steps": 6, "soak_target_hours": 2, "soak_hours": 2.0, "soak_rss_growth_frac": 0.0116,
         "soak_segments": [{"segment": 1, "hours": 2.0, "rss_growth_frac": 0.0116}]}
    soak = {"samples": [_soak_sample(7200, 120.0), _soak_sample(7200, 300.0, arm="onednn_default_cache")]}
    old = ROWS["memory"].render({"memory.json": d, "memory_soak.jsonl": soak})
    assert old.endswith("7200 steps, on a loaded machine): RSS growth +1.2% (segments +1.2%), against +17.9% (an "
                        "earlier soak, not in a result file) before `ONEDNN_PRIMITIVE_CACHE_CAPACITY=0` bounded "
                        "oneDNN's primitive cache")
    paired = {**d, "soak_baseline": {"arm": "onednn_default_cache", "rss_growth_frac": 0.179, "segments": []}}
    assert ROWS["memory"].render({"memory.json": paired, "memory_soak.jsonl": soak}).endswith(
        "RSS growth +1.2% (segments +1.2%), against +17.9% for a node beside it in the same soak with oneDNN's "
        "default primitive cache (`ONEDNN_PRIMITIVE_CACHE_CAPACITY=1024`; ours sets 0)")
