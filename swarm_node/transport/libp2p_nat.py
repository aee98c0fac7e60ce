"""Reaching peers as libp2p does, inside the network host: Kademlia rendezvous, AutoNAT, circuit relays.

Contract (trio, runs in the network host; `NatServices(host, settings, counters)` then `await run()` in the host's
nursery, `status()` for the NAT_STATUS call):
- Discovery: a Kademlia DHT (`/ipfs/kad/1.0.0`, libp2p.kad_dht) on every node. Every `dht_interval_s` the node
  adds its connected peers to its routing table, looks up the providers of the rendezvous key (the swarm's topic)
  at the closest peers it is connected to, dials those it is not connected to (through the relay named in their
  /p2p-circuit address first), then announces itself to the same peers (ADD_PROVIDER). The library's own
  `find_providers`/`provide` are not used (docs/NAT.md says why). `discovered` says who was found through the DHT.
  What peers ask of our DHT server is budgeted and its stores bounded (`libp2p_dht.GuardedKadDHT`).
- UPnP first (with `settings.upnp`): `libp2p_upnp.PortMapper` asks the router to forward our TCP listen port; its
  mapped address comes first in what we advertise, and the first AutoNAT round waits for its outcome (at most
  libp2p_upnp.BUDGET_S), so a mapped port is judged public from the first answers on.
- Reachability: `libp2p_autonat.FreshDialAutoNAT` asks connected peers (over direct connections only) to dial us
  back; `reachability.Verdicts` turns the answers into public / private / unknown. One log line at each change.
- Relays: with relay_service "on", or "auto" once we are public, we serve HOP with the configured limits. Once
  private we keep a reservation on up to `relay_reservations` relays (peers that list the HOP protocol),
  advertise our circuit addresses (in identify and DHT provider records), and on a refused or lost reservation
  log it and try the next relay. As a relay, floods of RESERVE and CONNECT are refused (`libp2p_relay`);
  `status()["refused"]` counts what both refused, by reason.
- Bulk over relays: an incoming stream of a `no_relay_protocols` protocol (policy-delta chunks) over a relayed
  connection is refused (`refuses`): a node reachable only through a relay serves no chunks through it.
"""

from __future__ import annotations

import hashlib
import logging
from collections import Counter
from typing import Any

import multiaddr
import trio
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo
from libp2p.relay.circuit_v2 import PROTOCOL_ID as HOP_PROTOCOL_ID
from libp2p.relay.circuit_v2 import DCUtRProtocol
from libp2p.relay.circuit_v2.resources import RelayLimits
from libp2p.tools.anyio_service import background_trio_service
from libp2p.utils.address_validation import expand_wildcard_address

from swarm_node.transport.libp2p_autonat import FreshDialAutoNAT
from swarm_node.transport.libp2p_dht import REFUSALS as DHT_REFUSALS
from swarm_node.transport.libp2p_dht import GuardedKadDHT
from swarm_node.transport.libp2p_ipc import HostSettings
from swarm_node.transport.libp2p_relay import HOP_REFUSALS, CountingRelayProtocol, RelayClient
from swarm_node.transport.libp2p_upnp import OFF, PortMapper, mappable_port
from swarm_node.transport.reachability import Reachability, status_line
from swarm_node.transport.shaping import RequestBudget

log = logging.getLogger(__name__)

MAX_PROVIDERS = 20  # providers taken from one lookup (the DHT answer is untrusted: bounded)


def rendezvous_key(name: str) -> str:
    """The DHT key a swarm meets at: hex of sha256("swarm-node/rendezvous/" + name)."""
    return hashlib.sha256(f"swarm-node/rendezvous/{name}".encode()).hexdigest()


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


def _merge(found: dict[ID, PeerInfo], info: PeerInfo) -> None:
    """Add a provider record, uniting its addresses with what other peers said (records may be stale: one taken
    before the provider had a relay reservation lacks its /p2p-circuit address). At most 16 addresses a peer."""
    old = found.get(info.peer_id)
    addrs = list(dict.fromkeys([*(old.addrs if old else []), *info.addrs]))[:16]
    found[info.peer_id] = PeerInfo(info.peer_id, addrs)


