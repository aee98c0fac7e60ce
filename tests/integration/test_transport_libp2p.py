"""libp2p transport against real network hosts (child processes) on 127.0.0.1.

Covers the interface contract (gossip with REJECT/IGNORE, streams with half-close, peers), the two py-libp2p 0.8.1
remote crashes (guarded: the host survives and still delivers; unguarded: the host dies and the supervisor restarts
it), a host killed with SIGKILL coming back with the same peer id, port and subscriptions, and discovery: nodes that
know only their bootstrap find each other through the DHT rendezvous and stay connected once the bootstrap leaves.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Callable

import pytest

from bench.procs import JsonProc
from swarm_node.identity import generate
from swarm_node.transport.base import Delivery, StreamReset, TransportError, TransportUnavailable, ValidationResult
from swarm_node.transport.connectivity import local_self_check, start_network
from swarm_node.transport.libp2p.ipc import HostSettings
from swarm_node.transport.libp2p.launch import LibP2PConfig
from swarm_node.transport.libp2p.transport import LibP2PTransport
from swarm_node.transport.supervisor import Backoff

pytestmark = [pytest.mark.libp2p, pytest.mark.timeout(120)]

TOPIC = "test-topic"


def config(**host: object) -> LibP2PConfig:
    settings = HostSettings(listen=("/ip4/127.0.0.1/tcp/0",), **host)  # type: ignore[arg-type]
    return LibP2PConfig(host=settings, restart=Backoff(initial_s=0.1, max_s=1.0), health_interval_s=1.0)


@contextlib.asynccontextmanager
async def transports(*configs: LibP2PConfig) -> AsyncIterator[list[LibP2PTransport]]:
    nodes = [LibP2PTransport(generate(), cfg) for cfg in configs]
    try:
        await asyncio.gather(*(n.start() for n in nodes))
        yield nodes
    finally:
        await asyncio.gather(*(n.stop() for n in nodes), return_exceptions=True)


async def wait_for(predicate, timeout: float = 20.0, what: str | Callable[[], str] = "condition") -> None:  # type: ignore[no-untyped-def]
    async def poll() -> None:
        while not predicate():
            await asyncio.sleep(0.05)
    try:
        await asyncio.wait_for(poll(), timeout)
    except asyncio.TimeoutError:
        raise AssertionError(f"timed out waiting for {what() if callable(what) else what}") from None


async def mutually_subscribed(a: LibP2PTransport, b: LibP2PTransport, timeout: float = 20.0) -> None:
    """Until each sees the other subscribed to TOPIC (earlier gossip would miss it), plus a moment to graft."""
    async def sees(x: LibP2PTransport, y: LibP2PTransport) -> bool:
        return any(p.peer_id == y.peer_id and TOPIC in p.topics for p in await x.peers())

    async def poll() -> None:
        while not (await sees(a, b) and await sees(b, a)):
            await asyncio.sleep(0.1)

    await asyncio.wait_for(poll(), timeout)
    await asyncio.sleep(0.3)


async def publish_until_received(sender: LibP2PTransport, inbox: list[Delivery], prefix: bytes) -> None:
    """Gossip is best effort while a peer's connection is being replaced: publish every 0.5 s until one arrives."""
    async def attempt() -> None:
        for i in range(1000):
            await sender.publish(TOPIC, prefix + b"-%d" % i)
            await asyncio.sleep(0.5)
            if any(d.data.startswith(prefix) for d in inbox):
                return
    await asyncio.wait_for(attempt(), 20)


async def link(a: LibP2PTransport, b: LibP2PTransport) -> None:
    """Connect a to b and wait until gossip flows both ways."""
    assert await a.connect(b.listen_addrs()[0]) == b.peer_id
    await mutually_subscribed(a, b)


