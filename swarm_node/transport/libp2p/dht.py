"""The Kademlia DHT server, guarded: per-peer and total request budgets and bounded stores, ahead of py-libp2p.

Contract (trio, runs in the network host): `GuardedKadDHT(host, settings, counters)` is py-libp2p's KadDHT in server
mode (it answers /ipfs/kad/1.0.0) whose incoming streams pass a gate before the library sees them:
- A new stream from a peer whose budget is spent (`shaping.RequestBudget`: settings.dht_peer_rate/dht_peer_burst
  per peer, dht_total_rate/dht_total_burst for all peers together), or from a peer already holding
  MAX_STREAMS_PER_PEER DHT streams to us, is reset before the library does anything with it (it would first add
  the peer to the routing table and take one of its 12 handler slots).
- Each request on a stream (the library answers several per stream) takes one token when its first byte arrives.
  A request is refused when no token is left, when its length prefix says it is longer than REQUEST_OVERHEAD +
  dht_max_record_bytes (no request we answer needs more; judged before its body is read), when it is not complete
  within MESSAGE_TIMEOUT_S (a silent stream would hold a library slot for ever), when it is a PUT_VALUE whose
  record, or an ADD_PROVIDER whose provider entry, is over dht_max_record_bytes, and when it would add a record to
  a store (provider records, values: each counted on its own) that already holds dht_max_records of them, or
  dht_max_records_per_peer from that peer. A refresh of a record we hold is not a new record.
- Refusing resets the stream; the library then sees the end of the stream, never the request.
Each refusal adds one to counters["dht_refused_<why>"], why in REFUSALS: rate (that peer's budget), total (all
peers' budget), streams, slow, large, full.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import trio
import varint
from libp2p.kad_dht import DHTMode, KadDHT
from libp2p.kad_dht.pb.kademlia_pb2 import Message
from libp2p.peer.id import ID

from swarm_node.transport.libp2p.ipc import HostSettings
from swarm_node.transport.shaping import RequestBudget

REFUSALS = ("rate", "total", "streams", "slow", "large", "full")
MAX_STREAMS_PER_PEER = 4  # concurrent DHT streams one peer may hold to us (the library serves 12 in all)
MESSAGE_TIMEOUT_S = 10.0  # from a request's first byte being awaited to its last byte
REQUEST_OVERHEAD = 16 << 10  # a request's key, type and the sender's signed peer record, around one record


class _GatedStream:
    """The library's view of one incoming DHT stream: reads return whole requests that passed the gate, one at a
    time; a refused one is never returned (the stream is reset and the library sees its end)."""

    def __init__(self, inner: Any, dht: GuardedKadDHT, peer: ID) -> None:
        self._inner, self._dht, self.peer = inner, dht, peer
        self._buf = bytearray()
        self.refused = False

    async def read(self, n: int | None = None) -> bytes:
        if not self._buf:
            if self.refused:
                return b""
            self._buf += await self._dht._next_request(self)
        n = len(self._buf) if n is None or n < 0 else n
        out = bytes(self._buf[:n])
        del self._buf[:n]
        return out

    async def close(self) -> None:
        if not self.refused:  # already reset by us
            await self._inner.close()

    async def reset(self) -> None:
        if not self.refused:
            await self._inner.reset()

    def __getattr__(self, name: str) -> Any:  # write, muxed_conn, metric_send_channel, ...
        return getattr(self._inner, name)


class GuardedKadDHT(KadDHT):
    def __init__(self, host: Any, settings: HostSettings, counters: Counter[str]) -> None:
        super().__init__(host, DHTMode.SERVER)  # registers self.handle_stream, i.e. ours below
        self.settings, self.counters = settings, counters
        self.budget = RequestBudget(settings.dht_peer_rate, settings.dht_peer_burst, settings.dht_total_rate,
                                    settings.dht_total_burst)
        self.max_request_bytes = REQUEST_OVERHEAD + settings.dht_max_record_bytes
        self._streams: Counter[ID] = Counter()  # peer -> its DHT streams open now (no entry at 0: bounded)
        self._value_owners: dict[bytes, ID] = {}  # value key -> the peer that stored it (values carry no sender)

    async def handle_stream(self, stream: Any) -> None:
        peer = stream.muxed_conn.peer_id
        verdict = self.budget.peek(peer)
        if verdict != "ok":
            await self._reset(stream, "rate" if verdict == "peer" else "total")
            return
        if self._streams[peer] >= MAX_STREAMS_PER_PEER:
            await self._reset(stream, "streams")
            return
        self._streams[peer] += 1
        try:
            await super().handle_stream(_GatedStream(stream, self, peer))
        finally:
            self._streams[peer] -= 1
            if self._streams[peer] <= 0:
                del self._streams[peer]

    async def _reset(self, stream: Any, why: str) -> None:
        self.counters[f"dht_refused_{why}"] += 1
        with trio.move_on_after(1.0):
            try:
                await stream.reset()
            except Exception:  # gone already: nothing left to refuse
                pass

    async def _refuse(self, stream: _GatedStream, why: str) -> bytes:
        stream.refused = True
        await self._reset(stream._inner, why)
        return b""

    async def _next_request(self, stream: _GatedStream) -> bytes:
        """The next request on `stream` (its length prefix and body) once it passed the gate; b"" after refusing it.
        Read errors (the peer's end of the stream, a reset) reach the library as they would have."""
        inner = stream._inner
        with trio.move_on_after(MESSAGE_TIMEOUT_S):
            prefix = bytearray(await inner.read(1))
            if not prefix:
                return b""
            verdict = self.budget.take(stream.peer)
            if verdict != "ok":
                return await self._refuse(stream, "rate" if verdict == "peer" else "total")
            while prefix[-1] & 0x80 and len(prefix) < 10:
                more = await inner.read(1)
                if not more:
                    return bytes(prefix)  # a truncated prefix: the library resets the stream
                prefix += more
            try:
                length = varint.decode_bytes(bytes(prefix))
            except Exception:  # not a varint: the library refuses it
                return bytes(prefix)
            if length > self.max_request_bytes:
                return await self._refuse(stream, "large")
            body = bytearray()
            while len(body) < length:
                chunk = await inner.read(length - len(body))
                if not chunk:
                    return bytes(prefix + body)  # truncated: the library resets the stream
                body += chunk
            why = self._check_request(stream.peer, bytes(body))
            if why:
                return await self._refuse(stream, why)
            return bytes(prefix + body)
        return await self._refuse(stream, "slow")

    # -- bounded records ------------------------------------------------------------------------------------
    def _check_request(self, peer: ID, body: bytes) -> str:
        """Why this request must be refused ("large", "full"), or "" to let the library have it."""
        message = Message()
        try:
            message.ParseFromString(body)
        except Exception:  # the library refuses what it cannot parse
            return ""
        if message.type == Message.MessageType.ADD_PROVIDER:
            return self._check_provider(peer, message)
        if message.type == Message.MessageType.PUT_VALUE and message.HasField("record"):
            return self._check_value(peer, message)
        return ""

    def _check_provider(self, peer: ID, message: Message) -> str:
        if any(p.ByteSize() > self.settings.dht_max_record_bytes for p in message.providerPeers):
            return "large"
        me = peer.to_bytes()
        if not any(p.id == me and p.addrs for p in message.providerPeers):
            return ""  # the library stores only the sender's own record, with an address: nothing to store
        providers = self.provider_store.providers
        if str(peer) in providers.get(message.key, {}):
            return ""  # a refresh of its record
        if sum(len(records) for records in providers.values()) >= self.settings.dht_max_records:
            return "full"
        if sum(str(peer) in records for records in providers.values()) >= self.settings.dht_max_records_per_peer:
            return "full"
        return ""

    def _check_value(self, peer: ID, message: Message) -> str:
        if message.record.ByteSize() > self.settings.dht_max_record_bytes:
            return "large"
        key, store = message.record.key, self.value_store.store
        if key in store:
            return ""  # a newer version of a record we hold: the library's validator chooses
        if len(store) >= self.settings.dht_max_records:
            return "full"
        if len(self._value_owners) >= 2 * self.settings.dht_max_records:  # bounded: forget keys no longer held
            self._value_owners = {k: p for k, p in self._value_owners.items() if k in store}
        if sum(p == peer and k in store for k, p in self._value_owners.items()) >= \
                self.settings.dht_max_records_per_peer:
            return "full"
        self._value_owners[key] = peer  # counted once the library stored it (it may still refuse it)
        return ""
