"""Floods and bounds (issue 15, "Bad input"), on loopback: the request budget itself; a peer flooding our DHT server
refused past its budget while a quiet peer is answered, and many identities bounded together; PUT_VALUE and
ADD_PROVIDER records bounded in size and number; a relay refusing a reservation flood and reservations named for
someone else; a relay carrying no circuit beyond its limits.

Budgets here refill at rate 0 (never), so every count below follows from the configured bursts and caps alone.
"""

from __future__ import annotations

import hashlib
import logging
from collections import Counter
from contextlib import AsyncExitStack
from typing import Any

import multiaddr
import pytest
import trio
import varint
from libp2p import new_host
from libp2p.crypto.secp256k1 import create_new_key_pair
from libp2p.crypto.x25519 import create_new_key_pair as create_x25519_key_pair
from libp2p.kad_dht.common import PROTOCOL_ID as KAD_PROTOCOL_ID
from libp2p.kad_dht.pb.kademlia_pb2 import Message, Record
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo
from libp2p.relay.circuit_v2 import PROTOCOL_ID as HOP_PROTOCOL_ID
from libp2p.relay.circuit_v2 import CircuitV2Protocol
from libp2p.relay.circuit_v2.pb.circuit_pb2 import HopMessage, StopMessage
from libp2p.relay.circuit_v2.pb.circuit_pb2 import PeerId as CircuitPeerId
from libp2p.relay.circuit_v2.protocol import STOP_PROTOCOL_ID
from libp2p.relay.circuit_v2.protocol_buffer import StatusCode
from libp2p.relay.circuit_v2.resources import RelayLimits
from libp2p.relay.circuit_v2.utils import read_delimited_msg, write_delimited_msg
from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_PROTOCOL_ID
from libp2p.security.noise.transport import Transport as NoiseTransport
from libp2p.tools.anyio_service import background_trio_service
from libp2p.utils.varint import read_varint_prefixed_bytes_limited

from swarm_node.transport.libp2p import dht as dht_module
from swarm_node.transport.libp2p.dht import GuardedKadDHT
from swarm_node.transport.libp2p.ipc import HostSettings
from swarm_node.transport.libp2p.nat import NatServices
from swarm_node.transport.shaping import RequestBudget

pytestmark = pytest.mark.libp2p
LOOPBACK = multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")
ECHO = "/test/echo/1"


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


# -- the budget (pure) --------------------------------------------------------------------------------------------
def test_budget_gives_each_key_its_burst_then_refills_at_its_rate() -> None:
    clock = FakeClock()
    budget = RequestBudget(rate=2.0, burst=3, total_rate=100.0, total_burst=100, clock=clock)
    assert [budget.take("a") for _ in range(4)] == ["ok", "ok", "ok", "peer"]
    assert budget.take("b") == "ok"  # another key has its own bucket
    clock.now = 0.25  # half a token back: still refused
    assert budget.peek("a") == "peer" and budget.take("a") == "peer"
    clock.now = 0.5  # one token
    assert budget.peek("a") == "ok"
    assert budget.take("a") == "ok" and budget.take("a") == "peer"
    clock.now = 100.0  # never more than the burst
    assert [budget.take("a") for _ in range(4)] == ["ok", "ok", "ok", "peer"]


def test_budget_bounds_all_keys_together_and_refuses_without_taking() -> None:
    clock = FakeClock()
    budget = RequestBudget(rate=0.0, burst=4, total_rate=1.0, total_burst=6, clock=clock)
    verdicts = {key: [budget.take(key) for _ in range(5)] for key in ("a", "b")}
    assert verdicts == {"a": ["ok"] * 4 + ["peer"], "b": ["ok", "ok", "total", "total", "total"]}
    clock.now = 3.0  # three tokens back in the total; b's 3 refusals took none of its own 4: 2 are left
    assert [budget.take("b") for _ in range(3)] == ["ok", "ok", "peer"]
    clock.now = 1000.0  # rate 0: a's own bucket never refills
    assert budget.take("a") == "peer" and budget.peek("c") == "ok"
    assert len(budget) == 2  # peek adds no key


