"""The swarm-scale simulator (simulations/scale_*.py): hand-checkable flood counts, the flood's analytical model
against its simulator, and the bounded design's invariants."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest

from simulations.scale_bounded import _Bounded
from simulations.scale_flood import _Flood, data_copies, flood_counts, simulate_flood
from simulations.scale_model import (
    CONTROL_BYTES,
    GOSSIP_OVERHEAD,
    KB,
    MSG_ID_BYTES,
    SENDER_RECORD_BYTES,
    GossipParams,
    ScaleSetup,
)
from simulations.scale_shards import HOST_GOSSIP_BEFORE, SHARD_GOSSIP, Shard
from simulations.scale_sim import DESIGNS, measure
from simulations.scale_wire import WireSizes
from swarm_node.sharing.fanin import FanInParams, epoch_shards, shard_count


def test_flood_of_three_nodes_counts_every_copy_by_hand() -> None:
    setup = ScaleSetup(n=3, rounds=4, warmup=1)
    record = _Flood(setup, GossipParams()).run()
    groups = setup.n * setup.groups_per_node
    measured = slice(setup.warmup * groups, setup.rounds * groups)
    # Each node receives each of the other two nodes' I groups: every group reaches exactly N - 1 = 2 peers.
    assert set(record.receivers[measured].tolist()) == {2}
    assert set(record.received[setup.warmup:setup.rounds].flatten().tolist()) == {2 * setup.groups_per_node}
    figures = record.metrics()
    # Per node and round: each of the 8 groups twice (from its origin, and forwarded by the third node: mesh of
    # 2 minus forwarder and origin), IDONTWANT from both mesh peers for each of the 12 groups, no lazy peers.
    assert figures["inbound_msgs_per_round"] == 8 * 2 + 12 * 2
    assert figures["inbound_kb_per_round"] == (16 * (setup.group_bytes + GOSSIP_OVERHEAD)
                                               + 24 * (CONTROL_BYTES + MSG_ID_BYTES)) / KB
    assert figures["distinct_peers_10_rounds"] == 2
    assert figures["latency_to_k_ms_p50"] == float("inf")  # K = 3 receivers do not exist among 2 peers
    assert data_copies(setup, GossipParams()) == 2 + 2 * 1 + 0


def test_flood_closed_form_matches_the_simulator_at_n10() -> None:
    setup = ScaleSetup(n=10, rounds=12)
    simulated, analytical = simulate_flood(setup), flood_counts(setup)
    for key in ("inbound_msgs_per_round", "inbound_kb_per_round", "inbound_kb_per_round_p99",
                "outbound_kb_per_round_p99"):
        assert analytical[key] == pytest.approx(simulated[key], rel=0.005), key
    for key in ("rounds_with_J_frac", "pulled_by_ge1_frac", "distinct_peers_10_rounds", "distinct_peers_100_rounds"):
        assert analytical[key] == pytest.approx(simulated[key], abs=1e-6), key
    assert analytical["latency_to_k_ms_p50"] == pytest.approx(simulated["latency_to_k_ms_p50"], rel=0.1)
    # 57 transmissions per message: C = 9 from the origin, its 6 mesh peers 5 each, its 3 lazy peers 6 each.
    assert data_copies(setup, GossipParams()) == 9 + 6 * 5 + 3 * 6


def test_flood_is_analytical_from_1000_nodes_and_overloads_its_links() -> None:
    figures, how = measure("flood", ScaleSetup(n=10000, rounds=12))
    assert how == "analytical" and sorted(DESIGNS) == ["bounded", "bounded-flush-push", "flood"]
    # I x copies of every message + IDONTWANT from 6 mesh peers for each of the 40,000 messages + IHAVE from 6
    # lazy peers at the 8 heartbeats (1 s .. 8 s) whose 3 s window holds first copies (published in [0, 5) s + 20 ms).
    assert figures["inbound_msgs_per_round"] == 4 * data_copies(ScaleSetup(n=10000), GossipParams()) + 40000 * 6 + 48
    assert figures["rounds_with_J_frac"] == 0.0  # 1.1 GB a round through a 125 MB-a-round downlink


def bounded_run(n: int, rounds: int = 6, push_at_flush: bool = True, gossip: GossipParams = SHARD_GOSSIP,
                **setup: object) -> _Bounded:
    sim = _Bounded(ScaleSetup(n=n, rounds=rounds, **setup), FanInParams(), gossip,  # type: ignore[arg-type]
                   push_at_flush=push_at_flush)
    sim.run()
    return sim


def test_bounded_design_meets_j_and_reaches_a_peer_with_every_group_at_n10() -> None:
    # fanin.py's push fallback (within the round, push_after_s after the digest): every group reaches a peer.
    figures = bounded_run(10, rounds=8, push_at_flush=False).record.metrics()
    assert figures["rounds_with_J_frac"] == 1.0
    assert figures["pulled_by_ge1_frac"] == 1.0
    assert figures["distinct_peers_10_rounds"] == 9


def test_a_push_at_the_next_flush_mostly_arrives_after_the_receiver_dropped_the_digest() -> None:
    # The node until 2026-11-27 (design "bounded-flush-push") pushed at its next flush, a round late, and a
    # receiver that flushed since the digest drops the push unread: at N = 10 every node pulls one group per
    # sender, the top one by variance (the same for all), so the groups nobody pulled reach nobody in their round.
    sim = bounded_run(10, rounds=8)
    figures = sim.record.metrics()
    assert figures["rounds_with_J_frac"] == 1.0
    # of 6 measured rounds x 40 groups (55 with the meshes of 12 before the digest topics' small meshes: the push
    # goes to a mesh peer, drawn from fewer)
    assert figures["pulled_by_ge1_frac"] == 61 / 240
    assert figures["distinct_peers_10_rounds"] == 9


def test_bounded_design_takes_no_more_than_its_caps_per_round() -> None:
    sim = bounded_run(60)
    params, setup, record = sim.p, sim.s, sim.record
    # Every group a node gets in a round was pulled (at most pull_target) or pushed (at most the push cap).
    assert 0 < record.received[setup.warmup:setup.rounds].max() <= params.pull_target + params.pushes_accepted_per_round
    assert (record.usable[setup.warmup:setup.rounds] >= setup.needed).all()
    # Membership is each node's own draw from its seed.
    m = shard_count(setup.n, params)
    assert all(sim.node_shards[v] == epoch_shards(sim.seed[v], 0, m, 1) for v in range(setup.n))


def test_bounded_inbound_cost_does_not_grow_with_n() -> None:
    small = bounded_run(50).record.metrics()  # 2 shards of 25
    large = bounded_run(200).record.metrics()  # 8 shards of 25
    for key in ("inbound_msgs_per_round", "inbound_kb_per_round"):
        assert large[key] <= 1.2 * small[key], key
    flood = simulate_flood(ScaleSetup(n=50, rounds=3))
    assert large["inbound_kb_per_round"] < flood["inbound_kb_per_round"] / 20


def test_churn_replaces_nodes_and_only_whole_rounds_count() -> None:
    sim = bounded_run(60, rounds=8, churn_per_min=0.6)
    assert sim.next_identity > 60  # fresh identities took departed slots
    assert not sim.record.alive[2:8].all()
    assert dataclasses.replace(sim.s, churn_per_min=0.3).leave_p() == pytest.approx(1 - 0.7 ** (1 / 6))


def test_a_node_that_joins_takes_the_swarms_shard_count_after_its_first_round() -> None:
    """30% churn a minute at N = 100 (4 shards of 25; seed 0, 30 rounds): a newcomer starts as `join` does (M = 1,
    learning: shard 0, announcing 0) and at the next round's start takes the M its first senders announce, 4, and
    its shard of 4; so shard 0 does not collect the newcomers, and shards stay near 25 members."""
    sim = bounded_run(100, rounds=30, push_at_flush=False, churn_per_min=0.3)
    alive = [v for v in range(100) if sim.alive[v]]
    learning = [v for v in alive if sim.sizers[v].learning]
    # 150 newcomers in 30 rounds; 96 nodes alive at the end, 9 of them joined at the last round's start.
    assert (sim.next_identity, len(alive), len(learning)) == (250, 96, 9)
    assert all(sim.node_shards[v] == (0,) and sim.announced[v] == 0 for v in learning)
    assert all(sim.sizers[v].shards == 4 and sim.node_shards[v] == epoch_shards(sim.seed[v], 2, 4, 1)
               for v in alive if v not in learning)
    assert sorted(len(shard.members) for shard in sim.shards.values()) == [19, 20, 25, 32]  # 0: with the 9 learning
    assert sim.record.metrics()["rounds_with_J_frac"] == 1.0


def test_shard_gossip_is_the_hosts_small_mesh_on_digest_topics() -> None:
    # transport/libp2p/ipc.HostSettings: meshes of at most 4 on digest topics, IHAVE to 2, no IDONTWANT under 1 KiB;
    # 12 topic peers in all (bench.fanin_real's connections).
    assert SHARD_GOSSIP == GossipParams(degree=4, connect=12, lazy=2, idontwant_min_bytes=1024)


@pytest.mark.parametrize("threshold", [0, 1024])
def test_a_digest_in_a_shard_of_five_counts_every_copy_by_hand(threshold: int) -> None:
    # A complete mesh of 5 (degree 4): the origin sends to its 4 topic peers, each forwards its first copy to its
    # mesh but the origin (3 each): 4 copies in per member, none back to the origin. IDONTWANT: each member sends
    # one to each mesh peer, riding in the RPC that forwards the data where there is one, so only the origin's 4
    # come alone; under the threshold (a digest batch's data is < 1 KiB) there are none, and no message id rides.
    gossip = GossipParams(degree=4, connect=4, lazy=0, idontwant_min_bytes=threshold)
    shard = Shard([0, 1, 2, 3, 4], gossip, random.Random(0))
    msg = WireSizes.of(ScaleSetup(n=5)).digest_msg
    assert msg - GOSSIP_OVERHEAD < 1024
    got = shard.deliver([0], np.array([0.5]), msg, 0.1, ScaleSetup(n=5))
    own_rpc = CONTROL_BYTES + SENDER_RECORD_BYTES + MSG_ID_BYTES
    copy, alone = (msg, 0) if threshold else (msg + MSG_ID_BYTES, 4)
    assert got.in_msgs.tolist() == [alone, 4, 4, 4, 4]
    assert got.in_bytes.tolist() == [alone * own_rpc] + [4 * copy] * 4
    assert got.out_bytes.tolist() == [4 * copy + alone * own_rpc] + [3 * copy] * 4
    assert got.arrival[0].tolist() == [np.inf, 0.6, 0.6, 0.6, 0.6]


def test_a_digest_goes_to_every_topic_peer_and_ihave_only_to_the_lazy_ones() -> None:
    shard = Shard(list(range(24)), GossipParams(degree=4, connect=12, lazy=2), random.Random(1))
    for v in shard.members:
        assert shard.mesh[v].isdisjoint(shard.outside[v]) and shard.lazy[v] <= shard.outside[v]
        assert len(shard.lazy[v]) == 2
    _, cin, cout = shard.tables()
    topic = shard.mesh[0] | shard.outside[0]
    assert cout[0, 0] == len(topic) > 4  # flood publish: beyond the mesh
    assert {v for v in shard.members if cin[0, v] >= 1} == set(range(1, 24))


def test_the_small_meshes_bring_the_p99_under_ten_times_j_groups() -> None:
    # Two shards of 25 (seed 0, 4 measured rounds): py-libp2p's meshes of 12 against the host's small meshes
    # (schema 4's digest batch with its sender's address, 46 bytes longer than schema 3's: [309.0, 328.9] and
    # [149.8, 165.8] with schema 3, [311.2, 331.0] and [150.6, 166.5] with schema 4 before `addrs`).
    before = bounded_run(50, push_at_flush=False, gossip=HOST_GOSSIP_BEFORE).record.metrics()
    after = bounded_run(50, push_at_flush=False).record.metrics()
    target = 10 * 4 * 5.0  # KB: 10 times the bytes of J groups
    p99 = ("inbound_kb_per_round_p99", "outbound_kb_per_round_p99")
    assert [round(before[k], 1) for k in p99] == [321.9, 341.3]
    assert [round(after[k], 1) for k in p99] == [154.2, 169.8]
    assert max(after["inbound_kb_per_round_p99"], after["outbound_kb_per_round_p99"]) < target
    assert after["rounds_with_J_frac"] == before["rounds_with_J_frac"] == 1.0


def test_bounded_breakdown_names_every_inbound_message_and_counts_digest_copies_as_the_mesh_gives_them() -> None:
    # N = 16: one shard (M = 1), every node publishes one batch a round, nobody leaves, so the digest copies a node
    # takes in per round are the shard's per-origin copies (Shard.tables) summed over origins, whatever the timing.
    setup = ScaleSetup(n=16, rounds=8, warmup=2, seed=0)
    sim = _Bounded(setup, FanInParams(), SHARD_GOSSIP, push_at_flush=False)
    record = sim.run()
    (shard,) = sim.shards.values()
    _, copies_in, _ = shard.tables()
    breakdown = record.inbound_breakdown()
    assert set(breakdown) == {"dial", "digest_copy", "idontwant", "ihave", "pull_request", "group", "push",
                              "refusal"}
    assert breakdown["digest_copy"] == pytest.approx(copies_in.sum() / 16)
    assert breakdown["idontwant"] == 0.0  # a digest batch is under the host's IDONTWANT threshold
    # The kinds add up to the mean over nodes of each node's inbound messages per measured round.
    per_node = np.array(record.in_msgs).reshape(-1, 16)[list(setup.measured)].mean(axis=0)
    assert sum(breakdown.values()) == pytest.approx(per_node.mean())
    # Every request reaching a sender is answered within its round (nobody leaves): a group or a refusal.
    assert breakdown["pull_request"] == pytest.approx(breakdown["group"] + breakdown["refusal"])
