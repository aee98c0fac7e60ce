"""Frames between the node (asyncio) and its libp2p network host (trio), sans-I/O.

Contract: a frame is a 4-byte big-endian body length followed by a msgpack array `[op, *fields]`. `encode()` makes
one; `FrameDecoder.feed()` turns received bytes into complete `(Op, fields)` pairs, raising `IpcError` for a
frame over `MAX_FRAME_BYTES` or a body that is not such an array. Both ends are our own code (never a peer), so a
decode error means a bug or a dying process, not an attack. `HostSettings` travels in the HELLO frame.

Ops and their fields (N = node, H = network host):
  N->H HELLO(key: bytes, settings: dict)            H->N READY(peer_id, listen: list, advertised: list)
  N->H CALL(req_id, method: str, args: list)        H->N RESULT(req_id, ok: bool, value | error text)
  H->N VALIDATE(vid, topic, signer, data, deadline) N->H VERDICT(vid, ValidationResult value)
  H->N DELIVER(topic, data, signer, received_at)
  N->H SCORES(scores: {peer_id: float}): the node's reputation scores, the whole table (replaces the last one), at
       most MAX_SCORES entries; gossipsub's application-specific score (P6) reads it, and a signer at or below
       graylist_threshold is IGNOREd without a VALIDATE round trip (`check_scores` validates it on arrival)
  H->N S_OPEN(sid, peer_id, protocol_id, remote_host | None, remote_port | None): an incoming stream
  both S_DATA(sid, bytes)   S_CLOSE(sid): sender's half is done   S_RESET(sid, reason)
  both S_CREDIT(sid, n): "I consumed n bytes of yours" (flow control: at most STREAM_WINDOW unconsumed per
       direction, so neither side buffers a fast peer's stream without bound)
"""

from __future__ import annotations

import enum
import math
import struct
from dataclasses import asdict, dataclass, fields
from typing import Any

import msgpack

from protocol.chunks import PROTOCOL_ID as CHUNKS_PROTOCOL_ID
from protocol.messages import TOPIC_DIGESTS_PREFIX

HEADER = struct.Struct("!I")
MAX_FRAME_BYTES = 8 << 20  # > the 1 MiB gossip limit and the stream chunk, with room for msgpack overhead
STREAM_CHUNK = 256 << 10  # bytes per S_DATA frame
STREAM_WINDOW = 4 << 20  # unconsumed stream bytes allowed in flight per direction
MAX_SCORES = 4096  # peers in one SCORES table
MAX_PEER_ID_CHARS = 128  # a base58 peer id is ~52


class IpcError(Exception):
    """A malformed frame between the node and its network host."""


class Op(enum.IntEnum):
    HELLO = 1
    CALL = 2
    VERDICT = 3
    SCORES = 4
    READY = 10
    RESULT = 11
    DELIVER = 12
    VALIDATE = 13
    S_OPEN = 14
    S_DATA = 20
    S_CLOSE = 21
    S_RESET = 22
    S_CREDIT = 23


