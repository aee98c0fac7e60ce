"""bench.gossip's pure parts: gossip.json's fields for both paths, the bounded path's bench caps, and the bounded
node counting groups as they come out of drain() (two FaninNodes over the in-memory transport)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import time

from bench.gossip import BOUNDED, FLOOD, FLOOD_THREAD, gossip_result, path_figures
from bench.gossip_fanin import UNCAPPED, FaninNode, bench_params, latency_stages
from bench.gossip_groups import Deliveries
from bench.gossip_node import accept_policy, rollout_group
from protocol.limits import Limits
from protocol.messages import digest_topic
from swarm_node.sharing.exchange import Received
from swarm_node.sharing.fanin import FanInParams
from swarm_node.sharing.fanin_exchange import reward_stats
from swarm_node.transport.memory import MemoryHub, MemoryTransport, memory_addr

PATH_KEYS = {"groups", "delivered_frac", "groups_per_s", "p50_ms", "p99_ms", "stream_mb_s", "p99_ms_at_500",
             "delivered_frac_at_500"}  # gossip.json's field names before issue 32, each path's


def _run(rate: float, p50: float, stream: float) -> dict[str, dict[str, float]]:
    return {"capacity": {"groups": 12000.0, "delivered_frac": 0.99994, "groups_per_s": rate, "p50_ms": 900.0,
                         "p99_ms": 1500.0, "stream_mb_s": stream},
            "paced": {"groups": 1200.0, "delivered_frac": 1.0, "groups_per_s": 99.0, "p50_ms": p50, "p99_ms": 2 * p50},
            "paced_high": {"groups": 6000.0, "delivered_frac": 0.99995, "groups_per_s": 490.0, "p50_ms": p50,
                           "p99_ms": 3 * p50}}


def test_path_figures_are_the_capacity_rate_and_the_paced_latencies_rounded() -> None:
    median = _run(1012.345, 61.26, 113.66)
    assert path_figures("bounded", median) == {
        "path": "bounded", "groups": 12000, "delivered_frac": 0.9999, "groups_per_s": 1012.3, "p50_ms": 61.3,
        "p99_ms": 122.5, "stream_mb_s": 113.7, "p99_ms_at_500": 183.8, "delivered_frac_at_500": 1.0}


def test_gossip_json_has_the_bounded_path_on_top_and_the_flood_path_with_its_thread_baseline_under_flood() -> None:
    args = argparse.Namespace(nodes=4, batch=16, batch_delay_ms=50.0, rate_high=500.0)
    runs = {BOUNDED: [_run(1000.0, 60.0, 100.0), _run(1100.0, 80.0, 120.0), _run(900.0, 70.0, 110.0)],
            FLOOD: [_run(1200.0, 50.0, 110.0), _run(1000.0, 40.0, 100.0), _run(1100.0, 45.0, 90.0)],
            FLOOD_THREAD: [_run(1000.0, 50.0, 100.0), _run(1000.0, 50.0, 100.0), _run(1000.0, 50.0, 100.0)]}
    result = gossip_result(args, runs)
    assert {k: result[k] for k in ("path", "nodes", "groups", "groups_per_s", "p50_ms", "p99_ms", "p99_ms_at_500",
                                   "stream_mb_s", "rate_high", "round_ms")} == {
        "path": "bounded", "nodes": 4, "groups": 12000, "groups_per_s": 1000.0, "p50_ms": 70.0, "p99_ms": 140.0,
        "p99_ms_at_500": 210.0, "stream_mb_s": 110.0, "rate_high": 500.0, "round_ms": 50.0}
    assert "paired_ratio_vs_thread" not in result  # the baseline is the flood path's
    flood = result["flood"]
    assert PATH_KEYS | {"path", "nodes", "rate_high", "round_ms"} <= set(result)
    assert PATH_KEYS | {"path", "batch", "batch_delay_ms", "paired_ratio_vs_thread", "runs"} <= set(flood)
    assert (flood["path"], flood["groups_per_s"], flood["p50_ms"], flood["batch"]) == ("flood", 1100.0, 45.0, 16)
    # Per run: 1.2, 1.0, 1.1 (groups/s); 1.0, 0.8, 0.9 (p50): medians 1.1 and 0.9.
    assert flood["paired_ratio_vs_thread"] == {"groups_per_s": 1.1, "p50_ms": 0.9, "p99_ms": 0.9,
                                               "stream_mb_s": 1.0}
    assert [r["groups_per_s"] for r in flood["runs"]] == [
        {"process": 1200.0, "thread": 1000.0, "ratio": 1.2}, {"process": 1000.0, "thread": 1000.0, "ratio": 1.0},
        {"process": 1100.0, "thread": 1000.0, "ratio": 1.1}]


def test_the_bench_raises_the_caps_that_bound_a_nodes_intake_and_keeps_the_rest_of_joins_params() -> None:
    params = bench_params(0.05)
    raised = ("pull_target", "max_pulls_per_sender", "serve_per_round", "serve_per_requester", "serve_streams",
              "serve_streams_per_peer")
    assert {name: getattr(params, name) for name in raised} == dict.fromkeys(raised, UNCAPPED)
    assert params.serve_rounds == 600  # serve_for_s (30 s) of 50 ms rounds
    assert bench_params(10.0).serve_rounds == FanInParams().serve_rounds  # never fewer than join's
    unchanged = {f.name for f in dataclasses.fields(FanInParams)} - set(raised) - {"serve_rounds"}
    assert {n: getattr(params, n) for n in unchanged} == {n: getattr(FanInParams(), n) for n in unchanged}


def test_every_bench_group_carries_a_signal_so_the_bounded_path_pulls_it() -> None:
    signals = [reward_stats([c.claimed_reward for c in rollout_group("p", i).completions]) for i in range(7)]
    assert [s for s, _ in signals] == [True] * 7
    assert [round(v, 6) for _, v in signals] == [0.109375, 0.1875, 0.234375, 0.25, 0.234375, 0.1875, 0.109375]


def test_deliveries_count_groups_per_sender_and_drops_by_reason() -> None:
    d = Deliveries()
    d.add("a", [0.1, 0.2], 10.0)
    d.add("b", [0.3], 11.0)
    d.add("a", [0.4], 12.0)
    d.drop("hash_mismatch")
    d.drop("hash_mismatch")
    assert (d.received, d.latencies, d.last_rx, d.drops) == ({"a": 3, "b": 1}, [0.1, 0.2, 0.3, 0.4], 12.0,
                                                             {"hash_mismatch": 2})
    d.clear()
    assert d == Deliveries()


def test_a_bounded_node_counts_what_drain_returns_in_groups_with_their_latency() -> None:
    node = FaninNode(MemoryTransport(MemoryHub(), "me"), Limits(vocab_size=64), accept_policy(),
                     lambda i: rollout_group("me", i))
    group = dataclasses.replace(rollout_group("a", 0), created_at=99.5)
    node.deliver([Received("a", 100.0, group), Received("b", 100.0, None, "replay"), Received("a", 100.0, group)],
                 100.25, 100.0)
    assert (node.deliveries.received, node.deliveries.latencies, node.deliveries.last_rx, node.deliveries.drops) == (
        {"a": 2}, [0.75, 0.75], 100.25, {"replay": 1})
    assert node.marks == [(group.group_id.hex(), 99.5, 100.0, 100.25)] * 2


def test_latency_stages_split_each_delivery_at_the_senders_announce_and_the_receivers_round() -> None:
    """Two deliveries of g1 (announced 0.010 s after its creation at 10.0) and one of g2 (0.030 after 20.0): stage
    values in ms, announce 10, 10, 30; to_round 20, -5, 40; round 50, 70, 100 (p50 = the middle, p99 = the top of
    three); g3 was never announced (a pushed group): left out."""
    sender = {"announced": {"g1": 10.010, "g2": 20.030}, "marks": []}
    receivers = [{"marks": [("g1", 10.0, 10.030, 10.080), ("g2", 20.0, 20.070, 20.170), ("g3", 5.0, 5.1, 5.2)]},
                 {"marks": [("g1", 10.0, 10.005, 10.075)]}]
    assert latency_stages([sender, *receivers]) == {
        "announce_p50_ms": 10.0, "announce_p99_ms": 30.0, "to_round_p50_ms": 20.0, "to_round_p99_ms": 40.0,
        "round_p50_ms": 70.0, "round_p99_ms": 100.0}
    assert latency_stages([{"announced": {}, "marks": []}]) == {}  # the flood path: no stages


def test_two_bounded_nodes_deliver_every_group_offered_as_fast_as_the_rounds_take_them() -> None:
    """70 groups offered at once: more than one round's digests (64), so the offer returns after the second round
    announced the rest; the receiver fetches all 70 (one shard: both nodes start on shard 0, as join's do)."""
    limits = Limits(vocab_size=64)

    async def main() -> tuple[dict[str, int], int, int]:
        hub = MemoryHub()
        transports = {name: MemoryTransport(hub, name) for name in ("a", "b")}
        nodes = {name: FaninNode(t, limits, accept_policy(), lambda i, name=name: rollout_group(name, i), 0.01)
                 for name, t in transports.items()}
        for name in ("a", "b"):
            await transports[name].start()
            await nodes[name].attach()
        await transports["a"].connect(memory_addr("b"))
        assert nodes["a"].topic == digest_topic(0)
        await nodes["b"].offer(0, time.time(), None)  # b's rounds run (it pulls), offering nothing
        await nodes["a"].offer(70, time.time(), None)
        for _ in range(500):
            if nodes["b"].deliveries.received.get("a", 0) >= 70:
                break
            await asyncio.sleep(0.01)
        out = dict(nodes["b"].deliveries.received), len(nodes["b"].deliveries.latencies), nodes["a"].exchange.queued
        stats = [nodes[name].stats() for name in ("a", "b")]
        assert len(stats[0]["announced"]) == 70 and len(stats[1]["marks"]) == 70
        stages = latency_stages(stats)
        assert stages["announce_p50_ms"] >= 0 and stages["round_p50_ms"] >= 0
        for name in ("a", "b"):
            await nodes[name].close()
            await transports[name].stop()
        return out

    assert asyncio.run(main()) == ({"a": 70}, 70, 0)
