"""The decisions behind the silence after a flood (issue 27 item 3): whom a publish waits for, which backed-off peers
still get gossip, the connected-peer count of /status, and the benchmark's gap measure."""

from __future__ import annotations

import asyncio
import random

from bench.flood_recovery import longest_gap
from swarm_node.status.metrics import SnapshotCollector
from swarm_node.status.stats import NodeStats
from swarm_node.transport.connectivity import BootstrapKeeper
from swarm_node.transport.libp2p.backpressure import closed_with_full_queue, peers_to_wait_for, still_slow
from swarm_node.transport.libp2p.router import backed_off_gossip
from swarm_node.transport.memory import MemoryHub, MemoryTransport, memory_addr
from swarm_node.transport.supervisor import Backoff

HIGH = 8


def queues(**lengths: int) -> dict[str, list[int]]:
    return {peer: [0] * n for peer, n in lengths.items()}


# -- publish back-pressure ----------------------------------------------------------------------------------------
def test_a_publish_never_waits_for_a_full_queue_on_a_closed_connection() -> None:
    q = queues(honest=0, busy=HIGH, gone=HIGH + 5, slow=HIGH)
    closed = {"gone"}.__contains__
    assert peers_to_wait_for(q, HIGH, slow={"slow"}, closed=closed) == ["busy"]
    assert closed_with_full_queue(q, HIGH, closed) == ["gone"]  # the host drops these at once
    q["busy"] = [0] * (HIGH - 1)
    assert peers_to_wait_for(q, HIGH, slow={"slow"}, closed=closed) == []  # room everywhere else: publish now


def test_a_slow_peer_stays_slow_until_its_queue_drains_to_half_or_it_leaves() -> None:
    q = queues(a=HIGH // 2, b=HIGH // 2 - 1)
    assert still_slow({"a", "b", "left"}, q, HIGH) == {"a"}


# -- gossip to backed-off peers -----------------------------------------------------------------------------------
def test_backed_off_peers_outside_the_mesh_still_get_gossip_unless_their_score_forbids_it() -> None:
    mesh = {"t": {"meshed"}, "quiet": set()}
    topic_peers = {"t": {"meshed", "pruned", "expired", "never", "bad"}, "quiet": {"pruned"}, "other": {"pruned"}}
    back_off = {"t": {"pruned": 160.0, "expired": 90.0, "meshed": 200.0, "bad": 160.0}, "quiet": {"pruned": 160.0}}
    allowed = [("pruned", "quiet"), ("pruned", "t")]

    def allow(peer: str, topics: list[str]) -> bool:
        return peer != "bad"

    extra = backed_off_gossip(mesh, topic_peers, back_off, now=100.0, allow_gossip=allow)
    # "expired" and "never" are not backed off (the library's own heartbeat gossips to them), "meshed" gets the
    # messages themselves, "other" is a topic we are not meshed in, "bad" is under the gossip threshold
    assert sorted((peer, topic) for peer, topics in extra.items() for topic in topics) == allowed


# -- /status: peers connected now ---------------------------------------------------------------------------------
def test_the_connected_count_follows_the_network_and_known_peers_keep_their_counters() -> None:
    stats = NodeStats()
    stats.count_peer_message("a", accepted=True, n=3)
    stats.count_peer_message("b", accepted=False)
    assert stats.snapshot()["peers_connected"] == 2  # nothing reported yet: every known peer
    stats.set_connected({"a": 12.5, "c": None})
    snapshot = stats.snapshot()
    assert snapshot["peers_connected"] == 2
    assert {p["peer_id"]: (p["latency_ms"], p["accepted"], p["rejected"]) for p in snapshot["peers"]} == {
        "a": (12.5, 3, 0), "b": (None, 0, 1), "c": (None, 0, 0)}
    stats.set_connected({})  # every attacker (and everyone else) has gone
    assert stats.snapshot()["peers_connected"] == 0
    assert len(stats.snapshot()["peers"]) == 3
    gauge = next(f for f in SnapshotCollector(stats.snapshot()).collect() if f.name == "swarm_node_peers_connected")
    assert [s.value for s in gauge.samples] == [0.0]


async def test_the_keeper_reports_the_peers_connected_at_each_check() -> None:
    hub = MemoryHub()
    nodes = {n: MemoryTransport(hub, n) for n in ("a", "b", "c")}
    for node in nodes.values():
        await node.start()
    await nodes["a"].connect(memory_addr("b"))
    await nodes["a"].connect(memory_addr("c"))
    reports: list[list[str]] = []
    keeper = BootstrapKeeper(nodes["a"], [], backoff=Backoff(initial_s=0.01, max_s=0.02), check_interval_s=0.01,
                             rng=random.Random(0), on_peers=lambda peers: reports.append(sorted(p.peer_id
                                                                                               for p in peers)))
    task = asyncio.create_task(keeper.run())
    try:
        for _ in range(200):
            await asyncio.sleep(0.01)
            if reports and reports[-1] == ["b", "c"]:
                break
        assert reports[-1] == ["b", "c"]
        await nodes["c"].stop()  # c leaves
        for _ in range(200):
            await asyncio.sleep(0.01)
            if reports[-1] == ["b"]:
                break
        assert reports[-1] == ["b"]
    finally:
        task.cancel()


# -- the benchmark's measure --------------------------------------------------------------------------------------
def test_the_longest_gap_counts_the_window_ends_and_ignores_deliveries_outside_it() -> None:
    assert longest_gap([1.0, 12.0, 13.0, 40.0, 55.0], start=10.0, end=50.0) == 27.0  # 13 -> 40
    assert longest_gap([1.0, 12.0, 13.0], start=10.0, end=50.0) == 37.0  # silent from 13 to the end
    assert longest_gap([], start=10.0, end=50.0) == 40.0
