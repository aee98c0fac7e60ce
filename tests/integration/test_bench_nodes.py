"""The node processes of bench.gossip (both paths) and bench.broadcast answer their orchestrators' commands (tiny
workloads)."""

from __future__ import annotations

import asyncio

import pytest

from bench.broadcast import MB
from bench.broadcast import spawn as spawn_broadcast_node
from bench.gossip import gossip_round, next_event
from bench.gossip import spawn as spawn_gossip_node
from bench.procs import JsonProc, event_is

pytestmark = [pytest.mark.libp2p, pytest.mark.timeout(300)]


async def mesh(procs: list[JsonProc]) -> list[dict]:  # type: ignore[type-arg]
    ready = [await p.expect(event_is("ready"), 120) for p in procs]
    procs[1].send(cmd="connect", addrs=[ready[0]["addr"]])
    await procs[1].expect(event_is("connected"), 120)
    for proc in procs:
        proc.send(cmd="wait_subscribed", n=1)
        await proc.expect(event_is("subscribed"), 120)
    await asyncio.sleep(1.5)  # a heartbeat: the gossip mesh grafts
    return ready


@pytest.mark.parametrize("path", ["flood", "bounded"])
async def test_gossip_nodes_deliver_every_group_of_two_rounds_and_quit_cleanly(path: str) -> None:
    procs = [await spawn_gossip_node("process", path) for _ in range(2)]
    try:
        await mesh(procs)
        for rate in (20.0, None):  # paced, then as fast as back-pressure allows: "done" and "stats" read once each
            result = await gossip_round(procs, 10, rate=rate)
            assert (result["groups"], result["delivered_frac"]) == (10, 1.0)
        procs[0].send(cmd="stats")
        assert sum((await next_event(procs[0], "stats"))["received"].values()) == 5
    finally:
        for proc in procs:
            await proc.close(quit_grace_s=15)
    assert [p.proc.returncode for p in procs] == [0, 0]


async def test_broadcast_nodes_deliver_a_verified_payload_and_quit_cleanly() -> None:
    procs = [await spawn_broadcast_node(4 * MB, MB) for _ in range(2)]
    try:
        ready = await mesh(procs)
        procs[0].send(cmd="publish", version=1, size=MB, schedule="stripe:2", receivers=[ready[1]["peer_id"]])
        await procs[0].expect(event_is("published", version=1), 120)
        assert (await procs[1].expect(event_is("received", version=1), 120))["ok"] is True
        procs[1].send(cmd="stats")
        assert await procs[1].expect(event_is("stats"), 60) == {"event": "stats", "bad_chunks": 0, "peer_failures": 0}
    finally:
        for proc in procs:
            await proc.close(quit_grace_s=20)
    assert [p.proc.returncode for p in procs] == [0, 0]