def test_budget_forgets_the_least_recently_used_key_past_max_keys() -> None:
    budget = RequestBudget(rate=0.0, burst=1, total_rate=0.0, total_burst=100, max_keys=2, clock=FakeClock())
    assert [budget.take(k) for k in ("a", "b", "a", "c")] == ["ok", "ok", "peer", "ok"]
    assert len(budget) == 2  # "a" (used before "b" was) was forgotten for "c"
    assert budget.take("b") == "peer" and budget.take("a") == "ok"  # forgotten: a full bucket again
    for bad in ({"rate": -1.0, "burst": 1, "total_rate": 0.0, "total_burst": 1},
                {"rate": 1.0, "burst": 0, "total_rate": 0.0, "total_burst": 1},
                {"rate": 1.0, "burst": 1, "total_rate": 1.0},  # a total needs both its rate and its burst
                {"rate": float("inf"), "burst": 1}):
        with pytest.raises(ValueError, match="need finite rates"):
            RequestBudget(**bad)


def test_budget_without_a_total_bounds_each_key_alone() -> None:
    clock = FakeClock()
    budget = RequestBudget(rate=1.0, burst=2, max_keys=2, clock=clock)
    assert [budget.take(k) for k in ("a", "a", "a", "b", "b", "c")] == ["ok", "ok", "peer", "ok", "ok", "ok"]
    assert budget.peek("d") == "ok" and len(budget) == 2  # "a" forgotten for "c": at most max_keys buckets
    clock.now = 0.5  # half a token: b is still refused
    assert budget.take("b") == "peer"
    clock.now = 1.0
    assert [budget.take("b") for _ in range(2)] == ["ok", "peer"]


# -- hosts ------------------------------------------------------------------------------------------------------
def _host() -> Any:
    key_pair = create_new_key_pair()
    security = {NOISE_PROTOCOL_ID: NoiseTransport(key_pair, noise_privkey=create_x25519_key_pair().private_key)}
    return new_host(key_pair=key_pair, sec_opt=security)


async def _hosts(stack: AsyncExitStack, n: int) -> list[Any]:
    hosts = [_host() for _ in range(n)]
    for host in hosts:
        await stack.enter_async_context(host.run([LOOPBACK]))
    return hosts


async def _close(stream: Any) -> None:
    try:
        await stream.close()
    except Exception:  # reset by the other side
        pass


async def _kad(client: Any, server: Any, message: Message, stream: Any = None) -> Message | None:
    """One DHT request from `client`; the answer, or None when the server reset the stream (refused)."""
    own = stream is None
    try:
        if own:
            stream = await client.new_stream(server.get_id(), [KAD_PROTOCOL_ID])
        data = message.SerializeToString()
        await stream.write(varint.encode(len(data)) + data)
        reply = Message()
        reply.ParseFromString(await read_varint_prefixed_bytes_limited(stream, 4 << 20))
        return reply
    except Exception:  # reset, or the end of the stream: not answered
        return None
    finally:
        if own and stream is not None:
            await _close(stream)


def _find_node(client: Any) -> Message:
    return Message(type=Message.MessageType.FIND_NODE, key=client.get_id().to_bytes())


def _get_providers(name: str) -> Message:
    return Message(type=Message.MessageType.GET_PROVIDERS, key=hashlib.sha256(name.encode()).digest())


def _add_provider(client: Any, key: bytes, n_addrs: int = 1) -> Message:
    message = Message(type=Message.MessageType.ADD_PROVIDER, key=key)
    provider = message.providerPeers.add()
    provider.id = client.get_id().to_bytes()
    addr = client.get_addrs()[0].decapsulate(multiaddr.Multiaddr(f"/p2p/{client.get_id()}"))
    provider.addrs.extend([addr.to_bytes()] * n_addrs)
    return message


def _put_value(key: bytes, value: bytes) -> Message:
    return Message(type=Message.MessageType.PUT_VALUE, key=key, record=Record(key=key, value=value))


async def _dht_server(stack: AsyncExitStack, **limits: Any) -> tuple[Any, GuardedKadDHT, Counter[str]]:
    (server,) = await _hosts(stack, 1)
    counters: Counter[str] = Counter()
    settings = HostSettings(rendezvous="floods", dht_peer_rate=0.0, dht_total_rate=0.0, **limits)
    nat = NatServices(server, settings, counters)  # what the network host runs (its DHT server: GuardedKadDHT)
    assert isinstance(nat.dht, GuardedKadDHT)
    return server, nat.dht, counters