async def test_gossip_streams_peers_and_sigkill_restart() -> None:
    async with transports(config(), config()) as (a, b):
        got_a: list[Delivery] = []
        got_b: list[Delivery] = []
        verdicts = {b"bad": ValidationResult.REJECT, b"old": ValidationResult.IGNORE}
        b.set_validator(TOPIC, lambda signer, data: verdicts.get(data[:3], ValidationResult.ACCEPT))
        await b.subscribe(TOPIC, got_b.append)
        await a.subscribe(TOPIC, got_a.append)
        await link(a, b)
        assert [(p.peer_id, p.topics) for p in await a.peers()] == [(b.peer_id, (TOPIC,))]

        for payload in (b"good-1", b"bad-1", b"old-1", b"good-2"):
            await a.publish(TOPIC, payload)
        await wait_for(lambda: len(got_b) == 2 and b.stats.validated["IGNORE"] == 1, what="b's deliveries")
        assert [(d.topic, d.data, d.from_peer) for d in got_b] == [(TOPIC, b"good-1", a.peer_id),
                                                                  (TOPIC, b"good-2", a.peer_id)]
        assert b.stats.validated == {"ACCEPT": 2, "REJECT": 1, "IGNORE": 1}
        assert got_a == []  # our own publishes are not delivered to us

        with pytest.raises(TransportError, match="exceeds"):
            await a.publish(TOPIC, b"x" * (1 << 20))  # never silently dropped: refused with a reason

        # Streams: request/response with half-close, 3 MB each way (more than the flow-control window).
        async def reverse(stream) -> None:
            data = b""
            while chunk := await stream.read(1 << 20):
                data += chunk
            await stream.write(data[::-1])
            await stream.close()

        await b.serve_stream("/test/reverse/1", reverse)
        payload = os.urandom(3 << 20)
        stream = await a.open_stream(b.peer_id, "/test/reverse/1")
        await stream.write(payload)
        await stream.close()
        assert await stream.read_exactly(len(payload)) == payload[::-1]
        assert await stream.read() == b""
        with pytest.raises(TransportError):
            await a.open_stream(b.peer_id, "/test/nobody-serves-this/1")

        # SIGKILL a's host: the supervisor restarts it with the same peer id and port, resubscribes, redials b.
        addr_before, pid_before = a.listen_addrs(), a.host_pid
        hanging = await a.open_stream(b.peer_id, "/test/reverse/1")
        assert a.kill_host_for_test() == pid_before
        with pytest.raises(StreamReset):
            await hanging.read()
        await wait_for(lambda: a.stats.restarts == 1 and a.is_up, what="a's restart")
        assert a.host_pid != pid_before and a.listen_addrs() == addr_before
        await mutually_subscribed(a, b)  # a redialled b and resubscribed
        await publish_until_received(a, got_b, b"after-restart-a")
        await publish_until_received(b, got_a, b"after-restart-b")
        assert got_b[2].data.startswith(b"after-restart-a") and got_b[2].from_peer == a.peer_id
        assert got_a[0].data.startswith(b"after-restart-b") and got_a[0].from_peer == b.peer_id


async def test_announce_addr_and_calls_while_host_is_down() -> None:
    async with transports(config(announce=("/ip4/1.2.3.4/tcp/4001",))) as (a,):
        # --announce-addr: what others should dial (port forwarding / NAT), whatever we listen on.
        assert a.listen_addrs() == [f"/ip4/1.2.3.4/tcp/4001/p2p/{a.peer_id}"]
        report = await local_self_check(a.listen_addrs())
        assert report.reachable is None and "AutoNAT (peers' dial-back) will confirm" in report.summary
        a.kill_host_for_test()
        await wait_for(lambda: not a.is_up, what="a going down")
        with pytest.raises(TransportUnavailable):
            await a.publish(TOPIC, b"x")
        await wait_for(lambda: a.is_up, what="a coming back")
        await a.publish(TOPIC, b"x")


async def attack(attacker: JsonProc, target: LibP2PTransport, kind: str) -> None:
    await attacker.request("sent", cmd="raw", target=target.peer_id, kind=kind, topic=TOPIC, honest="")


async def test_guards_survive_both_remote_crashes() -> None:
    attacker = await JsonProc.start("tests.libp2p_helpers.attacker", name="attacker")
    try:
        async with transports(config(), config()) as (a, b):
            got: list[Delivery] = []
            await a.subscribe(TOPIC, got.append)
            await b.subscribe(TOPIC, lambda d: None)
            await link(b, a)
            await attacker.expect(lambda e: e.get("event") == "ready")
            await attacker.request("connected", cmd="connect", addr=a.listen_addrs()[0])
            await attacker.request("capturing", cmd="capture", topic=TOPIC)  # subscribed: a accepts our frames
            await asyncio.sleep(1.0)
            pid = a.host_pid
            for kind in ("undecodable_frame", "malformed_key", "oversized_frame", "unsigned"):
                await attack(attacker, a, kind)
            await attacker.request("sent", cmd="raw", target=a.peer_id, kind="forged_signature", topic=TOPIC,
                                   honest=b.peer_id)
            await asyncio.sleep(0.5)
            counters = await a.host_counters()
            assert counters["undecodable_frame"] == 1 and counters["malformed_key"] == 1
            await b.publish(TOPIC, b"still-alive")
            await wait_for(lambda: len(got) == 1, what="delivery after the attacks")
            assert [(d.data, d.from_peer) for d in got] == [(b"still-alive", b.peer_id)]
            assert a.stats.restarts == 0 and a.host_pid == pid
    finally:
        await attacker.close()


