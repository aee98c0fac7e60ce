"""Why the node does not use QUIC (docs/NAT.md, "QUIC"): py-libp2p 0.8.1's QUIC transport connects and carries a
stream, but DCUtR cannot punch a hole with it, and an idle QUIC stream dies. Each test pins one fact of the library,
on loopback, with the file and line it comes from; if an upgrade of py-libp2p changes one, the test fails and the
decision "TCP only" should be measured again (`python -m tests.netns.quic_punch`, `python -m tests.netns.quic_probe`).

Hole punching behind a cone NAT needs the packets of both sides to leave from the socket the peer dials (the listen
socket) towards the address the peer's NAT maps its listen socket to. py-libp2p 0.8.1's QUIC misses all of it:
- a QUIC dial leaves from a fresh UDP socket, not the listen socket (transport/quic/connection.py:390-402), so no NAT
  mapping is ever made for the listen port;
- identify reports a QUIC peer's observed address as /tcp (identify/identify.py:63-82), so no QUIC address is learnt;
- DCUtR predicts only /tcp addresses from observations (relay/circuit_v2/dcutr.py:1118-1134);
- the DCUtR initiator's dials go through `dial_addr_as_responder`, which refuses QUIC (network/swarm.py:1470-1479).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from typing import Any

import multiaddr
import pytest
import trio
from libp2p import new_host
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.crypto.x25519 import create_new_key_pair as create_x25519_key_pair
from libp2p.host.observed_addr_manager import ACTIVATION_THRESHOLD
from libp2p.identity.identify.identify import ID as IDENTIFY
from libp2p.identity.identify.identify import parse_identify_response
from libp2p.network.exceptions import SwarmException
from libp2p.network.stream.exceptions import StreamEOF
from libp2p.peer.peerinfo import info_from_p2p_addr
from libp2p.relay.circuit_v2 import DCUtRProtocol
from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_PROTOCOL_ID
from libp2p.security.noise.transport import Transport as NoiseTransport
from libp2p.transport.quic.config import QUICTransportConfig

pytestmark = pytest.mark.libp2p
QUIC = "/ip4/127.0.0.1/udp/0/quic-v1"
TCP = "/ip4/127.0.0.1/tcp/0"
ECHO = "/test/echo/1"
DEADLINE_S = 30.0  # liveness bound for each loopback step on a loaded machine, not a timing


def _host(*listen: str, config: QUICTransportConfig | None = None) -> tuple[Any, list[multiaddr.Multiaddr]]:
    key_pair = create_new_key_pair()
    security = {NOISE_PROTOCOL_ID: NoiseTransport(key_pair, noise_privkey=create_x25519_key_pair().private_key)}
    addrs = [multiaddr.Multiaddr(a) for a in listen]
    host = new_host(key_pair=key_pair, sec_opt=security, listen_addrs=addrs, enable_quic=config is not None,
                    quic_transport_opt=config)
    return host, addrs


def _run(body: Callable[..., Awaitable[Any]], *hosts: tuple[Any, list[multiaddr.Multiaddr]]) -> Any:
    async def main() -> Any:
        async with AsyncExitStack() as stack:
            for host, addrs in hosts:
                await stack.enter_async_context(host.run(addrs))
            with trio.fail_after(DEADLINE_S):
                return await body(*(host for host, _ in hosts))
    return trio.run(main)


def _addr(host: Any, kind: str) -> multiaddr.Multiaddr:
    return next(a for a in host.get_addrs() if ("quic" in str(a)) == (kind == "quic"))


async def _read_all(stream: Any) -> bytes:
    data = b""
    while True:
        try:
            chunk = await stream.read(4096)
        except StreamEOF:
            return data
        if not chunk:
            return data
        data += chunk


def test_quic_connects_and_carries_a_stream_from_a_fresh_udp_port() -> None:
    """What works: a QUIC connection and a stream. What a hole punch needs and does not get: the dial leaves from a
    new UDP socket (connection.py:390-402), so the peer sees a port other than our listen port."""
    seen: list[tuple[str, int]] = []

    async def echo(stream: Any) -> None:
        seen.append(stream.get_remote_address())
        await stream.write(b"echo:" + await stream.read(64))
        await _read_all(stream)  # until the asker closes (the stream ends when this handler returns)

    async def body(a: Any, b: Any) -> None:
        a.set_stream_handler(ECHO, echo)
        await b.connect(info_from_p2p_addr(_addr(a, "quic")))
        conns = b.get_network().get_connections(a.get_id())
        assert [type(c.muxed_conn).__name__ for c in conns] == ["QUICConnection"]
        stream = await b.new_stream(a.get_id(), [ECHO])
        await stream.write(b"hi")
        assert await stream.read(64) == b"echo:hi"
        await stream.close()
        listen_port = int(_addr(b, "quic").value_for_protocol("udp"))
        assert seen[0][0] == "127.0.0.1" and seen[0][1] != listen_port

    _run(body, _host(QUIC), _host(QUIC))


def test_identify_reports_a_quic_peers_observed_address_as_tcp() -> None:
    """identify.py:63-82 builds the observed address as /tcp/<port> whatever the transport: over QUIC the peer is
    told a TCP address at its UDP port, so a node never learns its external QUIC address from identify."""

    async def body(a: Any, b: Any) -> None:
        await b.connect(info_from_p2p_addr(_addr(a, "quic")))
        stream = await b.new_stream(a.get_id(), [IDENTIFY])
        observed = str(multiaddr.Multiaddr(parse_identify_response(await _read_all(stream)).observed_addr))
        parts = observed.strip("/").split("/")
        assert parts[0:3] == ["ip4", "127.0.0.1", "tcp"], observed  # a QUIC connection, reported as TCP

    _run(body, _host(QUIC), _host(QUIC))


class _Observed:
    """An observed-address manager that one peer told it sees us at `addr` (what identify records behind a NAT;
    DCUtR reads observations of one observer, `get_addrs` only confirmed ones, ACTIVATION_THRESHOLD of them)."""

    def __init__(self, addr: str) -> None:
        self.addr = multiaddr.Multiaddr(addr)

    def addrs(self, min_observers: int = ACTIVATION_THRESHOLD) -> list[multiaddr.Multiaddr]:
        return [self.addr] if min_observers <= 1 else []


def test_dcutr_offers_a_predicted_address_for_tcp_only() -> None:
    """relay/circuit_v2/dcutr.py:1118-1134: the addresses DCUtR sends in CONNECT are the external IP at our *TCP*
    listen port; a QUIC listener gets no predicted address, and a QUIC-only host sends its private listen addresses
    (the peer dials 192.168.x.y, which it cannot reach: seen in tests/netns/quic_punch.py)."""

    async def body(both: Any, quic_only: Any) -> None:
        both._observed_addr_manager = _Observed("/ip4/11.0.0.101/tcp/40000")
        offered = [str(multiaddr.Multiaddr(a)) for a in await DCUtRProtocol(both)._get_observed_addrs()]
        tcp_port = _addr(both, "tcp").value_for_protocol("tcp")
        assert offered == [f"/ip4/11.0.0.101/tcp/{tcp_port}"]  # no QUIC address, though we listen on QUIC
        quic_only._observed_addr_manager = _Observed("/ip4/11.0.0.101/udp/40000/quic-v1")
        offered = [str(multiaddr.Multiaddr(a)) for a in await DCUtRProtocol(quic_only)._get_observed_addrs()]
        assert offered and not any("11.0.0.101" in a for a in offered)  # the listen address only
        assert all(a.startswith("/ip4/127.0.0.1/udp/") for a in offered)

    _run(body, _host(TCP, QUIC), _host(QUIC))


def test_the_dcutr_initiator_cannot_dial_quic() -> None:
    """The DCUtR initiator dials with `dial_addr_as_responder` (dcutr.py, `_perform_hole_punch(as_responder=True)`),
    which completes a QUIC dial, closes it and raises (network/swarm.py:1470-1479)."""

    async def body(a: Any, b: Any) -> None:
        with pytest.raises(SwarmException, match="not supported for pre-multiplexed transports"):
            await a.get_network().dial_addr_as_responder(_addr(b, "quic"), b.get_id())

    _run(body, _host(QUIC), _host(QUIC))


def test_an_idle_quic_stream_is_torn_down_after_its_read_timeout() -> None:
    """transport/quic/stream.py:269-294: a read that waits STREAM_READ_TIMEOUT (30 s by default) raises and the
    stream is reset. Any long-lived quiet stream dies: gossipsub's (after 45 s without messages a publish was not
    delivered, `quic_probe idle`) and a relay circuit's. Shown here with the timeout set to 1 s."""
    assert QUICTransportConfig().STREAM_READ_TIMEOUT == 30.0
    outcome: list[str] = []

    async def wait_quietly(stream: Any) -> None:
        try:
            await stream.read(64)
            outcome.append("read returned")
        except Exception as exc:  # what a quiet stream's reader gets
            outcome.append(f"{type(exc).__name__}: {exc}")

    async def body(a: Any, b: Any) -> None:
        a.set_stream_handler(ECHO, wait_quietly)
        await b.connect(info_from_p2p_addr(_addr(a, "quic")))
        stream = await b.new_stream(a.get_id(), [ECHO])
        await stream.write(b"")  # open the stream without data: the reader waits
        while not outcome:
            await trio.sleep(0.1)
        assert "Read timeout" in outcome[0], outcome

    config = QUICTransportConfig(STREAM_READ_TIMEOUT=1.0)
    _run(body, _host(QUIC, config=config), _host(QUIC, config=config))