async def _connected(stack: AsyncExitStack, server: Any, n: int) -> list[Any]:
    clients = await _hosts(stack, n)
    for client in clients:
        await client.connect(PeerInfo(server.get_id(), server.get_addrs()))
    return clients


# -- the DHT ----------------------------------------------------------------------------------------------------
def test_a_dht_flood_is_refused_past_its_budget_and_a_quiet_peer_is_answered() -> None:
    burst = 20

    async def run() -> tuple[int, int, int, int, Counter[str]]:
        async with AsyncExitStack() as stack:
            server, _, counters = await _dht_server(stack, dht_peer_burst=burst, dht_total_burst=1000)
            flooder, quiet, streamer = await _connected(stack, server, 3)
            with trio.fail_after(60):
                flood = [_find_node(flooder) if i % 2 else _get_providers(f"k{i}") for i in range(200)]
                answered = sum([await _kad(flooder, server, m) is not None for m in flood])
                quiet_answered = sum([await _kad(quiet, server, _get_providers("swarm")) is not None
                                      for _ in range(5)])
                # Many requests on one stream (the library answers them in a loop): each takes a token.
                stream = await streamer.new_stream(server.get_id(), [KAD_PROTOCOL_ID])
                on_one_stream = 0
                for _ in range(burst + 10):
                    if await _kad(streamer, server, _find_node(streamer), stream) is None:
                        break
                    on_one_stream += 1
                await _close(stream)
                again = await _kad(flooder, server, _find_node(flooder))
            return answered, quiet_answered, on_one_stream, int(again is not None), counters

    answered, quiet_answered, on_one_stream, again, counters = trio.run(run)
    assert answered == burst  # of 200
    assert quiet_answered == 5
    assert on_one_stream == burst
    assert again == 0  # rate 0: the flooder's budget never comes back
    # 180 flood streams reset at open, the one-stream flooder's 21st request, the flooder's last try
    assert counters["dht_refused_rate"] == (200 - burst) + 1 + 1
    assert counters["dht_refused_total"] == 0


def test_the_total_dht_budget_bounds_many_identities_together() -> None:
    async def run() -> tuple[list[int], Counter[str]]:
        async with AsyncExitStack() as stack:
            server, _, counters = await _dht_server(stack, dht_peer_burst=10, dht_total_burst=25)
            clients = await _connected(stack, server, 3)
            with trio.fail_after(60):
                answered = [sum([await _kad(c, server, _find_node(c)) is not None for _ in range(15)])
                            for c in clients]
            return answered, counters

    answered, counters = trio.run(run)
    assert answered == [10, 10, 5]  # 25 in all
    assert counters["dht_refused_rate"] == 5 + 5  # the first two past their own 10
    assert counters["dht_refused_total"] == 10  # the third past the total, its own budget untouched


def test_silent_dht_streams_are_bounded_per_peer_and_in_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stream that sends nothing would hold one of the library's 12 handler slots for ever."""
    monkeypatch.setattr(dht_module, "MESSAGE_TIMEOUT_S", 2.0)

    async def run() -> tuple[list[str], Message | None, Counter[str]]:
        async with AsyncExitStack() as stack:
            server, _, counters = await _dht_server(stack, dht_peer_burst=100, dht_total_burst=100)
            (client,) = await _connected(stack, server, 1)
            with trio.fail_after(60):
                # Each ends: the last at once (one too many; reset before the client has read the protocol's
                # acknowledgement, it fails to open), the others at the deadline.
                ends = []
                silent = []
                for _ in range(dht_module.MAX_STREAMS_PER_PEER + 1):
                    try:
                        silent.append(await client.new_stream(server.get_id(), [KAD_PROTOCOL_ID]))
                    except Exception:
                        ends.append("refused")
                for stream in silent:
                    try:
                        ends.append(f"data {await stream.read(1)!r}")
                    except Exception:
                        ends.append("refused")
                answered = await _kad(client, server, _find_node(client))
            return ends, answered, counters

    ends, answered, counters = trio.run(run)
    assert ends == ["refused"] * (dht_module.MAX_STREAMS_PER_PEER + 1)
    assert counters["dht_refused_streams"] == 1 and counters["dht_refused_slow"] == dht_module.MAX_STREAMS_PER_PEER
    assert answered is not None  # its slots are free again


