"""Connectivity: address helpers, bootstrap keeper with backoff, the local address check, the sync facade."""

from __future__ import annotations

import asyncio
import logging
import random

import pytest

from swarm_node.transport.background import BackgroundTransport
from swarm_node.transport.base import PeerInfo, ValidationResult
from swarm_node.transport.connectivity import (
    MAX_KNOWN_PEERS,
    BootstrapKeeper,
    Reach,
    classify_host,
    dialable_addr,
    expand_unspecified,
    local_self_check,
    tcp_endpoint,
)
from swarm_node.transport.memory import MemoryHub, MemoryTransport, memory_addr
from swarm_node.transport.supervisor import Backoff


def test_tcp_endpoint() -> None:
    assert tcp_endpoint("/ip4/10.0.0.2/tcp/4001/p2p/12D3KooW") == ("10.0.0.2", 4001)
    assert tcp_endpoint("/dns4/node.example.org/tcp/443") == ("node.example.org", 443)
    assert tcp_endpoint("/ip6/::1/tcp/7") == ("::1", 7)
    assert tcp_endpoint("/ip4/10.0.0.2/udp/4001/quic") is None
    assert tcp_endpoint("/ip4/10.0.0.2/tcp/0") is None
    assert tcp_endpoint("/memory/x/p2p/x") is None


@pytest.mark.parametrize("host, reach", [
    ("127.0.0.1", Reach.LOOPBACK), ("::1", Reach.LOOPBACK), ("0.0.0.0", Reach.UNSPECIFIED),
    ("192.168.1.5", Reach.PRIVATE), ("10.1.2.3", Reach.PRIVATE), ("172.16.0.1", Reach.PRIVATE),
    ("100.64.0.1", Reach.PRIVATE), ("fd00::1", Reach.PRIVATE), ("8.8.8.8", Reach.PUBLIC),
    ("2606:4700::1111", Reach.PUBLIC), ("node.example.org", Reach.NAME),
])
def test_classify_host(host: str, reach: Reach) -> None:
    assert classify_host(host) is reach


def test_expand_unspecified() -> None:
    addr = "/ip4/0.0.0.0/tcp/4001/p2p/12D3"
    assert expand_unspecified(addr, primary="192.168.1.5") == ["/ip4/192.168.1.5/tcp/4001/p2p/12D3",
                                                               "/ip4/127.0.0.1/tcp/4001/p2p/12D3"]
    assert expand_unspecified(addr, primary="127.0.0.1") == ["/ip4/127.0.0.1/tcp/4001/p2p/12D3"]
    assert expand_unspecified("/ip4/10.0.0.1/tcp/1/p2p/x") == ["/ip4/10.0.0.1/tcp/1/p2p/x"]


async def _listener() -> tuple[asyncio.Server, int]:
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def test_local_self_check_reports_and_advises() -> None:
    server, port = await _listener()
    async with server:
        report = await local_self_check([f"/ip4/127.0.0.1/tcp/{port}/p2p/x"])
        assert report.reachable is False and "loopback only" in report.summary
        assert f"--listen /ip4/0.0.0.0/tcp/{port}" in report.advice
    # the server is closed now: nothing listens at that port any more
    report = await local_self_check([f"/ip4/127.0.0.1/tcp/{port}/p2p/x"])
    assert report.reachable is False and "nothing accepts connections" in report.summary
    report = await local_self_check(["/ip4/8.8.8.8/tcp/1/p2p/x"])  # public: only a peer can confirm
    assert report.reachable is None and "AutoNAT" in report.summary


