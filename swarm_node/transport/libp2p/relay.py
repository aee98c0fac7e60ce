"""Circuit relay v2 (libp2p's /libp2p/circuit/relay/0.2.0/hop and /stop): serving as a relay, reserving a slot on
one, dialling through one, and counting every relayed byte.

Contract (trio, runs in the network host):
- `CountingRelayProtocol(host, limits, counters, budget, max_circuits_total)`: py-libp2p's CircuitV2Protocol (it
  accepts relayed connections to us, STOP) plus `enable_hop()` to start serving as a relay (HOP) once we know we
  are public. As a relay it enforces the library's per-reservation limits (`RelayLimits`: reservations, circuits
  per destination, bytes and seconds per circuit; a CONNECT only ever reaches a peer holding a reservation with
  us) and, before the library, ours: each RESERVE or CONNECT takes a token from `budget` (a
  `shaping.RequestBudget` keyed by the asking peer; a new HOP stream from a peer with none left is reset, a
  request past it is answered RESOURCE_LIMIT_EXCEEDED); a RESERVE naming another peer than the asker is refused
  (PERMISSION_DENIED: the library would hold a slot for that name, filling the relay from one connection); a
  CONNECT is refused (RESOURCE_LIMIT_EXCEEDED) once `max_circuits_total` circuits are open or in the making, or
  `limits.max_circuit_conns` from that source or to that destination (the library counts a circuit only once it
  is up, so concurrent CONNECTs all passed its check). Refusals are counted in `counters["hop_refused_<why>"]`,
  why in HOP_REFUSALS. It counts what it forwards in `counters["relay_served_bytes"]`; bytes of our own relayed
  connections are counted in `counters["relayed_bytes"]`, both directions. `inbound_relays` names the relay of
  each incoming relayed connection (the library's address for it names us instead).
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
from libp2p.relay.circuit_v2.protocol_buffer import StatusCode
from libp2p.relay.circuit_v2.resources import RelayLimits

from swarm_node.transport.shaping import RequestBudget

log = logging.getLogger(__name__)

RESERVE_TIMEOUT_S = 10.0
HOP_REFUSALS = ("rate", "total", "circuits", "foreign")


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
    def __init__(self, host: Any, limits: RelayLimits, counters: Counter[str], budget: RequestBudget,
                 max_circuits_total: int) -> None:
        super().__init__(host, limits, allow_hop=False)
        self.counters = counters
        self.budget, self.max_circuits_total = budget, max_circuits_total
        # Circuits open or in the making: all, by source, by destination (no entry at 0: bounded by the total).
        self.circuits = 0
        self._circuits_from: Counter[ID] = Counter()
        self._circuits_to: Counter[ID] = Counter()
        # source peer -> relay of its latest relayed connection to us. (py-libp2p 0.8.1 names *us* as the relay in
        # the address of an incoming relayed connection: /p2p/<our id>/p2p-circuit/p2p/<source>.)
        self.inbound_relays: dict[ID, ID] = {}

    def enable_hop(self) -> None:
        if not self.allow_hop:
            self.allow_hop = True
            self.host.set_stream_handler(HOP_PROTOCOL_ID, self._handle_hop_stream)
            log.info("serving as a circuit relay (limits: %s)", self.limits)

    # -- limits ahead of the library (HOP) -------------------------------------------------------------------
    async def _handle_hop_stream(self, stream: Any) -> None:
        verdict = self.budget.peek(stream.muxed_conn.peer_id)
        if verdict != "ok":  # spent: not even read (the library would wait up to 30 s for a request)
            self.counters["hop_refused_rate" if verdict == "peer" else "hop_refused_total"] += 1
            with trio.move_on_after(1.0):
                try:
                    await stream.reset()
                except Exception:  # gone already
                    pass
            return
        await super()._handle_hop_stream(stream)

    async def _refuse(self, stream: Any, why: str, code: StatusCode, text: str) -> None:
        self.counters[f"hop_refused_{why}"] += 1
        await self._send_status(stream, code, text)  # the library's own refusal; it logs, never raises

    async def _spend(self, stream: Any) -> bool:
        verdict = self.budget.take(stream.muxed_conn.peer_id)
        if verdict != "ok":
            await self._refuse(stream, "rate" if verdict == "peer" else "total", StatusCode.RESOURCE_LIMIT_EXCEEDED,
                               "too many relay requests; try later")
        return verdict == "ok"

    async def _handle_reserve(self, stream: Any, msg: Any) -> None:
        asker = stream.muxed_conn.peer_id
        if msg.HasField("peer") and msg.peer.id and msg.peer.id != asker.to_bytes():
            await self._refuse(stream, "foreign", StatusCode.PERMISSION_DENIED, "a reservation is for the asker")
            return
        if await self._spend(stream):
            await super()._handle_reserve(stream, msg)

    async def _handle_connect(self, stream: Any, msg: Any) -> None:
        if not await self._spend(stream):
            return
        source, dest = stream.muxed_conn.peer_id, ID(msg.peer.id)
        if not self.resource_manager.can_accept_connection(dest):
            # The library refuses it (no reservation, or its own per-destination count): not a circuit of ours,
            # and not counted while it waits out its grace period before the reset.
            await super()._handle_connect(stream, msg)
            return
        per_peer = self.limits.max_circuit_conns
        if (self.circuits >= self.max_circuits_total or self._circuits_from[source] >= per_peer
                or self._circuits_to[dest] >= per_peer):
            await self._refuse(stream, "circuits", StatusCode.RESOURCE_LIMIT_EXCEEDED, "too many circuits")
            return
        self.circuits += 1
        self._circuits_from[source] += 1
        self._circuits_to[dest] += 1
        try:
            await super()._handle_connect(stream, msg)  # returns when the circuit ends (or was refused)
        finally:
            self.circuits -= 1
            for table, peer in ((self._circuits_from, source), (self._circuits_to, dest)):
                table[peer] -= 1
                if table[peer] <= 0:
                    del table[peer]

    # -- counting -------------------------------------------------------------------------------------------
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