def test_dht_records_are_bounded_in_size_and_number() -> None:
    size, total, per_peer = 1024, 8, 5

    async def run() -> dict[str, Any]:
        async with AsyncExitStack() as stack:
            server, dht, counters = await _dht_server(
                stack, dht_peer_burst=1000, dht_total_burst=1000, dht_max_record_bytes=size, dht_max_records=total,
                dht_max_records_per_peer=per_peer)
            a, b, c = await _connected(stack, server, 3)

            def record_of(n_bytes: int, name: str) -> Message:  # a PUT_VALUE whose record is n_bytes long
                value = b"v" * (n_bytes - 8)
                while Record(key=name.encode(), value=value).ByteSize() > n_bytes:
                    value = value[:-1]
                while Record(key=name.encode(), value=value).ByteSize() < n_bytes:
                    value += b"v"
                assert Record(key=name.encode(), value=value).ByteSize() == n_bytes
                return _put_value(name.encode(), value)

            out: dict[str, Any] = {}
            with trio.fail_after(60):
                out["oversized"] = await _kad(a, server, record_of(size + 1, "big"))
                out["at_limit"] = await _kad(a, server, record_of(size, "fits"))
                out["a_values"] = [await _kad(a, server, _put_value(f"a{i}".encode(), b"x")) is not None
                                   for i in range(6)]
                keys = [hashlib.sha256(f"p{i}".encode()).digest() for i in range(8)]
                out["b_providers"] = [await _kad(b, server, _add_provider(b, k)) is not None for k in keys]
                out["b_refresh"] = await _kad(b, server, _add_provider(b, keys[0])) is not None
                out["c_providers"] = [await _kad(c, server, _add_provider(c, k)) is not None for k in keys[:5]]
                out["c_values"] = [await _kad(c, server, _put_value(f"c{i}".encode(), b"y")) is not None
                                   for i in range(5)]
                out["c_fat_provider"] = await _kad(c, server, _add_provider(c, keys[7], n_addrs=200))
                out["c_values_again"] = await _kad(c, server, _put_value(b"c0", b"y")) is not None
            out["values"] = len(dht.value_store.store)
            out["providers"] = dht.provider_store.size()
            out["counters"] = counters
            return out

    out = trio.run(run)
    assert out["oversized"] is None and out["at_limit"] is not None
    assert out["a_values"] == [True] * (per_peer - 1) + [False] * 2  # "fits" was the first of its 5
    assert out["b_providers"] == [True] * per_peer + [False] * 3
    assert out["b_refresh"]  # a refresh of a held record is not a new one
    assert out["c_providers"] == [True] * (total - per_peer) + [False] * 2  # the store is full at 8
    assert out["c_values"] == [True] * (total - per_peer) + [False] * 2
    assert out["c_fat_provider"] is None  # 200 addresses: over 1024 bytes
    # A key we hold is no new record: our gate lets it through (no refusal counted below) and the library's
    # validator decides; for a key in no namespace it keeps the first record and resets the stream.
    assert not out["c_values_again"]
    assert (out["values"], out["providers"]) == (total, total)
    assert out["counters"]["dht_refused_large"] == 2
    assert out["counters"]["dht_refused_full"] == 2 + 3 + 2 + 2


# -- relays -----------------------------------------------------------------------------------------------------
async def _hop(client: Any, relay: Any, messages: list[HopMessage]) -> list[int | None]:
    """HOP requests on one stream; the status of each answer (None once the stream is gone)."""
    out: list[int | None] = []
    try:
        stream = await client.new_stream(relay.get_id(), [HOP_PROTOCOL_ID])
    except Exception:
        return [None] * len(messages)
    for message in messages:
        try:
            await write_delimited_msg(stream, message)
            out.append(int((await read_delimited_msg(stream, HopMessage)).status))
        except Exception:  # reset: refused unread
            out.append(None)
    await _close(stream)
    return out


def _reserve(for_peer: ID | None = None) -> HopMessage:
    if for_peer is None:
        return HopMessage(type=HopMessage.RESERVE)
    return HopMessage(type=HopMessage.RESERVE, peer=CircuitPeerId(id=for_peer.to_bytes()))


def _connect(dest: Any) -> HopMessage:
    return HopMessage(type=HopMessage.CONNECT, peer=CircuitPeerId(id=dest.get_id().to_bytes()))


