"""In-memory transport: gossip along connections, validator verdicts, penalties, streams with half-close."""

from __future__ import annotations

import asyncio

import pytest

from swarm_node.transport.base import Delivery, StreamReset, TransportError, ValidationResult
from swarm_node.transport.memory import MemoryHub, MemoryTransport, memory_addr, peer_id_of_addr


async def make_line(hub: MemoryHub, names: list[str], topic: str = "t") -> tuple[list[MemoryTransport],
                                                                                 dict[str, list[Delivery]]]:
    """Nodes connected in a line a - b - c ..., each subscribed to `topic`, deliveries collected per node."""
    nodes = [MemoryTransport(hub, n) for n in names]
    got: dict[str, list[Delivery]] = {n: [] for n in names}
    for node in nodes:
        await node.start()
        await node.subscribe(topic, got[node.peer_id].append)
    for left, right in zip(nodes, nodes[1:], strict=False):
        assert await left.connect(memory_addr(right.peer_id)) == right.peer_id
    return nodes, got


def test_peer_id_of_addr() -> None:
    assert peer_id_of_addr("/ip4/1.2.3.4/tcp/5/p2p/12D3KooWabc") == "12D3KooWabc"
    assert peer_id_of_addr(memory_addr("x")) == "x"
    with pytest.raises(TransportError):
        peer_id_of_addr("/ip4/1.2.3.4/tcp/5")


async def test_gossip_reaches_every_subscriber_once_through_relays() -> None:
    hub = MemoryHub()
    (a, b, c), got = await make_line(hub, ["a", "b", "c"])
    await c.connect(memory_addr("a"))  # a triangle: c hears each message from two sides, delivers once
    await a.publish("t", b"hello")
    await hub.settle()
    assert [(d.data, d.from_peer) for d in got["b"]] == [(b"hello", "a")]
    assert [(d.data, d.from_peer) for d in got["c"]] == [(b"hello", "a")]
    assert got["a"] == []  # own publishes are not delivered back
    assert a.stats.published == 1 and b.stats.delivered == 1 and c.stats.delivered == 1


async def test_reject_drops_penalises_forwarder_and_stops_relay() -> None:
    hub = MemoryHub()
    (a, b, c), got = await make_line(hub, ["a", "b", "c"])
    b.set_validator("t", lambda signer, data: ValidationResult.REJECT if data == b"bad" else ValidationResult.ACCEPT)
    await a.publish("t", b"bad")
    await a.publish("t", b"good")
    await hub.settle()
    assert [d.data for d in got["b"]] == [b"good"]
    assert [d.data for d in got["c"]] == [b"good"]  # b did not forward the rejected one
    assert hub.penalties == {("b", "a"): 1}
    assert b.stats.validated == {"ACCEPT": 1, "REJECT": 1, "IGNORE": 0}


async def test_ignore_drops_without_penalty() -> None:
    hub = MemoryHub()
    (a, b), got = await make_line(hub, ["a", "b"])
    b.set_validator("t", lambda signer, data: ValidationResult.IGNORE)
    await a.publish("t", b"stale")
    await hub.settle()
    assert got["b"] == [] and hub.penalties == {}
    assert b.stats.validated["IGNORE"] == 1


async def test_validator_sees_signer_and_exception_means_reject() -> None:
    hub = MemoryHub()
    (a, b), got = await make_line(hub, ["a", "b"])
    seen: list[tuple[str, bytes]] = []

    def validator(signer: str, data: bytes) -> ValidationResult:
        seen.append((signer, data))
        if data == b"boom":
            raise ValueError("validator bug")
        return ValidationResult.ACCEPT

    b.set_validator("t", validator)
    hub.inject("a", "b", "t", b"claims-c", signer="c")  # a forwards a message signed (claimed) by c
    hub.inject("a", "b", "t", b"boom", signer="a")
    await hub.settle()
    assert seen == [("c", b"claims-c"), ("a", b"boom")]
    assert [(d.data, d.from_peer) for d in got["b"]] == [(b"claims-c", "c")]
    assert hub.penalties == {("b", "a"): 1}


