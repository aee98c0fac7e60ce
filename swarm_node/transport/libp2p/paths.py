"""How the network host reaches its peers: direct or relayed connections, and the addresses it can advertise.

Contract (pure functions of a py-libp2p host, no I/O): `concrete_addrs` turns listen addresses into dialable ones;
`is_relayed(conn)` says whether a connection runs through a circuit relay; `connection_paths(host)` maps each
connected peer to "direct" (reachable directly: any connection is) or "relay"; `peer_traffic(host, gossip_streams)`
tells per peer how many open direct and relayed connections it has, which one our gossip stream to it runs on,
and "relay" while any of its traffic may be relayed (what /status reports); `direct_peers(host)` lists the peers
with a direct connection; `relay_candidates(host)` those of them that serve the circuit relay HOP protocol
(identify told us); `relays_in_use(host, inbound_relays)` names the relay carrying each peer we reach only through one.
"""

from __future__ import annotations

from typing import Any

import multiaddr
from libp2p.peer.id import ID
from libp2p.relay.circuit_v2 import PROTOCOL_ID as HOP_PROTOCOL_ID
from libp2p.utils.address_validation import expand_wildcard_address


def concrete_addrs(addrs: list[multiaddr.Multiaddr]) -> list[multiaddr.Multiaddr]:
    """What peers can dial: a wildcard listen address (0.0.0.0) becomes this machine's interface addresses, and
    loopback is dropped whenever there is anything else (a peer elsewhere would dial itself)."""
    out: list[multiaddr.Multiaddr] = []
    for addr in addrs:
        text = str(addr)
        if text.startswith(("/ip4/0.0.0.0/", "/ip6/::/")):
            base = text.split("/p2p/")[0]
            out += [multiaddr.Multiaddr(f"{a}{text[len(base):]}")
                    for a in expand_wildcard_address(multiaddr.Multiaddr(base))]
        else:
            out.append(addr)
    other = [a for a in out if not str(a).startswith(("/ip4/127.", "/ip6/::1/"))]
    return list(dict.fromkeys(other or out))


def is_relayed(conn: Any) -> bool:
    try:
        return any("p2p-circuit" in str(a) for a in conn.get_transport_addresses())
    except Exception:  # a connection without transport info is a direct TCP one here
        return False


def _connections(host: Any) -> list[tuple[ID, list[Any]]]:
    """(peer, its connections) for every connected peer (the library maps a peer to one connection or a list)."""
    return [(peer, conns if isinstance(conns, list) else [conns])
            for peer, conns in host.get_network().get_connections_map().items()]


def connection_paths(host: Any) -> dict[str, str]:
    """peer id -> "direct" if any connection to it is direct, else "relay"."""
    return {peer.to_base58(): "direct" if any(not is_relayed(c) for c in conns) else "relay"
            for peer, conns in _connections(host)}


def _muxed_closed(conn: Any) -> bool:
    muxed = getattr(conn, "muxed_conn", None)
    return bool(getattr(muxed, "is_closed", False))


def peer_traffic(host: Any, gossip_streams: dict[ID, Any]) -> dict[str, dict[str, Any]]:
    """peer id -> {"direct": open direct connections, "relayed": open relayed connections, "gossip": "direct" |
    "relay" | "none" (the connection our gossip stream to it runs on), "path": "relay" while any connection to it is
    relayed (some of its traffic may be), else "direct"}. `gossip_streams`: pubsub's outbound stream per peer."""
    out: dict[str, dict[str, Any]] = {}
    for peer, conns in _connections(host):
        open_conns = [c for c in conns if not _muxed_closed(c)]
        relayed = sum(1 for c in open_conns if is_relayed(c))
        stream = gossip_streams.get(peer)
        muxed = getattr(stream, "muxed_conn", None)
        carrier = next((c for c in conns if getattr(c, "muxed_conn", None) is muxed), None) if muxed else None
        gossip = "none" if carrier is None or _muxed_closed(carrier) else "relay" if is_relayed(carrier) else "direct"
        out[peer.to_base58()] = {"direct": len(open_conns) - relayed, "relayed": relayed, "gossip": gossip,
                                 "path": "relay" if relayed else "direct"}
    return out


def direct_peers(host: Any) -> list[ID]:
    paths = connection_paths(host)
    return [p for p in host.get_connected_peers() if paths.get(p.to_base58()) == "direct"]


def relay_candidates(host: Any) -> list[ID]:
    store = host.get_peerstore()
    out = []
    for peer in direct_peers(host):
        try:
            if store.supports_protocols(peer, [HOP_PROTOCOL_ID]):
                out.append(peer)
        except Exception:  # no protocols recorded yet (identify pending)
            continue
    return out


def relays_in_use(host: Any, inbound_relays: dict[ID, ID]) -> dict[str, str]:
    """peer id -> the relay carrying our connection to it, for peers we reach only through a relay.
    `inbound_relays`: for a connection relayed to us, the relay it came through (see CountingRelayProtocol)."""
    out: dict[str, str] = {}
    me = host.get_id().to_base58()
    for peer, conns in _connections(host):
        if any(not is_relayed(c) for c in conns):
            continue
        for conn in conns:
            for addr in conn.get_transport_addresses():
                parts = str(addr).split("/")
                if "p2p-circuit" in parts and parts.index("p2p-circuit") >= 2:
                    relay = parts[parts.index("p2p-circuit") - 1]
                    if relay == me:  # an incoming relayed connection: our own id stands where the relay's would
                        inbound = inbound_relays.get(peer)
                        relay = inbound.to_base58() if inbound is not None else "unknown"
                    out[peer.to_base58()] = relay
    return out
