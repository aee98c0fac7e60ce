"""Per-peer direct/relayed reporting (issue 27): the host's `traffic` (paths.peer_traffic) and the /status summary
(nat_report.summarise), on stand-in connections: a peer counts as relayed while any connection to it is relayed."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import multiaddr
from libp2p.crypto.secp256k1 import create_new_key_pair
from libp2p.peer.id import ID

from swarm_node.transport.libp2p.paths import connection_paths, peer_traffic
from swarm_node.transport.nat_report import summarise

RELAY = "12D3KooWBzjhyq2tj3oM2YGnK2bhJkvcin8AKSuezbX3Jgdo91eZ"


def _peer() -> ID:
    return ID.from_pubkey(create_new_key_pair().public_key)


def _conn(relayed: bool, closed: bool = False) -> Any:
    addr = f"/ip4/11.0.0.10/tcp/4001/p2p/{RELAY}/p2p-circuit" if relayed else "/ip4/11.0.0.102/tcp/4001"
    return SimpleNamespace(muxed_conn=SimpleNamespace(is_closed=closed),
                           get_transport_addresses=lambda: [multiaddr.Multiaddr(addr)])


def _host(conns: dict[ID, list[Any]]) -> Any:
    return SimpleNamespace(get_network=lambda: SimpleNamespace(get_connections_map=lambda: conns))


def test_peer_traffic_counts_open_connections_and_names_the_one_gossip_runs_on() -> None:
    both, relayed_only, direct_only, reopening = _peer(), _peer(), _peer(), _peer()
    direct, relayed = _conn(False), _conn(True)
    host = _host({both: [direct, relayed], relayed_only: [_conn(True)],
                  direct_only: [_conn(False), _conn(True, closed=True)], reopening: [_conn(False)]})
    gossip = {both: SimpleNamespace(muxed_conn=relayed.muxed_conn), relayed_only: SimpleNamespace(muxed_conn=None),
              direct_only: SimpleNamespace(muxed_conn=host.get_network().get_connections_map()[direct_only][1]
                                           .muxed_conn)}
    traffic = peer_traffic(host, gossip)
    assert traffic == {
        both.to_base58(): {"direct": 1, "relayed": 1, "gossip": "relay", "path": "relay"},
        relayed_only.to_base58(): {"direct": 0, "relayed": 1, "gossip": "none", "path": "relay"},
        # our gossip stream still sits on the closed relayed connection: nothing reaches the peer through it
        direct_only.to_base58(): {"direct": 1, "relayed": 0, "gossip": "none", "path": "direct"},
        reopening.to_base58(): {"direct": 1, "relayed": 0, "gossip": "none", "path": "direct"},
    }
    # `paths` keeps its meaning (reachable directly if any connection is direct): what relays and AutoNAT use.
    assert connection_paths(host)[both.to_base58()] == "direct"


def test_the_status_summary_counts_a_peer_relayed_while_any_of_its_traffic_is() -> None:
    status = {"paths": {"p1": "direct", "p2": "direct", "p3": "relay"},
              "traffic": {"p1": {"direct": 1, "relayed": 0, "gossip": "direct", "path": "direct"},
                          "p2": {"direct": 1, "relayed": 1, "gossip": "relay", "path": "relay"},
                          "p3": {"direct": 0, "relayed": 1, "gossip": "relay", "path": "relay"}}}
    summary = summarise(status)
    assert (summary["peers_direct"], summary["peers_relayed"]) == (1, 2)
    assert summary["peers"] == {"p1": {"path": "direct", "gossip": "direct"},
                                "p2": {"path": "relay", "gossip": "relay"},
                                "p3": {"path": "relay", "gossip": "relay"}}
    without = summarise({"paths": {"p1": "direct", "p3": "relay"}})  # a host that reports no traffic
    assert (without["peers_direct"], without["peers_relayed"]) == (1, 1)
    assert without["peers"] == {"p1": {"path": "direct", "gossip": "unknown"},
                                "p3": {"path": "relay", "gossip": "unknown"}}
