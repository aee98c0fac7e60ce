"""AutoNAT: py-libp2p 0.8.1's dial-back trap, measured, and our fresh-connection dial-back; reachability verdicts.

The trap: `AutoNATService._try_dial` calls `host.connect`, which returns at once while any connection to the asker
exists, and the asker always has one. Here the asker advertises an address where nothing listens (what a node
behind NAT looks like from outside): the stock server answers OK ("reachable"), ours answers E_DIAL_ERROR.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import multiaddr
import pytest
import trio
from libp2p import new_host
from libp2p.crypto.secp256k1 import create_new_key_pair
from libp2p.crypto.x25519 import create_new_key_pair as create_x25519_key_pair
from libp2p.host.autonat.autonat import AutoNATService
from libp2p.host.autonat.pb.autonat_pb2 import Message
from libp2p.peer.peerinfo import PeerInfo
from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_PROTOCOL_ID
from libp2p.security.noise.transport import Transport as NoiseTransport

from swarm_node.transport.libp2p.autonat import FreshDialAutoNAT
from swarm_node.transport.libp2p.paths import concrete_addrs
from swarm_node.transport.libp2p.rendezvous import rendezvous_key
from swarm_node.transport.nat_report import summarise
from swarm_node.transport.reachability import Reachability, Verdicts, status_line

pytestmark = pytest.mark.libp2p


def _host() -> Any:
    key_pair = create_new_key_pair()
    security = {NOISE_PROTOCOL_ID: NoiseTransport(key_pair, noise_privkey=create_x25519_key_pair().private_key)}
    return new_host(key_pair=key_pair, sec_opt=security)


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def _ask(server_cls: type, advertise: str) -> tuple[int, int]:
    """(status the server answers, dial-backs our server counted) for a client that advertises `advertise`."""
    server, client = _host(), _host()
    async with AsyncExitStack() as stack:
        for host in (server, client):
            await stack.enter_async_context(host.run([multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")]))
        service = FreshDialAutoNAT(server, need_public=1) if server_cls is FreshDialAutoNAT \
            else AutoNATService(server)
        asker = AutoNATService(client, serve=False)
        await client.connect(PeerInfo(server.get_id(), server.get_addrs()))
        with trio.fail_after(30):
            status, _ = await asker.query_server(server.get_id(), [multiaddr.Multiaddr(advertise).to_bytes()])
        return status, getattr(service, "dialbacks_served", 0)


def test_stock_autonat_calls_an_unreachable_asker_reachable_and_ours_does_not() -> None:
    unreachable = f"/ip4/127.0.0.1/tcp/{_closed_port()}"
    assert trio.run(_ask, AutoNATService, unreachable)[0] == int(Message.OK)  # the trap
    assert trio.run(_ask, FreshDialAutoNAT, unreachable) == (int(Message.E_DIAL_ERROR), 0)


@asynccontextmanager
async def _served_asker() -> AsyncIterator[tuple[FreshDialAutoNAT, AutoNATService, Any, list[bytes]]]:
    """Our AutoNAT server and a connected, reachable asker on loopback: (service, asker, server id, its addrs)."""
    server, client = _host(), _host()
    async with AsyncExitStack() as stack:
        for host in (server, client):
            await stack.enter_async_context(host.run([multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")]))
        service = FreshDialAutoNAT(server, need_public=1)
        asker = AutoNATService(client, serve=False)
        await client.connect(PeerInfo(server.get_id(), server.get_addrs()))
        yield service, asker, server.get_id(), [a.to_bytes() for a in client.get_transport_addrs()]


def test_our_autonat_confirms_a_reachable_asker_on_a_fresh_connection() -> None:
    async def run() -> tuple[int, int]:
        async with _served_asker() as (service, asker, server_id, listen):
            with trio.fail_after(30):
                status, _ = await asker.query_server(server_id, listen)
            return status, service.dialbacks_served
    assert trio.run(run) == (int(Message.OK), 1)


def test_dialback_requests_are_rate_limited_per_asking_ip() -> None:
    async def run() -> tuple[list[int], int, int]:
        async with _served_asker() as (service, asker, server_id, listen):
            statuses = []
            with trio.fail_after(30):
                for _ in range(3):
                    statuses.append((await asker.query_server(server_id, listen))[0])
            return statuses, service.dialbacks_served, service.refused_rate
    assert trio.run(run) == ([int(Message.OK), int(Message.E_DIAL_REFUSED), int(Message.E_DIAL_REFUSED)], 1, 2)


def test_a_dial_back_to_another_key_at_the_address_is_not_a_confirmation() -> None:
    """Something else listening at the advertised address (another peer) fails the Noise check: no OK."""
    async def run() -> int:
        server, client, other = _host(), _host(), _host()
        async with AsyncExitStack() as stack:
            for host in (server, client, other):
                await stack.enter_async_context(host.run([multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")]))
            FreshDialAutoNAT(server, need_public=1)
            asker = AutoNATService(client, serve=False)
            await client.connect(PeerInfo(server.get_id(), server.get_addrs()))
            with trio.fail_after(30):
                status, _ = await asker.query_server(server.get_id(),
                                                     [a.to_bytes() for a in other.get_transport_addrs()])
            return status
    assert trio.run(run) == int(Message.E_DIAL_ERROR)


def test_verdicts_need_public_confirmations_and_ignore_lan_dialbacks() -> None:
    verdicts = Verdicts(need_public=3)
    assert verdicts.status() is Reachability.UNKNOWN
    verdicts.record("s1", "11.0.0.5")
    verdicts.record("s2", "11.0.0.5")
    assert verdicts.status() is Reachability.UNKNOWN  # 2 of 3 needed
    verdicts.record("s3", "192.168.1.2")  # a LAN peer reached us: proves nothing about the internet
    assert (verdicts.successes, verdicts.failures, verdicts.status()) == (2, 0, Reachability.UNKNOWN)
    verdicts.record("s3", "11.0.0.5")
    assert verdicts.status() is Reachability.PUBLIC
    for server in ("s4", "s5", "s6"):
        verdicts.record(server, None)
    assert (verdicts.successes, verdicts.failures, verdicts.status()) == (3, 3, Reachability.PRIVATE)
    behind_nat = Verdicts(need_public=1)
    behind_nat.record("s1", None)
    assert behind_nat.status() is Reachability.PRIVATE
    behind_nat.record("s1", "11.0.0.5")  # the latest answer of a server replaces its earlier one
    assert behind_nat.status() is Reachability.PUBLIC
    with pytest.raises(ValueError, match="need_public must be >= 1"):
        Verdicts(need_public=0)


def test_status_line_says_what_to_expect() -> None:
    verdicts = Verdicts(need_public=2)
    verdicts.record("s1", None)
    line = status_line(Reachability.PRIVATE, verdicts, ["/ip4/11.0.0.101/tcp/40000"],
                       ["/ip4/11.0.0.10/tcp/4001/p2p/R/p2p-circuit"])
    assert line == ("reachability: private, behind NAT or firewall (0 of 1 AutoNAT servers reached us by a fresh "
                    "dial; peers see us at /ip4/11.0.0.101/tcp/40000); reachable through relay at "
                    "/ip4/11.0.0.10/tcp/4001/p2p/R/p2p-circuit")
    assert status_line(Reachability.UNKNOWN, Verdicts(), [], []) == (
        "reachability: unknown so far (0 of 0 AutoNAT servers reached us by a fresh dial); a relay slot is reserved "
        "once a dial-back fails")


def test_rendezvous_key_addresses_and_summary() -> None:
    assert rendezvous_key("swarm/rollouts/1") == rendezvous_key("swarm/rollouts/1")
    assert len(rendezvous_key("x")) == 64 and rendezvous_key("x") != rendezvous_key("y")
    peer = "12D3KooWN55W8oiwMMfYnNDVeF6heDmdqhLd4RFgpWkGYt1gFyS1"
    loop_only = [multiaddr.Multiaddr(f"/ip4/127.0.0.1/tcp/4001/p2p/{peer}")]
    assert concrete_addrs(loop_only) == loop_only
    mixed = [multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/1"), multiaddr.Multiaddr("/ip4/11.0.0.5/tcp/1")]
    assert concrete_addrs(mixed) == [multiaddr.Multiaddr("/ip4/11.0.0.5/tcp/1")]
    summary = summarise({"reachability": "private", "line": "l", "reservations": ["/x/p2p-circuit"],
                         "relay_service": False, "relayed_bytes": 7, "relay_served_bytes": 0,
                         "paths": {"p1": "direct", "p2": "relay", "p3": "relay"}, "discovered": {"p2": "dht"},
                         "refused": {"dht_rate": 3, "relay_rate": 0}})
    assert summary == {"reachability": "private", "line": "l", "relay_reservations": ["/x/p2p-circuit"],
                       "relay_service": False, "relayed_bytes": 7, "relay_served_bytes": 0, "peers_direct": 1,
                       "peers_relayed": 2, "dht_discovered": 1, "refused": {"dht_rate": 3},
                       "peers": {"p1": {"path": "direct", "gossip": "unknown"},
                                 "p2": {"path": "relay", "gossip": "unknown"},
                                 "p3": {"path": "relay", "gossip": "unknown"}}}
