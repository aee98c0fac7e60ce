"""DHT rendezvous, inside the network host: peers of one swarm find each other at a Kademlia key named after it.

Contract (trio; `Rendezvous(host, settings, counters, dht, relays)` then `await run()` in the host's nursery):
every `dht_interval_s` the node adds its direct peers to its routing table, looks up the providers of the
rendezvous key (`rendezvous_key(settings.rendezvous)`, the swarm's topic) at the closest peers it is connected to,
dials those it is not connected to (through the relay named in their /p2p-circuit address first), then announces
itself to the same peers (ADD_PROVIDER); each step is bounded in time. The library's own `find_providers`/`provide`
are not used (docs/NAT.md says why). `discovered` says who was found through the DHT (peer id -> "dht"). What
peers ask of our DHT server is budgeted and its stores bounded (`dht.GuardedKadDHT`).
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
from libp2p.tools.anyio_service import background_trio_service

from swarm_node.transport.libp2p.dht import GuardedKadDHT
from swarm_node.transport.libp2p.ipc import HostSettings
from swarm_node.transport.libp2p.paths import direct_peers, relay_candidates
from swarm_node.transport.libp2p.relay import RelayClient

log = logging.getLogger(__name__)

MAX_PROVIDERS = 20  # providers taken from one lookup (the DHT answer is untrusted: bounded)


def rendezvous_key(name: str) -> str:
    """The DHT key a swarm meets at: hex of sha256("swarm-node/rendezvous/" + name)."""
    return hashlib.sha256(f"swarm-node/rendezvous/{name}".encode()).hexdigest()


def merge_provider(found: dict[ID, PeerInfo], info: PeerInfo) -> None:
    """Add a provider record, uniting its addresses with what other peers said (records may be stale: one taken
    before the provider had a relay reservation lacks its /p2p-circuit address). At most 16 addresses a peer."""
    old = found.get(info.peer_id)
    addrs = list(dict.fromkeys([*(old.addrs if old else []), *info.addrs]))[:16]
    found[info.peer_id] = PeerInfo(info.peer_id, addrs)


class Rendezvous:
    def __init__(self, host: Any, settings: HostSettings, counters: Counter[str], dht: GuardedKadDHT,
                 relays: RelayClient) -> None:
        self.host, self.settings, self.counters, self.dht, self.relays = host, settings, counters, dht, relays
        self.key = rendezvous_key(settings.rendezvous)
        self.discovered: dict[str, str] = {}  # peer id -> how we learnt of it ("dht")

    async def run(self) -> None:
        """Run the DHT server and a rendezvous round every dht_interval_s, until cancelled."""
        async with background_trio_service(self.dht):
            while True:
                await self.round()
                await trio.sleep(self.settings.dht_interval_s)

    async def round(self) -> None:
        """Look up the other providers first, then announce ourselves; each step bounded in time (a lookup can
        stall on peers whose advertised addresses cannot be dialled from here)."""
        for peer in direct_peers(self.host):
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
        connected = set(direct_peers(self.host))
        near = self.dht.routing_table.find_local_closest_peers(key, MAX_PROVIDERS)
        return [p for p in near if p in connected] + [p for p in connected if p not in near]

    async def _provide(self) -> int:
        """Announce ourselves as a provider of our key to the closest connected peers (ADD_PROVIDER, as the library's
        `provide` does after its walk); returns how many took it."""
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
        store = self.dht.provider_store
        key = bytes.fromhex(self.key)
        found: dict[ID, PeerInfo] = {}
        for info in store.get_providers(key):
            merge_provider(found, info)
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
                    merge_provider(found, info)

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
        for relay in [*self.relays.reservations, *relay_candidates(self.host)][:4]:
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
