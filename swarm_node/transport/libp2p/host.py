"""The libp2p network host: py-libp2p 0.8.1 on trio, driven by the node over one socket (frames of `ipc.py`).

`run_host(sock)` serves one node: in the child process (`host_process.py`, what `transport.py` starts by default, so
a remote crash in py-libp2p ends only that process) or on a trio thread (`launch.py`). Contract:
- Reads HELLO (private key + HostSettings), starts TCP + Noise (only) + yamux, GossipSub (/meshsub/1.2.0 and
  1.1.0, StrictSign, default message ids, heartbeat 1 s, library spam limiter off: our validators and peer score
  do that job; `router.py`: our own messages flood-published, gossip to backed-off peers, small meshes on the
  digest topics, no IDONTWANT for small messages), answers READY(peer id,
  listen addrs, advertised addrs), then serves CALLs until the node's socket closes, then returns.
- CALL methods: subscribe(topic, validated), unsubscribe(topic), publish(topic, data), connect(multiaddr) -> peer id,
  peers() -> [[id, addrs, latency_ms | None, topics]], serve(protocol), open_stream(peer, protocol) -> sid,
  counters() -> {name: count} of what the guards and validation dropped, nat_status() -> nat.py's view.
- NAT traversal (`nat.NatServices`, in the same nursery): DHT rendezvous, AutoNAT, circuit relay v2,
  DCUtR; an incoming stream of a `no_relay_protocols` protocol over a relayed connection is reset at once.
- Every subscription is drained continuously; messages signed by others go to the node as DELIVER. For a
  validated topic every message from a peer is first sent to the node as VALIDATE and waits (up to
  validation_timeout_s, then IGNORE) for its VERDICT before it is delivered or forwarded (guards.py).
- publish applies back-pressure on the per-peer outbound queues (see HostSettings; never for a peer that stalls or
  whose connection has closed: backpressure.py) and refuses a message over the gossip size limit with an error
  instead of letting the library drop it silently.
- Streams are bridged as S_* frames with credit-based flow control (`stream_bridge.py`).
- Nothing a peer sends may raise out of this module's handlers; the crash guards cover the library's own paths.
- Peer score (`scoring.py`): gossipsub v1.1 scoring with non-zero weights (py-libp2p ships all at 0); its
  application-specific part is the node's reputation table, pushed as SCORES frames (kept across calls, replaced
  whole). A signer whose pushed score is at or below graylist_threshold is IGNOREd at once (no VALIDATE round
  trip); a forwarder the router graylists, or past its validation budget, is ignored unvalidated (guards.py).
"""

from __future__ import annotations

import itertools
import logging
import math
import socket
import time
from collections import Counter
from typing import Any

import multiaddr
import trio
from libp2p import new_host
from libp2p.crypto.keys import KeyPair
from libp2p.crypto.serialization import deserialize_private_key
from libp2p.crypto.x25519 import create_new_key_pair as create_x25519_key_pair
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import info_from_p2p_addr
from libp2p.pubsub.gossipsub import PROTOCOL_ID_V11, PROTOCOL_ID_V12
from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_PROTOCOL_ID
from libp2p.security.noise.transport import Transport as NoiseTransport
from libp2p.tools.anyio_service import background_trio_service

from swarm_node.transport.base import ValidationResult
from swarm_node.transport.libp2p.backpressure import closed_with_full_queue, peers_to_wait_for, still_slow
from swarm_node.transport.libp2p.guards import (
    GuardedPubsub,
    install_record_caches,
    install_signature_guard,
    raise_library_limits,
)
from swarm_node.transport.libp2p.ipc import (
    FrameDecoder,
    HostSettings,
    IpcError,
    Op,
    check_scores,
    encode,
)
from swarm_node.transport.libp2p.nat import NatServices
from swarm_node.transport.libp2p.paths import peer_traffic
from swarm_node.transport.libp2p.router import MeshBounds, SharingGossipSub
from swarm_node.transport.libp2p.scoring import score_params
from swarm_node.transport.libp2p.stream_bridge import StreamBridge
from swarm_node.transport.shaping import RequestBudget

log = logging.getLogger(__name__)

GOSSIP_OVERHEAD_BYTES = 4096  # RPC envelope, signature, key, topic and sender record around the data
SUBSCRIPTION_CHANNEL = 4096  # library default 32: a burst larger than that was dropped with only a warning
def gossip_limit(settings: HostSettings) -> int:
    """Largest `data` publish() accepts: the library's RPC limit minus the envelope around the data."""
    return settings.max_message_bytes - GOSSIP_OVERHEAD_BYTES