@pytest.mark.parametrize("kind", ["undecodable_frame", "malformed_key"])
async def test_unguarded_crash_kills_host_and_supervisor_restarts_it(kind: str) -> None:
    """Without the guards each crash is real; the supervisor brings the host back and gossip resumes."""
    attacker = await JsonProc.start("tests.libp2p_helpers.attacker", name="attacker")
    try:
        async with transports(config(crash_guards=False), config()) as (a, b):
            got: list[Delivery] = []
            await a.subscribe(TOPIC, got.append)
            await b.subscribe(TOPIC, lambda d: None)
            await link(a, b)
            await attacker.expect(lambda e: e.get("event") == "ready")
            await attacker.request("connected", cmd="connect", addr=a.listen_addrs()[0])
            await attacker.request("capturing", cmd="capture", topic=TOPIC)
            await asyncio.sleep(1.0)
            pid = a.host_pid
            await attack(attacker, a, kind)
            await wait_for(lambda: a.stats.restarts == 1 and a.is_up, what="the crash and the restart")
            assert a.host_pid != pid
            await mutually_subscribed(a, b)
            await publish_until_received(b, got, b"after-restart")
            assert got[0].data.startswith(b"after-restart") and got[0].from_peer == b.peer_id
    finally:
        await attacker.close()


async def test_thread_isolation_works_too() -> None:
    cfg = config()
    thread_cfg = LibP2PConfig(host=cfg.host, isolation="thread")
    async with transports(thread_cfg, config()) as (a, b):
        got: list[Delivery] = []
        await a.subscribe(TOPIC, lambda d: None)
        await b.subscribe(TOPIC, got.append)
        await link(a, b)
        await a.publish(TOPIC, b"via-thread")
        await wait_for(lambda: len(got) == 1, what="delivery from the thread host")
        assert got[0].from_peer == a.peer_id and a.host_pid is None


def test_background_facade_start_network_over_libp2p(caplog: pytest.LogCaptureFixture) -> None:
    """The node's wiring: synchronous facades, start_network with a bootstrap, publish/drain from plain threads."""
    import time

    from swarm_node.transport.background import BackgroundTransport

    a = BackgroundTransport(lambda: LibP2PTransport(generate(), config()))
    b = BackgroundTransport(lambda: LibP2PTransport(generate(), config()))
    a.start()
    b.start()
    try:
        for net in (a, b):
            net.set_validator(TOPIC, lambda signer, data: ValidationResult.ACCEPT)
            net.subscribe_queue(TOPIC)
        caplog.set_level(logging.WARNING, logger="swarm_node.transport.nat_report")
        with caplog.at_level(logging.WARNING, logger="swarm_node.transport.connectivity"):
            a.start_network([])
            keeper = b.start_network([a.listen_addrs()[0]], check_interval_s=0.2)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not (
                    keeper.state == "connected" and any(TOPIC in p.topics for p in b.peers())
                    and any(TOPIC in p.topics for p in a.peers())):
                time.sleep(0.1)
            assert keeper.state == "connected"
            time.sleep(0.3)
            a.publish(TOPIC, b"group-from-a")
            while time.monotonic() < deadline and not (got := b.drain(TOPIC)):
                time.sleep(0.05)
            assert [(d.data, d.from_peer) for d in got] == [(b"group-from-a", a.peer_id)]
            while time.monotonic() < deadline and not any(r.name.endswith("nat_report") for r in caplog.records):
                time.sleep(0.1)
        messages = [r.message for r in caplog.records]
        assert any(f"others can join with --bootstrap {a.listen_addrs()[0]}" in m for m in messages)
        assert any("loopback only" in m for m in messages)  # the local self-check's verdict and advice
        # AutoNAT's verdict (libp2p/nat.py), logged by start_network's watcher: a dial-back to 127.0.0.1 proves
        # nothing about the internet, so unknown.
        assert any(m.startswith("reachability: unknown so far") for m in messages)
    finally:
        b.stop()
        a.stop()


