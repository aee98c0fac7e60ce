"""Telling the user how peers reach us: the network host's NAT view, polled, logged once per change, summarised.

Contract: `summarise(status)` turns a `LibP2PTransport.nat_status()` dict into the small JSON-ready summary that
/status shows under "network": reachability (public | private | unknown), its one-line explanation, our relay
reservations, relayed bytes (ours, and what we relayed for others), how many peers we reach directly or through a
relay (a peer counts as relayed while any connection to it is relayed, even beside a direct one), per peer
"peers": {peer: {"path": "direct" | "relay", "gossip": the path our gossip to it takes, "direct" | "relay" | "none"}},
the DHT and relay requests refused from peers by reason (flood budgets, bounded records: only the nonzero
counts), and the UPnP attempt when the host reports one ("upnp": state, line, external_addr; libp2p/upnp.py).
`watch_nat(transport, on_change, interval_s)` polls the transport (any transport with an async `nat_status()`), logs
the reachability line at WARNING (the user-facing level of `join`) each time it changes, the first time included,
and the UPnP line once it has an outcome and whenever it changes, and calls `on_change(summary)` on every poll. A
host that is down (restarting) is skipped quietly.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from swarm_node.transport.base import TransportError

log = logging.getLogger(__name__)

UPNP_PENDING = ("off", "trying")  # no outcome to tell the user yet (off: they chose it)


def peer_paths(status: dict[str, Any]) -> dict[str, str]:
    """peer id -> "relay" while any of its traffic may go through a relay (any open relayed connection to it, even
    beside a direct one), else "direct". From the host's per-peer "traffic"; a host that reports only "paths"
    (direct if any connection is) is taken at its word."""
    traffic = status.get("traffic")
    if traffic is None:
        return dict(status.get("paths", {}))
    return {peer: "relay" if int(row.get("relayed", 0)) else "direct" for peer, row in traffic.items()}


def summarise(status: dict[str, Any]) -> dict[str, Any]:
    peers = peer_paths(status)
    paths = list(peers.values())
    upnp = {"upnp": dict(status["upnp"])} if "upnp" in status else {}
    return {
        "reachability": status.get("reachability", "unknown"),
        "line": status.get("line", ""),
        "relay_reservations": list(status.get("reservations", [])),
        "relay_service": bool(status.get("relay_service", False)),
        "relayed_bytes": int(status.get("relayed_bytes", 0)),
        "relay_served_bytes": int(status.get("relay_served_bytes", 0)),
        "peers_direct": paths.count("direct"),
        "peers_relayed": paths.count("relay"),
        "peers": {peer: {"path": path, "gossip": status.get("traffic", {}).get(peer, {}).get("gossip", "unknown")}
                  for peer, path in sorted(peers.items())},
        "dht_discovered": len(status.get("discovered", {})),
        "refused": {why: int(n) for why, n in status.get("refused", {}).items() if n},
        **upnp,
    }


async def watch_nat(transport: Any, on_change: Callable[[dict[str, Any]], None] | None = None,
                    interval_s: float = 5.0) -> None:
    last_line = last_upnp = None
    while True:
        try:
            summary = summarise(await transport.nat_status())
        except TransportError:
            summary = None
        if summary is not None:
            if summary["line"] != last_line:
                log.warning("%s", summary["line"])
                last_line = summary["line"]
            upnp = summary.get("upnp", {"state": "off"})
            if upnp["state"] not in UPNP_PENDING and upnp["line"] != last_upnp:
                log.warning("%s", upnp["line"])
                last_upnp = upnp["line"]
            if on_change is not None:
                on_change(summary)
        await asyncio.sleep(interval_s)
