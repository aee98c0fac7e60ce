"""A NAT-test node that may listen on QUIC, for the experiment tests/netns/quic_punch.py: tests/libp2p_helpers/
nat_node.py's commands, with several --listen addresses and the network host on a trio thread in this process, so
that py-libp2p's DCUtR and QUIC loggers can be written to --log-file (the process isolation would give them to the
host child's own logging). QUIC is enabled here only, by patching our host in this process: it hands py-libp2p its
listen addresses, so that the library builds a QUIC transport for a .../quic-v1 one (our host builds TCP alone, as
docs/NAT.md decides). --quic-relay lets RelayClient reserve on a relay it reaches over QUIC (ours looks for a TCP
address of the relay); --force-private and --announce: see quic_punch.

Events and commands: as nat_node ("ready", nat, echo, publish, stats, quit), plus conns -> "conns" {conns:
{peer id: [[transport address, muxer type name], ...]}}: every connection the host holds, with the address it
runs over (".../udp/.../quic-v1" for QUIC, ".../p2p-circuit/..." for a relayed one).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import logging
import sys
from typing import Any

import multiaddr

from bench.child import emit, serve
from swarm_node.identity import generate
from swarm_node.transport.base import Delivery
from swarm_node.transport.libp2p import host as host_module
from swarm_node.transport.libp2p.ipc import HostSettings
from swarm_node.transport.libp2p.launch import LibP2PConfig
from swarm_node.transport.libp2p.relay import RelayClient
from swarm_node.transport.libp2p.transport import LibP2PTransport
from swarm_node.transport.reachability import Reachability, Verdicts
from swarm_node.transport.supervisor import Backoff
from tests.libp2p_helpers.nat_node import ECHO, keep_bootstrap, node_commands, serve_echo
from tests.libp2p_helpers.rollouts import TOPIC, group_ids, protocol_validator

DEBUG_LOGGERS = ("libp2p.relay.circuit_v2.dcutr", "libp2p.transport.quic", "swarm_node.transport",
                 "libp2p.host.observed_addr_manager", "libp2p.identity.identify")
HOSTS: list[host_module.NetworkHost] = []  # the network hosts started in this process (thread isolation)
_host_init = host_module.NetworkHost.__init__


def _record_host(self: host_module.NetworkHost, key_pair: Any, settings: HostSettings) -> None:
    """NetworkHost.__init__ with py-libp2p's transports built from the listen addresses (QUIC for .../quic-v1; our
    host builds TCP only), and the host recorded in HOSTS."""
    listen = [multiaddr.Multiaddr(a) for a in settings.listen]
    real = host_module.new_host
    host_module.new_host = lambda **kw: real(listen_addrs=listen, **kw)  # type: ignore[assignment]
    try:
        _host_init(self, key_pair, settings)
    finally:
        host_module.new_host = real
    HOSTS.append(self)


host_module.NetworkHost.__init__ = _record_host  # type: ignore[method-assign]


def _relay_addr(self: RelayClient, relay: Any) -> multiaddr.Multiaddr | None:
    """RelayClient.relay_addr, taking a QUIC address of the relay too (ours takes TCP only)."""
    try:
        addrs = self.host.get_peerstore().addrs(relay)
    except Exception:  # no address for that peer
        return None
    for addr in addrs:
        text = str(addr)
        if ("/tcp/" in text or "/quic-v1" in text) and "p2p-circuit" not in text and "/ip4/0.0.0.0/" not in text:
            return multiaddr.Multiaddr(f"{text.split('/p2p/')[0]}/p2p/{relay.to_base58()}")
    return None


def _connections() -> dict[str, list[list[str]]]:
    """Read from the asyncio thread while the host's trio thread may change the dict: retried if it does."""
    if not HOSTS:
        return {}
    host = HOSTS[-1].host
    for _ in range(5):
        try:
            out: dict[str, list[list[str]]] = {}
            for peer, conns in list(host.get_network().get_connections_map().items()):
                conns = conns if isinstance(conns, list) else [conns]
                out[peer.to_base58()] = [[str(a) for a in c.get_transport_addresses()][:1] +
                                         [type(getattr(c, "muxed_conn", c)).__name__] for c in conns]
            return out
        except RuntimeError:  # dictionary changed size during iteration
            continue
    return {}


async def main(args: argparse.Namespace) -> None:
    if args.quic_relay:
        RelayClient.relay_addr = _relay_addr  # type: ignore[method-assign]
    if args.force_private:
        # What AutoNAT concludes behind a NAT, given without asking: our AutoNAT dials back TCP addresses only, so
        # a node that listens on QUIC alone would stay "unknown" and never reserve a relay slot.
        Verdicts.status = lambda self: Reachability.PRIVATE  # type: ignore[method-assign]
    settings = HostSettings(listen=tuple(args.listen), announce=tuple(args.announce), rendezvous=TOPIC,
                            relay_service=args.relay, dht_interval_s=2.0, autonat_interval_s=2.0,
                            autonat_confirmations=args.confirmations, hole_punch=not args.no_hole_punch)
    transport = LibP2PTransport(generate(), LibP2PConfig(host=settings, isolation="thread",
                                                         restart=Backoff(initial_s=0.2)))
    delivered: dict[str, list[str]] = {}

    def on_delivery(delivery: Delivery) -> None:
        delivered.setdefault(delivery.from_peer, []).extend(g.hex() for g in group_ids(delivery.data))

    transport.set_validator(TOPIC, protocol_validator())
    await transport.subscribe(TOPIC, on_delivery)
    await transport.serve_stream(ECHO, serve_echo)
    await transport.start()
    tasks = [asyncio.ensure_future(keep_bootstrap(transport, args.bootstrap))] if args.bootstrap else []
    emit(event="ready", peer_id=transport.peer_id, addrs=transport.listen_addrs())

    async def conns(_cmd: dict[str, Any]) -> dict[str, Any]:
        return {"event": "conns", "conns": _connections()}

    async def stats(_cmd: dict[str, Any]) -> dict[str, Any]:
        return {"event": "stats", "delivered": delivered, "peers": [p.peer_id for p in await transport.peers()]}
    await serve({**node_commands(transport, itertools.count(1)), "conns": conns, "stats": stats})
    for task in tasks:
        task.cancel()
    await transport.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--listen", action="append", required=True)
    parser.add_argument("--bootstrap", default="")
    parser.add_argument("--relay", default="auto")
    parser.add_argument("--confirmations", type=int, default=1)
    parser.add_argument("--announce", action="append", default=[])
    parser.add_argument("--force-private", action="store_true")
    parser.add_argument("--quic-relay", action="store_true", help="reserve on a relay reached over QUIC")
    parser.add_argument("--no-hole-punch", action="store_true")
    parser.add_argument("--log-file", default="")
    cli = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    if cli.log_file:
        handler = logging.FileHandler(cli.log_file)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        for name in DEBUG_LOGGERS:
            logger = logging.getLogger(name)
            logger.setLevel(logging.DEBUG)
            logger.addHandler(handler)
    asyncio.run(main(cli))