async def test_dht_rendezvous_finds_peers_and_the_swarm_outlives_its_bootstrap() -> None:
    """Discovery with no protocol of ours: b and c are given only the bootstrap a (start_network, as `join` does);
    the Kademlia rendezvous on the swarm's topic (libp2p/rendezvous.py) connects them to each other (gossipsub's own
    peer exchange is off: nothing else could). Then a leaves for good: b and c still see each other, stay "connected",
    and gossip flows both ways."""
    dht = config(rendezvous=TOPIC, dht_interval_s=1.0)
    async with transports(dht, dht, dht) as (a, b, c):
        got: dict[str, list[Delivery]] = {b.peer_id: [], c.peer_id: []}
        await a.subscribe(TOPIC, lambda d: None)
        for node in (b, c):
            await node.subscribe(TOPIC, got[node.peer_id].append)
        boot = a.listen_addrs()[0]
        keepers = [await start_network(a, []), await start_network(b, [boot], check_interval_s=0.2),
                   await start_network(c, [boot], check_interval_s=0.2)]
        try:
            await mutually_subscribed(b, c, timeout=60)
            discovered: dict[str, dict[str, str]] = {}

            async def found_each_other() -> bool:
                for x, y in ((b, c), (c, b)):
                    discovered[x.peer_id] = (await x.nat_status())["discovered"]
                    if discovered[x.peer_id].get(y.peer_id) != "dht":
                        return False
                return True
            await wait_for_async(found_each_other, 30, what=lambda: f"DHT discoveries, got {discovered}")

            await a.stop()  # the bootstrap leaves
            sees: dict[str, list[str]] = {}

            async def only_each_other() -> bool:
                for x in (b, c):
                    sees[x.peer_id] = [p.peer_id for p in await x.peers()]
                return sees == {b.peer_id: [c.peer_id], c.peer_id: [b.peer_id]}
            await wait_for_async(only_each_other, 30, what=lambda: f"b and c alone together, got {sees}")
            await publish_until_received(b, got[c.peer_id], b"after-bootstrap-left-b")
            await publish_until_received(c, got[b.peer_id], b"after-bootstrap-left-c")
            assert all(d.from_peer == b.peer_id for d in got[c.peer_id])
            assert all(d.from_peer == c.peer_id for d in got[b.peer_id])
            await asyncio.sleep(0.5)  # a few keeper rounds without the bootstrap
            assert keepers[1].state == keepers[2].state == "connected"
            assert await only_each_other()
        finally:
            for keeper in keepers:
                keeper.stop()


async def validating_receiver(a: LibP2PTransport,
                               b: LibP2PTransport) -> tuple[list[Delivery], list[tuple[str, bytes]]]:
    """a and b linked on TOPIC; b validates it, recording (signer, data) of each message it is asked about, and
    accepts all. Returns what b delivers and what it validated."""
    got: list[Delivery] = []
    validated: list[tuple[str, bytes]] = []

    def validator(signer: str, data: bytes) -> ValidationResult:
        validated.append((signer, data))
        return ValidationResult.ACCEPT
    await a.subscribe(TOPIC, lambda d: None)
    b.set_validator(TOPIC, validator)
    await b.subscribe(TOPIC, got.append)
    await link(a, b)
    return got, validated


async def test_pushed_reputation_graylists_a_signer_in_the_host() -> None:
    """SCORES over the real IPC: once the node pushes a blocked score for a peer, its host drops that peer's
    messages itself (no VALIDATE round trip, nothing delivered), and the router's own graylist applies."""
    async with transports(config(), config()) as (a, b):
        got, validated = await validating_receiver(a, b)
        await publish_until_received(a, got, b"before")
        await b.set_peer_scores({a.peer_id: -1000.0})
        seen = len(validated)
        for i in range(5):
            await a.publish(TOPIC, b"after-%d" % i)
        counters: dict[str, int] = {}

        async def dropped() -> bool:
            counters.update(await b.host_counters())
            return counters.get("graylisted_forwarder", 0) + counters.get("graylisted_signer", 0) >= 5
        await wait_for_async(dropped, what=lambda: f"graylist counters, got {counters}")
        assert not any(d.data.startswith(b"after") for d in got) and len(validated) == seen


async def test_a_forwarder_past_its_validation_budget_is_ignored_unread() -> None:
    """forward_peer_burst 3 and rate 0: of 8 distinct messages a forwards, b's host validates exactly 3 and ignores
    5 before their signature or a VALIDATE round trip (counted). a has the same budget: its own publishes take
    nothing from it (else b would see at most 3 arrive)."""
    budget = {"forward_peer_rate": 0.0, "forward_peer_burst": 3}
    async with transports(config(**budget), config(**budget)) as (a, b):
        got, validated = await validating_receiver(a, b)
        await mutually_subscribed(a, b)
        for i in range(8):
            await a.publish(TOPIC, b"m-%d" % i)
        counters: dict[str, int] = {}

        async def all_handled() -> bool:
            counters.update(await b.host_counters())
            return len(validated) + counters.get("forwarder_over_budget", 0) >= 8
        await wait_for_async(all_handled, what=lambda: f"8 messages handled, got {validated} and {counters}")
        await asyncio.sleep(0.5)  # nothing more arrives
        counters.update(await b.host_counters())
        assert len(validated) == 3 and counters["forwarder_over_budget"] == 5
        assert sorted(d.data for d in got) == sorted(data for _signer, data in validated)


async def wait_for_async(predicate: Callable[[], object], timeout: float = 20.0,
                         what: str | Callable[[], str] = "condition") -> None:
    async def poll() -> None:
        while not await predicate():  # type: ignore[misc]
            await asyncio.sleep(0.1)
    try:
        await asyncio.wait_for(poll(), timeout)
    except asyncio.TimeoutError:
        raise AssertionError(f"timed out waiting for {what() if callable(what) else what}") from None