async def test_bootstrap_keeper_warns_retries_and_connects(caplog: pytest.LogCaptureFixture) -> None:
    hub = MemoryHub()
    node = MemoryTransport(hub, "node")
    await node.start()
    keeper = BootstrapKeeper(node, [memory_addr("boot")], backoff=Backoff(initial_s=0.01, max_s=0.02),
                             check_interval_s=0.01, rng=random.Random(0))
    with caplog.at_level(logging.INFO, logger="swarm_node.transport.connectivity"):
        task = asyncio.create_task(keeper.run())
        await asyncio.sleep(0.1)  # several failed rounds
        assert keeper.state == "solo"
        warnings = [r.message for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and "no bootstrap peer answered" in warnings[0]  # said once, clearly
        boot = MemoryTransport(hub, "boot")
        await boot.start()  # the bootstrap comes up late
        for _ in range(100):
            await asyncio.sleep(0.01)
            if keeper.state == "connected":
                break
        task.cancel()
    assert keeper.state == "connected"
    assert [p.peer_id for p in await node.peers()] == ["boot"]
    assert any("connected to peer(s) boot" in r.message for r in caplog.records)


def test_dialable_addr() -> None:
    assert dialable_addr(PeerInfo("QmA", ("/ip4/0.0.0.0/tcp/1", "/ip4/10.0.0.2/tcp/4001"))) == (
        "/ip4/10.0.0.2/tcp/4001/p2p/QmA")  # a wildcard is skipped, /p2p/<id> appended
    assert dialable_addr(PeerInfo("QmA", ("/ip4/1.2.3.4/tcp/1/p2p/QmR/p2p-circuit/p2p/QmA",))) is None
    assert dialable_addr(PeerInfo("a", (memory_addr("a"),))) == memory_addr("a")
    assert dialable_addr(PeerInfo("QmA", ())) is None


async def test_keeper_redials_known_peers_when_alone_after_the_bootstrap_left() -> None:
    """Discovery is the transport's (libp2p: the DHT); the keeper only remembers where its peers were, so a node
    that loses every connection after its bootstrap left finds the swarm again."""
    hub = MemoryHub()
    nodes = {n: MemoryTransport(hub, n) for n in ("boot", "a", "b")}
    for node in nodes.values():
        await node.start()
    await nodes["a"].connect(memory_addr("boot"))
    await nodes["b"].connect(memory_addr("boot"))
    await nodes["b"].connect(memory_addr("a"))  # what the DHT rendezvous does on libp2p
    keeper = BootstrapKeeper(nodes["a"], [memory_addr("boot")], backoff=Backoff(initial_s=0.01, max_s=0.02),
                             check_interval_s=0.01, rng=random.Random(0))
    task = asyncio.create_task(keeper.run())
    try:
        for _ in range(100):
            await asyncio.sleep(0.01)
            if set(keeper.known) == {"boot", "b"}:
                break
        assert keeper.known == {"boot": memory_addr("boot"), "b": memory_addr("b")}
        await nodes["boot"].stop()  # the bootstrap leaves for good
        hub.links.discard(frozenset(("a", "b")))  # and a loses its last connection
        for _ in range(100):
            await asyncio.sleep(0.01)
            if [p.peer_id for p in await nodes["a"].peers()] == ["b"] and keeper.state == "connected":
                break
        assert [p.peer_id for p in await nodes["a"].peers()] == ["b"] and keeper.state == "connected"
    finally:
        task.cancel()
    keeper.remember([PeerInfo(f"p{i}", (memory_addr(f"p{i}"),)) for i in range(MAX_KNOWN_PEERS + 5)])
    assert len(keeper.known) == MAX_KNOWN_PEERS and "p0" not in keeper.known  # bounded: the oldest go first


def test_background_facade_with_memory_transport() -> None:
    hub_box: dict[str, MemoryHub] = {}

    def factory(name: str):
        def make() -> MemoryTransport:
            hub = hub_box.setdefault("hub", MemoryHub())  # created on the network loop
            return MemoryTransport(hub, name)
        return make

    # A memory hub lives on one loop: node a behind the facade, node b added on the same loop through call().
    net = BackgroundTransport(factory("a"))
    net.start()
    try:
        async def add_b(_) -> MemoryTransport:
            b = MemoryTransport(hub_box["hub"], "b")
            await b.start()
            await b.connect(memory_addr("a"))
            return b

        b = net.call(add_b)
        net.set_validator("t", lambda s, d: ValidationResult.REJECT if d == b"bad" else ValidationResult.ACCEPT)
        net.subscribe_queue("t")
        for payload in (b"one", b"bad", b"two"):
            net.call(lambda _, p=payload: b.publish("t", p))
        net.call(lambda _: hub_box["hub"].settle())
        assert [(d.data, d.from_peer) for d in net.drain("t")] == [(b"one", "b"), (b"two", "b")]
        assert net.drain("t") == []
        assert [p.peer_id for p in net.peers()] == ["b"]
        assert net.peer_id == "a" and net.listen_addrs() == [memory_addr("a")]
    finally:
        net.stop()


def test_background_inbox_limit_counts_drops() -> None:
    net = BackgroundTransport(lambda: MemoryTransport(MemoryHub(), "a"), inbox_limit=2)
    net.start()
    try:
        net.subscribe_queue("t")
        hub = net.transport.hub  # type: ignore[attr-defined]

        async def flood(_) -> None:
            b = MemoryTransport(hub, "b")
            await b.start()
            await b.connect(memory_addr("a"))
            for i in range(5):
                await b.publish("t", bytes([i]))
            await hub.settle()

        net.call(flood)
        assert [d.data for d in net.drain("t")] == [b"\x00", b"\x01"]
        assert net.inbox_dropped == 3
    finally:
        net.stop()
