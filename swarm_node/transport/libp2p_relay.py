"""Circuit relay v2 (libp2p's /libp2p/circuit/relay/0.2.0/hop and /stop): serving as a relay, reserving a slot on
one, dialling through one, and counting every relayed byte.

Contract (trio, runs in the network host):
- `CountingRelayProtocol(host, limits)`: py-libp2p's CircuitV2Protocol (it accepts relayed connections to us,
  STOP) plus `enable_hop()` to start serving as a relay (HOP) once we know we are public. As a relay it enforces
  the library's per-reservation limits (`RelayLimits`: reservations, circuits, bytes and seconds per circuit) and
  counts what it forwards in `counters["relay_served_bytes"]`; bytes of our own relayed connections are counted in
  `counters["relayed_bytes"]`, both directions. `inbound_relays` names the relay of each incoming relayed
  connection (the library's address for it names us instead).
- `RelayClient(host, protocol, counters)`: `reserve(relay)` makes (or refreshes) a reservation and returns our
  circuit address on it (None when the relay refuses; the caller tries the next one), `dial(circuit_addr)` opens
  a connection through a relay, `drop(relay)` forgets a reservation (relay gone), `circuit_addrs()` lists ours.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

import multiaddr
import trio
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo, info_from_p2p_addr
from libp2p.relay.circuit_v2 import PROTOCOL_ID as HOP_PROTOCOL_ID
from libp2p.relay.circuit_v2 import CircuitV2Protocol, CircuitV2Transport
from libp2p.relay.circuit_v2.config import RelayConfig, RelayRole
from libp2p.relay.circuit_v2.resources import RelayLimits

log = logging.getLogger(__name__)

RESERVE_TIMEOUT_S = 10.0


class _Counted:
    """A stream or raw connection whose reads and writes add to a counter; everything else passes through."""

    def __init__(self, inner: Any, counters: Counter[str], key: str) -> None:
        self._inner, self._counters, self._key = inner, counters, key

    async def read(self, n: int | None = None) -> bytes:
        data = await self._inner.read(n)
        self._counters[self._key] += len(data)
        return bytes(data)

    async def write(self, data: bytes) -> None:
        await self._inner.write(data)
        self._counters[self._key] += len(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class CountingRelayProtocol(CircuitV2Protocol):
    def __init__(self, host: Any, limits: RelayLimits, counters: Counter[str]) -> None:
        super().__init__(host, limits, allow_hop=False)
        self.counters = counters
        # source peer -> relay of its latest relayed connection to us. (py-libp2p 0.8.1 names *us* as the relay in
        # the address of an incoming relayed connection: /p2p/<our id>/p2p-circuit/p2p/<source>.)
        self.inbound_relays: dict[ID, ID] = {}

    def enable_hop(self) -> None:
        if not self.allow_hop:
            self.allow_hop = True
            self.host.set_stream_handler(HOP_PROTOCOL_ID, self._handle_hop_stream)
            log.info("serving as a circuit relay (limits: %s)", self.limits)

    async def _read_stream_with_retry(self, stream: Any, *args: Any, **kwargs: Any) -> bytes:
        data = await super()._read_stream_with_retry(stream, *args, **kwargs)
        self.counters["relay_served_bytes"] += len(data or b"")
        return data

    async def _handle_stop_stream(self, stream: Any) -> None:
        await super()._handle_stop_stream(_Counted(stream, self.counters, "relayed_bytes"))

    async def handle_incoming_connection(self, stream: Any, remote_peer_id: bytes) -> None:
        if len(self.inbound_relays) < 4096:  # bounded: one entry per source peer
            self.inbound_relays[ID(remote_peer_id)] = stream.muxed_conn.peer_id
        await super().handle_incoming_connection(stream, remote_peer_id)


class RelayClient:
    def __init__(self, host: Any, protocol: CountingRelayProtocol, counters: Counter[str]) -> None:
        self.host, self.counters = host, counters
        # STOP only: with CLIENT the library's dialler makes a reservation on every relay it dials through.
        config = RelayConfig(roles=RelayRole.STOP, limits=protocol.limits)
        self.transport = CircuitV2Transport(host, protocol, config)
        self.reservations: dict[ID, multiaddr.Multiaddr] = {}  # relay -> our circuit address on it

    def relay_addr(self, relay: ID) -> multiaddr.Multiaddr | None:
        """A direct (non-circuit) TCP address of `relay` from the peerstore."""
        try:
            addrs = self.host.get_peerstore().addrs(relay)
        except Exception:  # the peerstore raises for a peer it holds no address for
            return None
        for addr in addrs:
            text = str(addr)
            if "/tcp/" in text and "p2p-circuit" not in text and "/ip4/0.0.0.0/" not in text:
                base = text.split("/p2p/")[0]
                return multiaddr.Multiaddr(f"{base}/p2p/{relay.to_base58()}")
        return None

    async def reserve(self, relay: ID, nursery: trio.Nursery) -> multiaddr.Multiaddr | None:
        base = self.relay_addr(relay)
        if base is None:
            return None
        ok = False
        with trio.move_on_after(RESERVE_TIMEOUT_S):
            try:
                stream = await self.host.new_stream(relay, [HOP_PROTOCOL_ID])
                try:
                    ok = await self.transport.reserve(stream, relay, nursery)
                finally:
                    await stream.close()
            except Exception as exc:  # relay gone, does not serve HOP, reset: not a relay for us
                log.info("reservation on %s failed: %s", relay, exc)
        if not ok:
            self.reservations.pop(relay, None)
            return None
        circuit = multiaddr.Multiaddr(f"{base}/p2p-circuit")
        self.reservations[relay] = circuit
        return circuit

    def drop(self, relay: ID) -> None:
        self.reservations.pop(relay, None)
        self.transport._reservations.pop(relay, None)  # stop the library refreshing a reservation on a gone relay

    def circuit_addrs(self) -> list[multiaddr.Multiaddr]:
        return list(self.reservations.values())

    async def dial(self, circuit: multiaddr.Multiaddr) -> ID:
        """Connect to the peer at `circuit` (/.../p2p/RELAY/p2p-circuit/p2p/PEER) through that relay."""
        relay_addr, dest = self.transport.parse_circuit_ma(circuit)
        relay_info = info_from_p2p_addr(relay_addr)
        raw = await self.transport.dial_peer_info(PeerInfo(dest, [circuit]), relay_info=relay_info)
        await self.host.upgrade_outbound_connection(_Counted(raw, self.counters, "relayed_bytes"), dest)
        return dest
