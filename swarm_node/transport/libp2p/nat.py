"""Reaching peers as libp2p does, inside the network host: Kademlia rendezvous, AutoNAT, circuit relays.

Contract (trio, runs in the network host; `NatServices(host, settings, counters)` then `await run()` in the host's
nursery, `status()` for the NAT_STATUS call):
- Discovery: a Kademlia DHT (`/ipfs/kad/1.0.0`, libp2p.kad_dht) on every node with a rendezvous, and a
  rendezvous round every `dht_interval_s` (`rendezvous.Rendezvous`: look up, dial and announce the providers of the
  swarm's key). Which peers we reach directly or through a relay: `paths.py`.
- UPnP first (with `settings.upnp`): `upnp.PortMapper` asks the router to forward our TCP listen port; its
  mapped address comes first in what we advertise, and the first AutoNAT round waits for its outcome (at most
  upnp.BUDGET_S), so a mapped port is judged public from the first answers on.
- Reachability: `autonat.FreshDialAutoNAT` asks connected peers (over direct connections only) to dial us
  back; `reachability.Verdicts` turns the answers into public / private / unknown. One log line at each change.
- Relays: with relay_service "on", or "auto" once we are public, we serve HOP with the configured limits. Once
  private we keep a reservation on up to `relay_reservations` relays (peers that list the HOP protocol),
  advertise our circuit addresses (in identify and DHT provider records), and on a refused or lost reservation
  log it and try the next relay. As a relay, floods of RESERVE and CONNECT are refused (`relay.py`);
  `status()["refused"]` counts what both refused, by reason.
- Bulk over relays: an incoming stream of a `no_relay_protocols` protocol (policy-delta chunks) over a relayed
  connection is refused (`refuses`): a node reachable only through a relay serves no chunks through it.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

import multiaddr
import trio
from libp2p.peer.id import ID
from libp2p.relay.circuit_v2 import DCUtRProtocol
from libp2p.relay.circuit_v2.resources import RelayLimits
from libp2p.tools.anyio_service import background_trio_service

from swarm_node.transport.libp2p.autonat import FreshDialAutoNAT
from swarm_node.transport.libp2p.dht import REFUSALS as DHT_REFUSALS
from swarm_node.transport.libp2p.dht import GuardedKadDHT
from swarm_node.transport.libp2p.ipc import HostSettings
from swarm_node.transport.libp2p.paths import (
    concrete_addrs,
    connection_paths,
    direct_peers,
    is_relayed,
    relay_candidates,
    relays_in_use,
)
from swarm_node.transport.libp2p.relay import HOP_REFUSALS, CountingRelayProtocol, RelayClient
from swarm_node.transport.libp2p.rendezvous import Rendezvous
from swarm_node.transport.libp2p.upnp import OFF, PortMapper, mappable_port
from swarm_node.transport.reachability import Reachability, status_line
from swarm_node.transport.shaping import RequestBudget

log = logging.getLogger(__name__)


class NatServices:
    def __init__(self, host: Any, settings: HostSettings, counters: Counter[str]) -> None:
        self.host, self.settings, self.counters = host, settings, counters
        self.autonat = FreshDialAutoNAT(host, settings.autonat_confirmations)
        limits = RelayLimits(duration=settings.relay_circuit_s, data=settings.relay_circuit_bytes,
                             max_circuit_conns=settings.relay_max_circuits,
                             max_reservations=settings.relay_max_reservations)
        hop_budget = RequestBudget(settings.relay_peer_rate, settings.relay_peer_burst, settings.relay_total_rate,
                                   settings.relay_total_burst)
        self.relay_protocol = CountingRelayProtocol(host, limits, counters, hop_budget,
                                                    settings.relay_max_circuits_total)
        self.relays = RelayClient(host, self.relay_protocol, counters)
        self.dht = GuardedKadDHT(host, settings, counters) if settings.rendezvous else None
        self.rendezvous = (Rendezvous(host, settings, counters, self.dht, self.relays) if self.dht is not None
                           else None)
        self.dcutr = DCUtRProtocol(host) if settings.hole_punch else None
        self.upnp = PortMapper() if settings.upnp else None
        self.status_value = Reachability.UNKNOWN
        self.line = status_line(self.status_value, self.autonat.verdicts, [], [])
        self._extend_advertised_addrs()

    def _extend_advertised_addrs(self) -> None:
        """Put our UPnP-mapped address first and append our circuit addresses to what the host advertises. (The
        library's addrs_factory cannot carry circuits: get_addrs strips everything from the first /p2p/
        component, i.e. the relay's id, onwards.)"""
        original = self.host.get_addrs
        me = self.host.get_id().to_base58()

        def get_addrs() -> list[multiaddr.Multiaddr]:
            mapped = self.upnp.outcome.external_addr if self.upnp is not None else ""
            upnp = [multiaddr.Multiaddr(f"{mapped}/p2p/{me}")] if mapped else []
            circuits = [multiaddr.Multiaddr(f"{c}/p2p/{me}") for c in self.relays.circuit_addrs()]
            return list(dict.fromkeys([*upnp, *concrete_addrs(original()), *circuits]))

        self.host.get_addrs = get_addrs

    async def run(self) -> None:
        """Run until cancelled. A failure in here is logged and counted, never raised: gossip and streams go on
        without NAT traversal rather than the host dying with it."""
        try:
            async with background_trio_service(self.relay_protocol), trio.open_nursery() as nursery:
                if self.upnp is not None:
                    port = mappable_port([str(a) for a in self.host.get_transport_addrs()])
                    nursery.start_soon(self.upnp.run, port)
                if self.dcutr is not None:
                    nursery.start_soon(self._run_dcutr)
                if self.settings.relay_service == "on":
                    self.relay_protocol.enable_hop()
                if self.rendezvous is not None:
                    nursery.start_soon(self.rendezvous.run)
                nursery.start_soon(self._reachability_loop, nursery)
        except Exception:  # py-libp2p's DHT/relay code raising: keep the host, report it
            log.error("NAT traversal services failed; continuing without them", exc_info=True)
            self.counters["nat_services_failed"] += 1
            self.line = "reachability: unknown (NAT traversal services failed; see the network host's log)"

    async def _run_dcutr(self) -> None:
        assert self.dcutr is not None
        async with background_trio_service(self.dcutr):
            await trio.sleep_forever()

    # -- connections ----------------------------------------------------------------------------------------
    def paths(self) -> dict[str, str]:
        """peer id -> "direct" if any connection to it is direct, else "relay"."""
        return connection_paths(self.host)

    def relays_in_use(self) -> dict[str, str]:
        """peer id -> the relay carrying our connection to it, for peers we reach only through a relay."""
        return relays_in_use(self.host, self.relay_protocol.inbound_relays)

    def refuses(self, stream: Any) -> bool:
        """True for an incoming stream of a `no_relay_protocols` protocol that arrived over a relayed connection
        (counted in counters["relayed_stream_refused"])."""
        if str(stream.get_protocol()) not in self.settings.no_relay_protocols:
            return False
        muxed = stream.muxed_conn
        conns = self.host.get_network().get_connections(muxed.peer_id)
        relayed = any(getattr(c, "muxed_conn", None) is muxed and is_relayed(c) for c in conns)
        self.counters["relayed_stream_refused" if relayed else "no_relay_streams_served"] += 1
        return relayed

    # -- reachability and relays ----------------------------------------------------------------------------
    async def _reachability_loop(self, nursery: trio.Nursery) -> None:
        if self.upnp is not None:
            # UPnP first: asked before the port is mapped, AutoNAT's servers would fail to dial us, we would call
            # ourselves private and reserve a relay we do not need. PortMapper settles within its budget.
            await self.upnp.settled.wait()
        while True:
            peers = direct_peers(self.host)
            async with trio.open_nursery() as asks:
                for peer in peers[:8]:
                    asks.start_soon(self.autonat.ask, peer)
            self._update_status()
            # Reserve once a fresh dial-back has failed (one failure is enough: the cheap mistake), not while
            # unknown: a public node that reserved early would advertise circuits and be dialled through a relay.
            if self.status_value is Reachability.PRIVATE:
                await self._keep_reservations(nursery)
            elif self.relays.reservations:
                for relay in list(self.relays.reservations):  # dialable directly now: stop advertising circuits
                    self.relays.drop(relay)
            self._update_status()
            settled = self.status_value is not Reachability.UNKNOWN
            await trio.sleep(self.settings.autonat_interval_s * (6 if settled else 1))

    def _update_status(self) -> None:
        status = self.autonat.verdicts.status()
        if status is Reachability.PUBLIC and self.settings.relay_service == "auto":
            self.relay_protocol.enable_hop()
        self.status_value = status
        line = status_line(status, self.autonat.verdicts, self.autonat.observed_addrs(),
                           [str(c) for c in self.relays.circuit_addrs()])
        if line != self.line:
            log.info("%s", line)  # the node logs it for the user (nat_report, through nat_status)
            self.line = line

    def _relay_candidates(self) -> list[ID]:
        return relay_candidates(self.host)

    async def _keep_reservations(self, nursery: trio.Nursery) -> None:
        connected = set(self.host.get_connected_peers())
        for relay in list(self.relays.reservations):
            if relay not in connected:
                log.warning("relay %s went away; reserving on another", relay)
            elif relay not in self.relays.transport._reservations:
                # The library forgets a reservation once it expired with its refreshes refused (a relay that
                # dropped it, or restarted behind the same connection): our circuit address through it is dead.
                log.warning("relay %s dropped our reservation; reserving on another", relay)
            else:
                continue
            self.counters["relay_lost"] += 1
            self.relays.drop(relay)
        for relay in self._relay_candidates():
            if len(self.relays.reservations) >= self.settings.relay_reservations:
                break
            if relay in self.relays.reservations:
                continue
            circuit = await self.relays.reserve(relay, nursery)
            if circuit is None:
                log.warning("relay %s refused a reservation; trying the next one", relay)
                self.counters["relay_refused"] += 1
            else:
                log.warning("reserved a slot on relay %s: reachable at %s/p2p/%s", relay, circuit,
                            self.host.get_id())

    # -- discovery ------------------------------------------------------------------------------------------
    # -- status ---------------------------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        verdicts = self.autonat.verdicts
        return {
            "reachability": self.status_value.value,
            "line": self.line,
            "autonat": {"reached": verdicts.successes, "failed": verdicts.failures,
                        "need_public": verdicts.need_public, "dialbacks_served": self.autonat.dialbacks_served,
                        "dialbacks_refused": self.autonat.refused_rate},
            "observed_addrs": self.autonat.observed_addrs(),
            "advertised": [str(a) for a in self.host.get_addrs()],
            "upnp": (self.upnp.outcome if self.upnp is not None else OFF).status(),
            "relay_service": self.relay_protocol.allow_hop,
            "reservations": [str(c) for c in self.relays.circuit_addrs()],
            "relayed_bytes": self.counters["relayed_bytes"],
            "relay_served_bytes": self.counters["relay_served_bytes"],
            "relayed_streams_refused": self.counters["relayed_stream_refused"],
            "no_relay_streams_served": self.counters["no_relay_streams_served"],
            "dht_peers": self.dht.get_routing_table_size() if self.dht is not None else 0,
            # requests refused before py-libp2p saw them (dht.py, relay.py; docs/NAT.md "Floods")
            "refused": {**{f"dht_{why}": self.counters[f"dht_refused_{why}"] for why in DHT_REFUSALS},
                        **{f"hop_{why}": self.counters[f"hop_refused_{why}"] for why in HOP_REFUSALS}},
            "discovered": dict(self.rendezvous.discovered) if self.rendezvous is not None else {},
            "paths": self.paths(),
            "relays_in_use": self.relays_in_use(),
            "hole_punched": sorted(p.to_base58() for p in self.dcutr._direct_connections) if self.dcutr else [],
            "hole_punch_attempts": ({p.to_base58(): n for p, n in self.dcutr._hole_punch_attempts.items()}
                                    if self.dcutr else {}),
            "hole_punching": sorted(p.to_base58() for p in self.dcutr._in_progress) if self.dcutr else [],
        }
