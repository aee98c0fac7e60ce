"""Connectivity: address helpers, bootstrap keeper with backoff, reachability checks, the sync facade."""

from __future__ import annotations

import asyncio
import logging
import random

import msgpack
import pytest

from swarm_node.transport.background import BackgroundTransport
from swarm_node.transport.base import ValidationResult
from swarm_node.transport.connectivity import (
    MAX_ADDRS_PER_PEER,
    BootstrapKeeper,
    Reach,
    ask_dialback,
    ask_peers,
    classify_host,
    decode_peer_list,
    encode_peer_list,
    expand_unspecified,
    local_self_check,
    serve_dialback,
    serve_peer_exchange,
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
    assert report.reachable is None and "dial-back" in report.summary


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


def test_peer_list_round_trip_and_strict_decoding() -> None:
    addrs = ["/ip4/10.0.0.2/tcp/4001/p2p/QmA", "/ip4/127.0.0.1/tcp/4001/p2p/QmA", "/ip4/10.0.0.3/tcp/1/p2p/QmB",
             "/ip4/10.0.0.9/tcp/1/p2p/QmSelf"]
    assert decode_peer_list(encode_peer_list(addrs), "QmSelf") == {
        "QmA": ["/ip4/10.0.0.2/tcp/4001/p2p/QmA", "/ip4/127.0.0.1/tcp/4001/p2p/QmA"],
        "QmB": ["/ip4/10.0.0.3/tcp/1/p2p/QmB"]}
    many = [f"/ip4/10.0.0.{i}/tcp/1/p2p/QmA" for i in range(MAX_ADDRS_PER_PEER + 3)]
    assert len(decode_peer_list(encode_peer_list(many), "x")["QmA"]) == MAX_ADDRS_PER_PEER
    for bad in (b"\xc1", msgpack.packb({"a": 1}), msgpack.packb([1]), msgpack.packb(["/ip4/1.2.3.4/tcp/1"]),
                msgpack.packb(["no-slash/p2p/QmA"]), msgpack.packb(["/ip4/1.2.3.4/tcp/1/p2p/" + "A" * 300]),
                msgpack.packb(["/x/p2p/bad id"]), b"\x00" * 200_000):
        with pytest.raises(ValueError):
            decode_peer_list(bad, "QmSelf")


async def test_peer_exchange_connects_a_newcomer_to_the_swarm() -> None:
    hub = MemoryHub()
    nodes = {n: MemoryTransport(hub, n) for n in ("a", "b", "c", "new")}
    for node in nodes.values():
        await node.start()
        await serve_peer_exchange(node)
    await nodes["a"].connect(memory_addr("b"))
    await nodes["b"].connect(memory_addr("c"))
    assert await ask_peers(nodes["new"], "b") == {}  # not connected yet: no answer, no exception
    await nodes["new"].connect(memory_addr("b"))
    assert await ask_peers(nodes["new"], "b") == {"a": [memory_addr("a")], "c": [memory_addr("c")]}
    keeper = BootstrapKeeper(nodes["new"], [memory_addr("b")], min_peers=3, rng=random.Random(0))
    assert sorted(await keeper.exchange({"b"})) == ["a", "c"]
    assert sorted(p.peer_id for p in await nodes["new"].peers()) == ["a", "b", "c"]
    assert await keeper.exchange({"a", "b", "c"}) == []  # enough peers: no more asking


async def test_dialback_over_memory_is_unknown_without_an_observed_ip() -> None:
    hub = MemoryHub()
    a, b = MemoryTransport(hub, "a"), MemoryTransport(hub, "b")
    await a.start()
    await b.start()
    await a.connect(memory_addr("b"))
    await serve_dialback(b)
    assert await ask_dialback(a, "b", 4001) is None  # memory streams have no remote IP to dial


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