class NetworkHost:
    """State of one running host; methods named in `_methods` are the node's CALLs."""

    def __init__(self, key_pair: KeyPair, settings: HostSettings) -> None:
        self.settings = settings
        self.counters: Counter[str] = Counter()
        self.out_send, self.out_recv = trio.open_memory_channel[bytes](math.inf)
        self.streams: dict[int, StreamBridge] = {}
        self._sids = itertools.count(1)
        self._vids = itertools.count(1)
        self._verdicts: dict[int, tuple[trio.Event, list[ValidationResult]]] = {}
        self._validated: set[str] = set()
        self._slow_peers: set[ID] = set()
        self.app_scores: dict[str, float] = {}  # the node's reputation scores (SCORES), by base58 peer id
        self._nursery: trio.Nursery | None = None
        self._methods = {
            "subscribe": self.subscribe, "unsubscribe": self.unsubscribe, "publish": self.publish,
            "connect": self.connect, "peers": self.peers, "serve": self.serve, "open_stream": self.open_stream,
            "counters": self.get_counters, "nat_status": self.nat_status,
        }
        if settings.crash_guards:
            install_signature_guard(self.counters)
        raise_library_limits(settings.queue_size, settings.max_message_bytes, SUBSCRIPTION_CHANNEL)
        install_record_caches()
        # Noise only: the library default also offers plaintext, which a peer could pick.
        security = {NOISE_PROTOCOL_ID: NoiseTransport(key_pair, noise_privkey=create_x25519_key_pair().private_key)}
        announce = [multiaddr.Multiaddr(a) for a in settings.announce] or None
        self.host = new_host(key_pair=key_pair, sec_opt=security, announce_addrs=announce)
        score = score_params(settings, self.app_score)
        self.gossipsub = SharingGossipSub(
            protocols=[PROTOCOL_ID_V12, PROTOCOL_ID_V11], degree=settings.degree, degree_low=settings.degree_low,
            degree_high=settings.degree_high, heartbeat_interval=settings.heartbeat_s, heartbeat_initial_delay=0.1,
            spam_protection_enabled=False, score_params=score, counters=self.counters,
            small_prefix=settings.small_mesh_prefix, idontwant_min_bytes=settings.idontwant_min_bytes,
            small_bounds=MeshBounds(settings.small_mesh_degree, settings.small_mesh_degree_low,
                                    settings.small_mesh_degree_high, settings.small_mesh_lazy),
        )
        self.pubsub = GuardedPubsub(
            self.host, self.gossipsub, strict_signing=True, seen_ttl=settings.seen_ttl_s,
            sweep_interval=settings.sweep_s, max_inbound_rpc_size=settings.max_message_bytes,
            app_validate=self._app_validate, crash_guards=settings.crash_guards, counters=self.counters,
            forward_budget=RequestBudget(settings.forward_peer_rate, settings.forward_peer_burst,
                                         settings.forward_total_rate, settings.forward_total_burst),
        )
        self.my_id_bytes = self.host.get_id().to_bytes()
        self.nat = NatServices(self.host, settings, self.counters)  # DHT rendezvous, AutoNAT, relays

    def send(self, op: Op, *fields: Any) -> None:
        self.out_send.send_nowait(encode(op, *fields))

    def app_score(self, peer: ID) -> float:
        """Gossipsub's application-specific score (P6): the node's pushed reputation score, 0 if none."""
        return self.app_scores.get(peer.to_base58(), 0.0)

    # -- main loop ------------------------------------------------------------------------------------------
    async def serve_node(self, conn: trio.SocketStream, decoder: FrameDecoder) -> None:
        listen = [multiaddr.Multiaddr(a) for a in self.settings.listen]
        async with self.host.run(listen), background_trio_service(self.pubsub), \
                background_trio_service(self.gossipsub):
            await self.pubsub.wait_until_ready()
            self.send(Op.READY, self.host.get_id().to_base58(), [str(a) for a in self.host.get_transport_addrs()],
                      [str(a) for a in self.host.get_addrs()])
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._write_frames, conn)
                nursery.start_soon(self._reap_stale_streams)
                nursery.start_soon(self.nat.run)
                await self._read_frames(conn, decoder, nursery)
                nursery.cancel_scope.cancel()  # the node closed its socket: shut down

    async def _reap_stale_streams(self) -> None:
        while True:
            await trio.sleep(1.0)
            self.pubsub.reap_stale_streams()
            self.pubsub.reopen_streams()

    async def _write_frames(self, conn: trio.SocketStream) -> None:
        while True:
            batch = [await self.out_recv.receive()]
            size = len(batch[0])
            while size < (1 << 20):  # coalesce queued frames into one send
                try:
                    frame = self.out_recv.receive_nowait()
                except trio.WouldBlock:
                    break
                batch.append(frame)
                size += len(frame)
            try:
                await conn.send_all(b"".join(batch))
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return  # the node has gone; _read_frames sees EOF and we shut down

    async def _read_frames(self, conn: trio.SocketStream, decoder: FrameDecoder, nursery: trio.Nursery) -> None:
        while True:
            try:
                data = await conn.receive_some(1 << 20)
            except trio.BrokenResourceError:
                return
            if not data:
                return
            for op, fields in decoder.feed(data):
                self._dispatch(op, fields, nursery)

    def _dispatch(self, op: Op, fields: list[Any], nursery: trio.Nursery) -> None:
        if op is Op.CALL:
            req_id, method, args = fields
            nursery.start_soon(self._call, req_id, method, args)
        elif op is Op.VERDICT:
            vid, verdict = fields
            waiter = self._verdicts.get(vid)
            if waiter is not None:
                waiter[1].append(ValidationResult(verdict))
                waiter[0].set()
        elif op is Op.SCORES:
            self.app_scores = check_scores(fields[0])
        elif op in (Op.S_DATA, Op.S_CLOSE, Op.S_RESET, Op.S_CREDIT):
            bridge = self.streams.get(fields[0])
            if bridge is None:
                return  # already finished; late frames are harmless
            if op is Op.S_DATA:
                bridge.to_peer_send.send_nowait(fields[1])
            elif op is Op.S_CLOSE:
                bridge.to_peer_send.send_nowait(None)
            elif op is Op.S_RESET:
                bridge.abort()
            else:
                bridge.add_credit(fields[1])
        else:
            raise IpcError(f"unexpected op {op.name} from the node")

    async def _call(self, req_id: int, method: str, args: list[Any]) -> None:
        fn = self._methods.get(method)
        try:
            if fn is None:
                raise IpcError(f"unknown method {method!r}")
            value = await fn(*args)
        except Exception as exc:  # report any failure of a request back to the node, which raises it there
            self.send(Op.RESULT, req_id, False, f"{type(exc).__name__}: {exc}")
            return
        self.send(Op.RESULT, req_id, True, value)

    async def nat_status(self) -> dict[str, Any]:
        """Reachability, relays, relayed bytes and DHT discovery (nat.NatServices.status), and per peer
        "traffic": open direct and relayed connections and the path our gossip to it takes (paths.peer_traffic)."""
        status = self.nat.status()
        status["traffic"] = peer_traffic(self.host, self.pubsub.peers)
        return status

    async def get_counters(self) -> dict[str, int]:
        """Guard and validation counters (undecodable_frame, malformed_key, validation_timeout, slow_peer, ...)."""
        return dict(self.counters)

    # -- gossip ---------------------------------------------------------------------------------------------
    async def _app_validate(self, topic: str, signer: str, data: bytes) -> ValidationResult:
        if self.app_scores.get(signer, 0.0) <= self.settings.graylist_threshold:
            self.counters["graylisted_signer"] += 1  # the node ignores it: no round trip, not forwarded
            return ValidationResult.IGNORE
        if topic not in self._validated:
            return ValidationResult.ACCEPT
        vid = next(self._vids)
        event = trio.Event()
        result: list[ValidationResult] = []
        self._verdicts[vid] = (event, result)
        # The deadline (wall clock: host and node share the machine) lets the node skip requests we have given up
        # on: after a flood the backlog then drains at once instead of being validated for nothing, starving honest
        # messages (docs/MEASUREMENTS.md).
        self.send(Op.VALIDATE, vid, topic, signer, data, time.time() + self.settings.validation_timeout_s)
        try:
            with trio.move_on_after(self.settings.validation_timeout_s):
                await event.wait()
        finally:
            del self._verdicts[vid]
        if not result:
            self.counters["validation_timeout"] += 1
            return ValidationResult.IGNORE
        return result[0]

    async def subscribe(self, topic: str, validated: bool) -> None:
        if validated:
            self._validated.add(topic)
        else:
            self._validated.discard(topic)
        if topic in self.pubsub.topic_ids:
            return
        subscription = await self.pubsub.subscribe(topic)
        assert self._nursery is not None
        self._nursery.start_soon(self._drain, topic, subscription)

    async def unsubscribe(self, topic: str) -> None:
        """Leave `topic` (peers are told; the router leaves its mesh); its subscription channel closes, which ends
        its drain."""
        self._validated.discard(topic)
        await self.pubsub.unsubscribe(topic)

    async def _drain(self, topic: str, subscription: Any) -> None:
        while True:
            try:
                msg = await subscription.get()
            except (trio.EndOfChannel, trio.ClosedResourceError):
                return  # unsubscribed
            if msg.from_id == self.my_id_bytes:
                continue  # our own publish
            self.send(Op.DELIVER, topic, msg.data, ID(msg.from_id).to_base58(), time.time())

    async def publish(self, topic: str, data: bytes) -> None:
        limit = gossip_limit(self.settings)
        if len(data) > limit:
            raise ValueError(f"gossip message of {len(data)} bytes exceeds {limit}; send large payloads over a stream")
        await self._wait_for_queue_room()
        await self.pubsub.publish(topic, data)

    async def _wait_for_queue_room(self) -> None:
        """Back-pressure: wait while a peer's outbound queue is near full, but never for a peer that stalls or
        whose connection has closed (backpressure.py)."""
        high = self.settings.high_water
        queues = self.pubsub.peer_queues
        self._slow_peers = still_slow(self._slow_peers, queues, high)
        deadline = trio.current_time() + self.settings.slow_peer_wait_s
        while True:
            if closed_with_full_queue(queues, high, self._connection_closed):
                self.pubsub.reap_stale_streams()  # their queues would never drain: drop those peers now
            full = peers_to_wait_for(queues, high, self._slow_peers, self._connection_closed)
            if not full:
                return
            if trio.current_time() >= deadline:
                self._slow_peers.update(full)
                self.counters["slow_peer"] += len(full)
                log.warning("peer(s) %s read nothing for %.0f s; publishing without waiting for them (they may "
                            "miss messages until they catch up)", [p.to_base58() for p in full],
                            self.settings.slow_peer_wait_s)
                return
            await trio.sleep(0.002)

    def _connection_closed(self, peer: ID) -> bool:
        """Whether the pubsub stream we write to `peer` is gone or sits on a closed connection."""
        stream = self.pubsub.peers.get(peer)
        return stream is None or bool(getattr(getattr(stream, "muxed_conn", None), "is_closed", False))

    # -- peers ----------------------------------------------------------------------------------------------
    async def connect(self, addr: str) -> str:
        info = info_from_p2p_addr(multiaddr.Multiaddr(addr))
        if info.peer_id == self.host.get_id():
            raise ValueError("that address is this node itself")
        with trio.fail_after(self.settings.connect_timeout_s):
            await self.host.connect(info)
        return info.peer_id.to_base58()

    async def peers(self) -> list[list[Any]]:
        out: list[list[Any]] = []
        store = self.host.get_peerstore()
        for peer in self.host.get_connected_peers():
            try:
                addrs = [str(a) for a in store.addrs(peer)]
            except Exception:  # the peerstore raises when it holds no address for a (dialing-in) peer
                addrs = []
            try:
                latency = store.latency_EWMA(peer) * 1000.0 or None
            except Exception:  # no latency recorded yet
                latency = None
            topics = sorted(t for t, members in self.pubsub.peer_topics.items() if peer in members)
            out.append([peer.to_base58(), addrs, latency, topics])
        return out

    # -- streams --------------------------------------------------------------------------------------------
    async def serve(self, protocol: str) -> None:
        self.host.set_stream_handler(protocol, self._incoming_stream)

    async def _incoming_stream(self, stream: Any) -> None:
        if self.nat.refuses(stream):  # bulk protocols are not served through a relay (nat.py)
            await stream.reset()
            return
        try:
            sid = next(self._sids)
            bridge = StreamBridge(self, sid, stream)
            self.streams[sid] = bridge
            remote = stream.get_remote_address()
            host, port = (remote[0], remote[1]) if remote else (None, None)
            self.send(Op.S_OPEN, sid, stream.muxed_conn.peer_id.to_base58(), str(stream.get_protocol()), host, port)
            await bridge.run()
        except Exception:  # a handler that raises would take the connection's nursery, then the host, down
            log.warning("incoming stream failed", exc_info=True)
            await stream.reset()

    async def open_stream(self, peer: str, protocol: str) -> int:
        with trio.fail_after(self.settings.connect_timeout_s):
            stream = await self.host.new_stream(ID.from_base58(peer), [protocol])
        sid = next(self._sids)
        bridge = StreamBridge(self, sid, stream)
        self.streams[sid] = bridge
        assert self._nursery is not None
        self._nursery.start_soon(bridge.run)
        return sid


async def run_host(sock: socket.socket) -> None:
    """Serve one node over `sock` until it closes. Raises if py-libp2p dies (the supervisor restarts us)."""
    conn = trio.SocketStream(trio.socket.from_stdlib_socket(sock))
    decoder = FrameDecoder()
    frames: list[tuple[Op, list[Any]]] = []
    while not frames:
        data = await conn.receive_some(1 << 16)
        if not data:
            return
        frames = decoder.feed(data)
    op, fields = frames[0]
    if op is not Op.HELLO or len(frames) > 1:
        raise IpcError("the node must send HELLO first, alone")
    key, settings = fields
    private_key = deserialize_private_key(key)
    host = NetworkHost(KeyPair(private_key, private_key.get_public_key()), HostSettings.from_wire(settings))
    await host.serve_node(conn, decoder)