async def _nat(stack: AsyncExitStack, host: Any, settings: HostSettings, counters: Counter[str]) -> NatServices:
    nat = NatServices(host, settings, counters)
    await stack.enter_async_context(background_trio_service(nat.relay_protocol))
    if settings.relay_service == "on":
        nat.relay_protocol.enable_hop()
    return nat


OK, LIMIT, DENIED = int(StatusCode.OK), int(StatusCode.RESOURCE_LIMIT_EXCEEDED), int(StatusCode.PERMISSION_DENIED)


def test_a_reservation_flood_is_refused_and_a_reservation_for_someone_else_holds_no_slot() -> None:
    burst = 5

    async def run() -> dict[str, Any]:
        async with AsyncExitStack() as stack:
            relay, stock_relay, flooder, quiet, other = await _hosts(stack, 5)
            counters: Counter[str] = Counter()
            settings = HostSettings(relay_service="on", relay_peer_rate=0.0, relay_peer_burst=burst,
                                    relay_total_rate=0.0, relay_total_burst=1000, relay_max_reservations=2,
                                    hole_punch=False)
            nat = await _nat(stack, relay, settings, counters)
            quiet_nat = await _nat(stack, quiet, HostSettings(relay_service="off", hole_punch=False), Counter())
            # py-libp2p's own relay, with room for one reservation, for comparison
            stock = CircuitV2Protocol(stock_relay, RelayLimits(duration=60, data=1 << 20, max_circuit_conns=1,
                                                               max_reservations=1), allow_hop=True)
            await stack.enter_async_context(background_trio_service(stock))
            for client in (flooder, quiet, other):
                for server in (relay, stock_relay):
                    await client.connect(PeerInfo(server.get_id(), server.get_addrs()))
            out: dict[str, Any] = {}
            with trio.fail_after(60):
                out["flood"] = await _hop(flooder, relay, [_reserve() for _ in range(12)])
                out["flood_again"] = await _hop(flooder, relay, [_reserve()])
                async with trio.open_nursery() as nursery:
                    out["quiet"] = await quiet_nat.relays.reserve(relay.get_id(), nursery)
                    nursery.cancel_scope.cancel()
                # A RESERVE naming a peer that is not the asker: refused by ours; the stock relay keeps a slot
                # for that name (until it expires) and turns the next real peer away.
                stranger = ID.from_pubkey(create_new_key_pair().public_key)
                out["foreign"] = await _hop(other, relay, [_reserve(stranger)])
                out["stock_foreign"] = await _hop(other, stock_relay, [_reserve(stranger)])
                out["stock_next"] = await _hop(quiet, stock_relay, [_reserve()])
            out["held"] = set(nat.relay_protocol.resource_manager._reservations)
            out["stock_held"] = set(stock.resource_manager._reservations)
            out["ids"] = {"flooder": flooder.get_id(), "quiet": quiet.get_id(), "stranger": stranger}
            out["counters"] = counters
            return out

    out = trio.run(run)
    ids = out["ids"]
    assert out["flood"] == [OK] * burst + [LIMIT] * (12 - burst)  # the library's refusal status, unread
    assert out["flood_again"] == [None]  # a new stream from a spent peer: reset before it is read
    assert out["quiet"] is not None  # another peer still reserves
    assert out["foreign"] == [DENIED]
    assert out["held"] == {ids["flooder"], ids["quiet"]}
    # py-libp2p 0.8.1 reserves the slot, fails to find a connection for it, and then fails in its own error path
    # ('NetStream' object has no attribute 'is_open'): MALFORMED_MESSAGE, with the slot kept.
    assert out["stock_foreign"] == [int(StatusCode.MALFORMED_MESSAGE)] and ids["stranger"] in out["stock_held"]
    assert out["stock_next"] == [LIMIT]  # py-libp2p 0.8.1: one message filled its relay
    assert out["counters"]["hop_refused_rate"] == (12 - burst) + 1
    assert out["counters"]["hop_refused_foreign"] == 1