async def test_unsubscribed_topic_and_unconnected_peer_get_nothing() -> None:
    hub = MemoryHub()
    (a, b), got = await make_line(hub, ["a", "b"])
    lonely = MemoryTransport(hub, "lonely")
    await lonely.start()
    lonely_got: list[Delivery] = []
    await lonely.subscribe("t", lonely_got.append)
    await a.publish("other-topic", b"x")
    await a.publish("t", b"y")
    await hub.settle()
    assert [d.data for d in got["b"]] == [b"y"] and lonely_got == []


async def test_unsubscribe_stops_delivery_and_forwarding_and_a_new_subscribe_restores_both() -> None:
    hub = MemoryHub()
    (a, b, c), got = await make_line(hub, ["a", "b", "c"])
    b.set_validator("t", lambda signer, data: ValidationResult.ACCEPT)
    await a.publish("t", b"before")
    await hub.settle()
    await b.unsubscribe("t")
    await b.unsubscribe("never-subscribed")  # a no-op
    assert [p.topics for p in await a.peers()] == [()]
    await a.publish("t", b"during")  # b neither takes nor forwards it: c, behind b, misses it too
    await hub.settle()
    assert b.stats.validated["ACCEPT"] == 1  # its validator went with the subscription
    await b.subscribe("t", got["b"].append)
    await a.publish("t", b"after")
    await hub.settle()
    assert [d.data for d in got["b"]] == [b"before", b"after"]
    assert [d.data for d in got["c"]] == [b"before", b"after"]


async def test_stream_request_response_with_half_close() -> None:
    hub = MemoryHub()
    (a, b), _ = await make_line(hub, ["a", "b"])

    async def echo_upper(stream) -> None:
        data = b""
        while chunk := await stream.read():
            data += chunk
        await stream.write(data.upper())
        await stream.close()

    await b.serve_stream("/echo/1", echo_upper)
    stream = await a.open_stream("b", "/echo/1")
    assert stream.remote_peer == "b"
    payload = bytes(range(256)) * 40_000  # 10 MB: more than the pipe buffer, so back-pressure is exercised
    await stream.write(payload)
    await stream.close()
    reply = await stream.read_exactly(len(payload))
    assert reply == payload.upper()
    assert await stream.read() == b""
    with pytest.raises(TransportError, match="write after close"):
        await stream.write(b"x")


async def test_stream_errors() -> None:
    hub = MemoryHub()
    (a, b), _ = await make_line(hub, ["a", "b"])
    c = MemoryTransport(hub, "c")
    await c.start()
    with pytest.raises(TransportError, match="does not serve"):
        await a.open_stream("b", "/nope/1")
    with pytest.raises(TransportError, match="not connected"):
        await a.open_stream("c", "/nope/1")

    started = asyncio.Event()

    async def wait_forever(stream) -> None:
        started.set()
        await stream.read()

    await b.serve_stream("/wait/1", wait_forever)
    stream = await a.open_stream("b", "/wait/1")
    await started.wait()
    await b.stop()  # resets b's side of every stream
    with pytest.raises(StreamReset):
        await stream.read()
    with pytest.raises(TransportError, match="not started"):
        await b.publish("t", b"x")


async def test_hub_network_model_hook() -> None:
    """A subclass decides delivery: here it drops everything sent to 'c' (a partition)."""

    class Partition(MemoryHub):
        def deliver(self, forwarder, receiver, topic, data, signer, msg_id) -> None:  # type: ignore[override]
            if receiver != "c":
                super().deliver(forwarder, receiver, topic, data, signer, msg_id)

    hub = Partition()
    (a, b, c), got = await make_line(hub, ["a", "b", "c"])
    await a.publish("t", b"m")
    await hub.settle()
    assert [d.data for d in got["b"]] == [b"m"] and got["c"] == []