def _is_relayed(conn: Any) -> bool:
    try:
        return any("p2p-circuit" in str(a) for a in conn.get_transport_addresses())
    except Exception:  # a connection without transport info is a direct TCP one here
        return False


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
        self.dcutr = DCUtRProtocol(host) if settings.hole_punch else None
        self.key = rendezvous_key(settings.rendezvous) if settings.rendezvous else ""
        self.upnp = PortMapper() if settings.upnp else None
        self.discovered: dict[str, str] = {}  # peer id -> how we learnt of it ("dht")
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
                if self.dht is not None:
                    nursery.start_soon(self._run_dht, nursery)
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
        out: dict[str, str] = {}
        for peer, conns in self.host.get_network().get_connections_map().items():
            conns = conns if isinstance(conns, list) else [conns]
            direct = any(not _is_relayed(c) for c in conns)
            out[peer.to_base58()] = "direct" if direct else "relay"
        return out

    def relays_in_use(self) -> dict[str, str]:
        """peer id -> the relay carrying our connection to it, for peers we reach only through a relay."""
        out: dict[str, str] = {}
        me = self.host.get_id().to_base58()
        for peer, conns in self.host.get_network().get_connections_map().items():
            conns = conns if isinstance(conns, list) else [conns]
            if any(not _is_relayed(c) for c in conns):
                continue
            for conn in conns:
                for addr in conn.get_transport_addresses():
                    parts = str(addr).split("/")
                    if "p2p-circuit" in parts and parts.index("p2p-circuit") >= 2:
                        relay = parts[parts.index("p2p-circuit") - 1]
                        if relay == me:  # an incoming relayed connection (see CountingRelayProtocol)
                            inbound = self.relay_protocol.inbound_relays.get(peer)
                            relay = inbound.to_base58() if inbound is not None else "unknown"
                        out[peer.to_base58()] = relay
        return out

    def refuses(self, stream: Any) -> bool:
        """True for an incoming stream of a `no_relay_protocols` protocol that arrived over a relayed connection
        (counted in counters["relayed_stream_refused"])."""
        if str(stream.get_protocol()) not in self.settings.no_relay_protocols:
            return False
        muxed = stream.muxed_conn
        conns = self.host.get_network().get_connections(muxed.peer_id)
        relayed = any(getattr(c, "muxed_conn", None) is muxed and _is_relayed(c) for c in conns)
        self.counters["relayed_stream_refused" if relayed else "no_relay_streams_served"] += 1
        return relayed

    def _direct_peers(self) -> list[ID]:
        paths = self.paths()
        return [p for p in self.host.get_connected_peers() if paths.get(p.to_base58()) == "direct"]

    # -- reachability and relays ----------------------------------------------------------------------------
    async def _reachability_loop(self, nursery: trio.Nursery) -> None:
        if self.upnp is not None:
            # UPnP first: asked before the port is mapped, AutoNAT's servers would fail to dial us, we would call
            # ourselves private and reserve a relay we do not need. PortMapper settles within its budget.
            await self.upnp.settled.wait()
        while True:
            peers = self._direct_peers()
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
        store = self.host.get_peerstore()
        out = []
        for peer in self._direct_peers():
            try:
                if store.supports_protocols(peer, [HOP_PROTOCOL_ID]):
                    out.append(peer)
            except Exception:  # no protocols recorded yet (identify pending)
                continue
        return out

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
    async def _run_dht(self, nursery: trio.Nursery) -> None:
        assert self.dht is not None
        async with background_trio_service(self.dht):
            while True:
                await self._rendezvous_round()
                await trio.sleep(self.settings.dht_interval_s)

    async def _rendezvous_round(self) -> None:
        """Look up the other providers first, then announce ourselves; each step bounded in time (a lookup can
        stall on peers whose advertised addresses cannot be dialled from here)."""
        assert self.dht is not None
        for peer in self._direct_peers():
            try:
                await self.dht.add_peer(peer)
            except Exception as exc:  # not a DHT server (yet): skipped
                log.debug("routing table refused %s: %s", peer, exc)
        budget = self.settings.dht_interval_s * 4
        providers: list[PeerInfo] = []
        with trio.move_on_after(budget):
            try:
                providers = await self._find_providers()
            except Exception as exc:  # a lookup that fails this round is retried next round
                log.info("DHT lookup failed: %s", exc)
        self.counters["dht_lookups"] += 1
        me = self.host.get_id()
        connected = set(self.host.get_connected_peers())
        for info in providers:
            if info.peer_id == me:
                continue
            self.discovered.setdefault(info.peer_id.to_base58(), "dht")
            if info.peer_id not in connected:
                await self._dial_provider(info)
        with trio.move_on_after(budget):
            try:
                self.counters["dht_provided_to"] += await self._provide()
            except Exception as exc:  # retried next round
                log.info("DHT provide failed: %s", exc)

    def _closest_connected(self, key: bytes) -> list[ID]:
        """The closest peers to `key` that we know and hold a direct connection to, closest first, then the rest of
        our direct peers. (The library's iterative walk dials peers at the private addresses they advertise and
        waits out a connect timeout on each: measured, it never finished within a round behind NAT.)"""
        assert self.dht is not None
        connected = set(self._direct_peers())
        near = self.dht.routing_table.find_local_closest_peers(key, MAX_PROVIDERS)
        return [p for p in near if p in connected] + [p for p in connected if p not in near]

    async def _provide(self) -> int:
        """Announce ourselves as a provider of our key to the closest connected peers (ADD_PROVIDER, as the library's
        `provide` does after its walk); returns how many took it."""
        assert self.dht is not None
        store = self.dht.provider_store
        key = bytes.fromhex(self.key)
        store.providing_keys.add(key)
        store.add_provider(key, PeerInfo(self.host.get_id(), self.host.get_addrs()))
        sent: list[ID] = []

        async def send(peer: ID) -> None:
            with trio.move_on_after(self.settings.connect_timeout_s):
                try:
                    if await store._send_add_provider(peer, key):
                        sent.append(peer)
                except Exception as exc:  # that peer does not take it: the others may
                    log.debug("ADD_PROVIDER to %s failed: %s", peer, exc)

        async with trio.open_nursery() as nursery:
            for peer in self._closest_connected(key)[:MAX_PROVIDERS]:
                nursery.start_soon(send, peer)
        return len(sent)

    async def _find_providers(self) -> list[PeerInfo]:
        """Providers of our key: the local store merged with what the closest peers hold. (py-libp2p 0.8.1's
        `find_providers` returns the local store alone as soon as it holds any record, ourselves included, so a
        node that has announced itself never asks the network again; measured in docs/NAT.md.)"""
        assert self.dht is not None
        store = self.dht.provider_store
        key = bytes.fromhex(self.key)
        found: dict[ID, PeerInfo] = {}
        for info in store.get_providers(key):
            _merge(found, info)
        closest = self._closest_connected(key)
        me = self.host.get_id()

        async def ask(peer: ID) -> None:
            with trio.move_on_after(self.settings.connect_timeout_s):
                try:
                    providers, _ = await store._get_providers_from_peer_with_closers(peer, key)
                except Exception as exc:  # that peer does not answer: the others may
                    log.debug("GET_PROVIDERS to %s failed: %s", peer, exc)
                    return
                for info in providers[:MAX_PROVIDERS]:
                    _merge(found, info)

        async with trio.open_nursery() as nursery:
            for peer in closest[:MAX_PROVIDERS]:
                if peer != me:
                    nursery.start_soon(ask, peer)
        return list(found.values())[:MAX_PROVIDERS * 2]

    async def _dial_provider(self, info: PeerInfo) -> None:
        """Reach a provider we are not connected to. Its advertised /p2p-circuit addresses come first (it is behind
        NAT: a direct dial would wait out a connect timeout on a NAT that drops it; DCUtR later upgrades the
        relayed connection where the NATs allow); then its direct addresses; then a circuit through each relay we
        know, in case its record predates its reservation."""
        advertised = [a for a in info.addrs if "p2p-circuit" in str(a)][:4]
        direct = [a for a in info.addrs if "p2p-circuit" not in str(a)]
        if await self._dial_circuits(info.peer_id, advertised):
            return
        if direct:
            with trio.move_on_after(min(3.0, self.settings.connect_timeout_s)):
                try:
                    await self.host.connect(PeerInfo(info.peer_id, direct))
                    return
                except Exception as exc:  # unreachable from here
                    log.debug("direct dial of %s failed: %s", info.peer_id, exc)
        guessed = []
        for relay in [*self.relays.reservations, *self._relay_candidates()][:4]:
            base = self.relays.relay_addr(relay)
            if base is not None and relay != info.peer_id:
                guessed.append(multiaddr.Multiaddr(f"{base}/p2p-circuit/p2p/{info.peer_id.to_base58()}"))
        await self._dial_circuits(info.peer_id, list(dict.fromkeys(guessed)))

    async def _dial_circuits(self, peer: ID, circuits: list[multiaddr.Multiaddr]) -> bool:
        for circuit in circuits:
            with trio.move_on_after(self.settings.connect_timeout_s):
                try:
                    await self.relays.dial(circuit)
                    self.counters["relay_dials"] += 1
                    return True
                except Exception as exc:  # that relay refused, or holds no reservation of the peer: next one
                    log.info("dial of %s through %s failed: %s", peer, circuit, exc)
        return False

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
            # requests refused before py-libp2p saw them (libp2p_dht, libp2p_relay; docs/NAT.md "Floods")
            "refused": {**{f"dht_{why}": self.counters[f"dht_refused_{why}"] for why in DHT_REFUSALS},
                        **{f"hop_{why}": self.counters[f"hop_refused_{why}"] for why in HOP_REFUSALS}},
            "discovered": dict(self.discovered),
            "paths": self.paths(),
            "relays_in_use": self.relays_in_use(),
            "hole_punched": sorted(p.to_base58() for p in self.dcutr._direct_connections) if self.dcutr else [],
            "hole_punch_attempts": ({p.to_base58(): n for p, n in self.dcutr._hole_punch_attempts.items()}
                                    if self.dcutr else {}),
            "hole_punching": sorted(p.to_base58() for p in self.dcutr._in_progress) if self.dcutr else [],
        }