def test_a_refused_dropped_or_gone_reservation_moves_on_to_the_next_relay(caplog: pytest.LogCaptureFixture) -> None:
    """What a private node does each round (NatServices._keep_reservations): a relay that refuses is logged and
    the next one tried; a reservation the relay dropped (the library forgot it after refused refreshes) or a relay
    that went away is logged and replaced."""
    async def until(check: Any) -> None:
        while not check():
            await trio.sleep(0.05)

    async def run() -> dict[str, Any]:
        async with AsyncExitStack() as stack:
            a, full, r2, r3 = hosts = await _hosts(stack, 4)
            nats = {a: await _nat(stack, a, HostSettings(relay_service="off", relay_reservations=2, hole_punch=False),
                                  Counter())}
            for relay in hosts[1:]:
                settings = HostSettings(relay_service="on", relay_max_reservations=0 if relay is full else 8,
                                        hole_punch=False)
                nats[relay] = await _nat(stack, relay, settings, Counter())
            node = nats[a]
            held: list[set[ID]] = []
            with trio.fail_after(60):
                async with trio.open_nursery() as nursery:
                    for relay in (full, r2):
                        await a.connect(PeerInfo(relay.get_id(), relay.get_addrs()))
                    await until(lambda: len(node._relay_candidates()) == 2)  # identify told us they serve HOP
                    await node._keep_reservations(nursery)  # full refuses, r2 takes us
                    held.append(set(node.relays.reservations))
                    node.relays.transport._reservations.pop(r2.get_id())  # as the library does once it expired
                    await node._keep_reservations(nursery)  # dropped: full refuses again, r2 again
                    held.append(set(node.relays.reservations))
                    await r2.disconnect(a.get_id())
                    await a.connect(PeerInfo(r3.get_id(), r3.get_addrs()))
                    await until(lambda: r2.get_id() not in a.get_connected_peers()
                                and r3.get_id() in node._relay_candidates())
                    await node._keep_reservations(nursery)  # gone: full refuses again, r3 takes us
                    held.append(set(node.relays.reservations))
                    nursery.cancel_scope.cancel()
            return {"held": held, "counters": node.counters, "ids": [h.get_id() for h in hosts]}

    with caplog.at_level(logging.WARNING, logger="swarm_node.transport.libp2p.nat"):
        out = trio.run(run)
    _, _, r2, r3 = out["ids"]
    assert out["held"] == [{r2}, {r2}, {r3}]
    assert (out["counters"]["relay_refused"], out["counters"]["relay_lost"]) == (3, 2)
    lines = [r.getMessage() for r in caplog.records if r.name == "swarm_node.transport.libp2p.nat"]
    assert sum("refused a reservation; trying the next one" in line for line in lines) == 3
    assert sum(f"relay {r2} dropped our reservation; reserving on another" in line for line in lines) == 1
    assert sum(f"relay {r2} went away; reserving on another" in line for line in lines) == 1


