"""Circuit relay v2 on loopback (no namespaces needed): reservations (a refusing relay is skipped), dialling through
a relay, relayed bytes counted on both ends and on the relay, the relay named right, and chunk streams refused
over a relayed connection."""

from __future__ import annotations

from collections import Counter
from contextlib import AsyncExitStack
from typing import Any

import multiaddr
import pytest
import trio
from libp2p import new_host
from libp2p.crypto.secp256k1 import create_new_key_pair
from libp2p.crypto.x25519 import create_new_key_pair as create_x25519_key_pair
from libp2p.network.stream.exceptions import StreamReset
from libp2p.peer.peerinfo import PeerInfo
from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_PROTOCOL_ID
from libp2p.security.noise.transport import Transport as NoiseTransport
from libp2p.tools.anyio_service import background_trio_service

from protocol.chunks import PROTOCOL_ID as CHUNKS_PROTOCOL_ID
from swarm_node.transport.libp2p.ipc import HostSettings
from swarm_node.transport.libp2p.nat import NatServices

pytestmark = pytest.mark.libp2p
ECHO = "/test/echo/1"


def _host() -> Any:
    key_pair = create_new_key_pair()
    security = {NOISE_PROTOCOL_ID: NoiseTransport(key_pair, noise_privkey=create_x25519_key_pair().private_key)}
    return new_host(key_pair=key_pair, sec_opt=security)


async def _echo(stream: Any) -> None:
    data = await stream.read(1024)
    await stream.write(b"echo:" + data)
    await stream.close()


def test_reservations_dials_counting_and_refused_chunks_over_a_relay() -> None:
    async def run() -> dict[str, Any]:
        hosts = {name: _host() for name in ("full", "relay", "a", "b")}
        nats: dict[str, NatServices] = {}
        counters: dict[str, Counter[str]] = {}
        async with AsyncExitStack() as stack:
            for name, host in hosts.items():
                await stack.enter_async_context(host.run([multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")]))
                counters[name] = Counter()
                settings = HostSettings(relay_service="on" if name in ("full", "relay") else "off",
                                        relay_max_reservations=0 if name == "full" else 8, hole_punch=False)
                nats[name] = NatServices(host, settings, counters[name])
                await stack.enter_async_context(background_trio_service(nats[name].relay_protocol))
                if settings.relay_service == "on":
                    nats[name].relay_protocol.enable_hop()
            async with trio.open_nursery() as nursery:
                a, b = hosts["a"], hosts["b"]
                for relay in ("full", "relay"):
                    await a.connect(PeerInfo(hosts[relay].get_id(), hosts[relay].get_addrs()))
                refused = await nats["a"].relays.reserve(hosts["full"].get_id(), nursery)
                circuit = await nats["a"].relays.reserve(hosts["relay"].get_id(), nursery)
                assert circuit is not None
                a.set_stream_handler(ECHO, _echo)

                async def chunk_handler(stream: Any) -> None:  # what transport.libp2p.host._incoming_stream does first
                    if nats["a"].refuses(stream):
                        await stream.reset()
                        return
                    await _echo(stream)
                a.set_stream_handler(CHUNKS_PROTOCOL_ID, chunk_handler)
                me = multiaddr.Multiaddr(f"{circuit}/p2p/{a.get_id()}")
                assert me in a.get_addrs()  # advertised (identify, DHT records) next to the direct addresses
                await hosts["relay"].connect(PeerInfo(b.get_id(), b.get_addrs()))
                assert await nats["b"].relays.dial(me) == a.get_id()
                stream = await b.new_stream(a.get_id(), [ECHO])
                await stream.write(b"hi")
                reply = await stream.read(1024)
                chunks = await b.new_stream(a.get_id(), [CHUNKS_PROTOCOL_ID])
                with pytest.raises(StreamReset):  # reset by A: no chunks through the relay
                    await chunks.write(b"x")
                    await chunks.read(1024)
                await trio.sleep(0.2)
                result = {
                    "refused": refused, "circuit": str(circuit), "reservations": list(nats["a"].relays.reservations),
                    "reply": reply, "paths_a": nats["a"].paths(), "relays_in_use_a": nats["a"].relays_in_use(),
                    "counters": counters, "ids": {n: h.get_id() for n, h in hosts.items()},
                }
                nursery.cancel_scope.cancel()
            return result

    result = trio.run(run)
    ids, counters = result["ids"], result["counters"]
    assert result["refused"] is None  # a relay with no room refuses; the caller tries the next one
    assert result["circuit"].endswith(f"/p2p/{ids['relay'].to_base58()}/p2p-circuit")
    assert result["reservations"] == [ids["relay"]]
    assert result["reply"] == b"echo:hi"
    assert result["paths_a"][ids["b"].to_base58()] == "relay"
    assert result["relays_in_use_a"][ids["b"].to_base58()] == ids["relay"].to_base58()
    assert counters["a"]["relayed_stream_refused"] == 1
    assert counters["a"]["relayed_bytes"] > 0 and counters["b"]["relayed_bytes"] > 0
    assert counters["relay"]["relay_served_bytes"] > 0 and counters["full"]["relay_served_bytes"] == 0