@dataclass(frozen=True)
class HostSettings:
    """Network-host knobs (DESIGN.md, measured on py-libp2p 0.8.1); sent to the host in HELLO.

    listen/announce: multiaddrs without /p2p. heartbeat_s: gossipsub heartbeat (library default 120 s is far too
    slow to form a mesh). queue_size: per-peer outbound RPC queue (library default 32 drops silently when full).
    high_water: our publish waits while any peer's queue holds this many RPCs; slow_peer_wait_s: how long it
    waits before publishing anyway (a peer that stops reading must not stall us; the miss is counted and logged).
    small_mesh_*: the mesh bounds and IHAVE fan-out of the topics under small_mesh_prefix (router.py: GRAFTs past
    the high bound are refused), "" for none; idontwant_min_bytes: no IDONTWANT for smaller messages (router.py).
    seen_ttl_s/sweep_s: gossipsub seen-cache (tests shorten it to exercise replays after it forgets).
    validation_timeout_s: a node that does not answer a VALIDATE in time makes the message IGNOREd.
    Gossipsub v1.1 peer score (py-libp2p's `ScoreParams`; host.score_params): invalid_penalty is P4's
    weight (score lost per REJECTed message), app_score_weight P6's (times the node's pushed reputation score,
    SCORES), behaviour_penalty P5's (protocol misbehaviour the library counts, past behaviour_threshold).
    Thresholds, 0 > gossip > publish > graylist as the spec requires: under gossip_threshold no gossip to or from
    the peer; under publish_threshold its forwarded messages are dropped unread and we do not publish to it; under
    graylist_threshold all its RPCs are ignored. These are gossipsub score units, not the node's reputation units
    ([peers] graylist_score, -20 by default): the node pushes its own score for a peer it tolerates (above
    graylist_score: with the defaults above every threshold here) and reputation.BLOCKED_APP_SCORE (-1000, below all of
    them) for a peer it has graylisted, banned or denied. crash_guards: False only to test that the supervisor restarts
    a dead host. NAT traversal (nat.py): rendezvous is the DHT key's name (the swarm topic; "" turns the DHT off),
    looked up every dht_interval_s; autonat_confirmations distinct AutoNAT servers must dial us back before we call
    ourselves public; relay_service on | off | auto (serve as a relay once public); relay_reservations: relays we keep a
    slot on while not public; relay_max_*: what we grant as a relay (reservations, concurrent circuits),
    relay_circuit_bytes / relay_circuit_s: bytes and seconds one relayed circuit may use. hole_punch: run DCUtR, which
    tries to turn each relayed connection into a direct one. no_relay_protocols: stream protocols we never serve over a
    relayed connection (policy-delta chunks: a node reachable only through a relay would spend the relay's bandwidth;
    the puller moves on to the next holder, the source last). upnp: ask the router to forward our TCP listen port by
    UPnP before AutoNAT's first round (upnp.py); off here because it changes the router of whoever runs the host
    (tests, benches), on in `join` (network.upnp).
    Floods (dht.py, relay.py; docs/NAT.md): every incoming DHT request and relay HOP request (RESERVE,
    CONNECT) takes a token from its peer's bucket (dht_peer_burst at once, refilled at dht_peer_rate per second;
    relay_peer_*) and from one bucket for all peers (dht_total_*, relay_total_*); without one it is refused
    before py-libp2p reads it. dht_max_record_bytes bounds a PUT_VALUE record and an ADD_PROVIDER provider entry;
    dht_max_records bounds each store (provider records, values) and dht_max_records_per_peer what one peer may
    have in each. relay_max_circuits_total: circuits we relay at once, all peers together (relay_max_circuits is
    per peer, as source or as destination). forward_peer_rate/forward_peer_burst: unseen messages one forwarder
    may make us validate (a signature check, then a VALIDATE round trip to the node), and forward_total_*: all
    forwarders together; past either the message is ignored unread and unpenalised (another mesh peer or gossip
    delivers it again). The node's per-signer rate (peers.max_messages_per_s) cannot bound this: a forwarder may
    relay messages of any number of fresh identities.
    """

    listen: tuple[str, ...] = ("/ip4/0.0.0.0/tcp/0",)
    announce: tuple[str, ...] = ()
    heartbeat_s: int = 1
    degree: int = 6
    degree_low: int = 4
    degree_high: int = 12
    # Bounded fan-in's digest topics (router.py's small meshes; docs/SWARM_SCALE.md): a node gets about one copy of
    # each digest batch per mesh peer, so their mesh bound is what bounds its inbound digest bytes.
    small_mesh_prefix: str = TOPIC_DIGESTS_PREFIX
    small_mesh_degree: int = 3
    small_mesh_degree_low: int = 2
    small_mesh_degree_high: int = 4
    small_mesh_lazy: int = 2
    idontwant_min_bytes: int = 1024
    queue_size: int = 256
    high_water: int = 192
    slow_peer_wait_s: float = 5.0
    max_message_bytes: int = 1 << 20
    seen_ttl_s: int = 120
    sweep_s: int = 60
    validation_timeout_s: float = 5.0
    invalid_penalty: float = 10.0
    app_score_weight: float = 1.0
    behaviour_penalty: float = 1.0
    behaviour_threshold: float = 20.0
    gossip_threshold: float = -50.0
    publish_threshold: float = -100.0
    graylist_threshold: float = -200.0
    connect_timeout_s: float = 10.0
    crash_guards: bool = True
    rendezvous: str = ""
    dht_interval_s: float = 5.0
    autonat_confirmations: int = 3
    autonat_interval_s: float = 5.0
    relay_service: str = "auto"
    relay_reservations: int = 2
    relay_max_reservations: int = 32
    relay_max_circuits: int = 16
    relay_circuit_bytes: int = 64 << 20
    relay_circuit_s: int = 3600
    hole_punch: bool = True
    upnp: bool = False
    no_relay_protocols: tuple[str, ...] = (CHUNKS_PROTOCOL_ID,)
    dht_peer_rate: float = 2.0
    dht_peer_burst: int = 32
    dht_total_rate: float = 50.0
    dht_total_burst: int = 256
    dht_max_record_bytes: int = 10 << 10  # IPNS's own limit for a record; ours are provider records of ~1 KiB
    dht_max_records: int = 1024
    dht_max_records_per_peer: int = 32
    relay_peer_rate: float = 1.0
    relay_peer_burst: int = 32
    relay_total_rate: float = 20.0
    relay_total_burst: int = 256
    relay_max_circuits_total: int = 64
    # An honest forwarder relays each signer's messages once: 10 signers at the per-signer cap (5/s) make 50/s.
    forward_peer_rate: float = 50.0
    forward_peer_burst: int = 500
    forward_total_rate: float = 200.0
    forward_total_burst: int = 2000

    def to_wire(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_wire(cls, obj: dict[str, Any]) -> HostSettings:
        known = {f.name for f in fields(cls)}
        unknown = set(obj) - known
        if unknown:
            raise IpcError(f"unknown host settings {sorted(unknown)}")
        values = {k: tuple(v) if isinstance(v, list) else v for k, v in obj.items()}
        return cls(**values)


def check_scores(obj: Any) -> dict[str, float]:
    """A SCORES table as the host keeps it: peer id -> finite float, at most MAX_SCORES entries (IpcError if not)."""
    if not isinstance(obj, dict) or len(obj) > MAX_SCORES:
        raise IpcError(f"SCORES must be a mapping of at most {MAX_SCORES} peers")
    out: dict[str, float] = {}
    for peer, score in obj.items():
        if (not isinstance(peer, str) or len(peer) > MAX_PEER_ID_CHARS or isinstance(score, bool)
                or not isinstance(score, (int, float)) or not math.isfinite(score)):
            raise IpcError(f"bad SCORES entry {peer!r}: {score!r}")
        out[peer] = float(score)
    return out


def encode(op: Op, *fields_: Any) -> bytes:
    body = msgpack.packb([int(op), *fields_], use_bin_type=True)
    if len(body) > MAX_FRAME_BYTES:
        raise IpcError(f"frame of {len(body)} bytes exceeds {MAX_FRAME_BYTES}")
    return HEADER.pack(len(body)) + body


class FrameDecoder:
    """Incremental decoder: feed bytes, get complete frames."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[tuple[Op, list[Any]]]:
        self._buf += data
        out: list[tuple[Op, list[Any]]] = []
        while len(self._buf) >= HEADER.size:
            (length,) = HEADER.unpack_from(self._buf)
            if length > MAX_FRAME_BYTES:
                raise IpcError(f"frame of {length} bytes exceeds {MAX_FRAME_BYTES}")
            end = HEADER.size + length
            if len(self._buf) < end:
                break
            body = bytes(self._buf[HEADER.size:end])
            del self._buf[:end]
            out.append(_parse(body))
        return out

    @property
    def pending(self) -> int:
        return len(self._buf)


def _parse(body: bytes) -> tuple[Op, list[Any]]:
    try:
        obj = msgpack.unpackb(body, raw=False)
    except (ValueError, msgpack.ExtraData) as exc:
        raise IpcError(f"undecodable frame: {exc}") from exc
    if not isinstance(obj, list) or not obj or not isinstance(obj[0], int):
        raise IpcError("frame is not [op, ...]")
    try:
        op = Op(obj[0])
    except ValueError:
        raise IpcError(f"unknown op {obj[0]}") from None
    return op, obj[1:]