def test_a_relay_carries_no_circuit_beyond_its_limits() -> None:
    """Circuits only to peers holding a reservation (the library), at most relay_max_circuits per source and per
    destination and relay_max_circuits_total in all (ours, counted while in the making), and
    relay_circuit_bytes per circuit (the library resets it)."""
    circuit_bytes = 64 << 10

    async def run() -> dict[str, Any]:
        async with AsyncExitStack() as stack:
            relay, s1, s2, d1, d2, d3 = hosts = await _hosts(stack, 6)
            counters: dict[Any, Counter[str]] = {h: Counter() for h in hosts}
            relay_settings = HostSettings(relay_service="on", relay_max_circuits=1, relay_max_circuits_total=2,
                                          relay_circuit_bytes=circuit_bytes, hole_punch=False)
            nats = {relay: await _nat(stack, relay, relay_settings, counters[relay])}
            for host in hosts[1:]:
                nats[host] = await _nat(stack, host, HostSettings(relay_service="off", hole_punch=False),
                                        counters[host])
                await host.connect(PeerInfo(relay.get_id(), relay.get_addrs()))
            received = [0]

            async def sink(stream: Any) -> None:
                try:
                    while data := await stream.read(65536):
                        received[0] += len(data)
                except Exception:  # the relay reset the circuit
                    pass
            d1.set_stream_handler(ECHO, sink)
            out: dict[str, Any] = {}
            with trio.fail_after(60):
                out["unreserved"] = await _hop(s1, relay, [_connect(d3)])  # d3 holds no reservation (yet)
                async with trio.open_nursery() as nursery:
                    for dest in (d1, d2, d3):
                        assert await nats[dest].relays.reserve(relay.get_id(), nursery) is not None

                    def circuit(dest: Any) -> multiaddr.Multiaddr:
                        return multiaddr.Multiaddr(f"{nats[dest].relays.reservations[relay.get_id()]}/p2p/"
                                                   f"{dest.get_id()}")
                    assert await nats[s1].relays.dial(circuit(d1)) == d1.get_id()  # circuit 1: s1 -> d1
                    out["to_d1_again"] = await _hop(s2, relay, [_connect(d1)])  # d1 is at its one
                    out["from_s1_again"] = await _hop(s1, relay, [_connect(d2)])  # s1 has its one
                    assert await nats[s2].relays.dial(circuit(d2)) == d2.get_id()  # circuit 2: s2 -> d2
                    out["third"] = await _hop(d1, relay, [_connect(d3)])  # 2 in all: no third
                    out["circuits"] = nats[relay].relay_protocol.circuits
                    stream = await s1.new_stream(d1.get_id(), [ECHO])
                    try:
                        for _ in range(4 * circuit_bytes // 4096):
                            await stream.write(b"z" * 4096)
                        await trio.sleep(1.0)  # let the relay's reset arrive: a reset stream cannot read
                        await stream.read(1)
                        out["over_budget"] = "carried"
                    except Exception:
                        out["over_budget"] = "reset"
                    out["received"] = received[0]
                    nursery.cancel_scope.cancel()
            out["counters"] = counters[relay]
            return out

    out = trio.run(run)
    assert out["unreserved"] == [int(StatusCode.NO_RESERVATION)]
    # d1's reservation is at its one circuit: the library itself refuses, answering NO_RESERVATION
    assert out["to_d1_again"] == [int(StatusCode.NO_RESERVATION)]
    assert out["from_s1_again"] == [LIMIT] and out["third"] == [LIMIT]  # ours: per source, and in all
    assert out["circuits"] == 2
    assert out["counters"]["hop_refused_circuits"] == 2
    assert out["over_budget"] == "reset" and out["received"] < circuit_bytes


def test_concurrent_connects_cannot_pass_the_per_destination_limit_together() -> None:
    """py-libp2p counts a circuit against its destination only once the destination has answered, so CONNECTs
    arriving meanwhile all pass its check; ours counts it from the CONNECT on. (The destination here answers after
    1 s, and both CONNECTs are sent at once.)"""
    async def slow_stop(stream: Any) -> None:
        await read_delimited_msg(stream, StopMessage)
        await trio.sleep(1.0)
        await write_delimited_msg(stream, StopMessage(type=StopMessage.STATUS, status=OK))
        await trio.sleep_forever()  # hold the circuit until the test ends

    async def run() -> dict[str, list[int | None]]:
        async with AsyncExitStack() as stack:
            relay, stock_relay, dest, s1, s2 = await _hosts(stack, 5)
            await _nat(stack, relay, HostSettings(relay_service="on", relay_max_circuits=1, hole_punch=False),
                       Counter())
            stock = CircuitV2Protocol(stock_relay, RelayLimits(duration=60, data=1 << 20, max_circuit_conns=1,
                                                               max_reservations=4), allow_hop=True)
            await stack.enter_async_context(background_trio_service(stock))
            dest.set_stream_handler(STOP_PROTOCOL_ID, slow_stop)
            for host in (dest, s1, s2):
                for server in (relay, stock_relay):
                    await host.connect(PeerInfo(server.get_id(), server.get_addrs()))
            out: dict[str, list[int | None]] = {}
            with trio.fail_after(60):
                for name, server in (("ours", relay), ("stock", stock_relay)):
                    assert await _hop(dest, server, [_reserve()]) == [OK]
                    statuses: list[int | None] = []

                    async def connect(source: Any, server: Any = server, statuses: list[int | None] = statuses) \
                            -> None:
                        statuses.extend(await _hop(source, server, [_connect(dest)]))
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(connect, s1)
                        nursery.start_soon(connect, s2)
                    out[name] = sorted(statuses, key=lambda s: s or 0)
            return out

    out = trio.run(run)
    assert out["ours"] == [OK, LIMIT]
    assert out["stock"] == [OK, OK]  # two circuits to a destination allowed one
