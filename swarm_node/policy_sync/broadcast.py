"""Pipelined broadcast of policy payloads (deltas, snapshots) over any `Transport`: announce on gossip, pull
chunks over the `/swarm-node/chunks/1` stream protocol along the relay plan in the announce.

Contract:
- `PolicyBroadcaster(transport, limits=..., chunk_bytes=1 MiB, schedule="stripe:2", keep=8, ...)`; `await start()`
  serves the chunk protocol and takes over TOPIC_POLICY (validator: protocol.validation.validate_gossip, so
  limits, schema, owner == signer, freshness and replay; then subscribe). `await stop()` ends its tasks and streams.
- Source side: `await publish(owner, version, base_version, encoding, payload, state_sha256, receivers)` splits
  the payload into chunks of at most chunk_bytes, gossips a `PolicyAnnounce` (chunk digests, schedule, receivers)
  and serves the chunks; it returns the announce once it is gossiped, not once everyone has the payload.
- Receiver side: an accepted announce that lists this node runs a `protocol.relay.Receiver` for the plan: each
  stripe is pulled from its parent, and every verified chunk is served at once to the children waiting for it (a
  relay forwards chunk k as soon as it has it). A bad chunk or a failed/stalled peer moves the chunks still owed to
  the next ancestor (the source last). A complete, verified payload goes to `completed` (an asyncio.Queue of
  (announce, payload), oldest dropped past `keep` unread entries) and to `on_payload` if given. (What `fetch`
  pulls is returned to its caller instead.)
- Payloads are keyed by (owner, version, base_version): the delta to v and the snapshot of v are different ones.
  Every node holds the newest `keep` payloads per owner (complete or being relayed) and serves them:
  `await fetch(owner, version, from_peers, base_version=None)` pulls one spread over holders (a late joiner with no
  base fetches a snapshot, the default; what a peer holds is listed by `await catalog(peer, owner)`).
- Trust: chunk digests come only from an announce the owner signed on gossip, or one the owner itself served over
  a stream (streams are authenticated by the transport), never from a third party.
- Every read is bounded in size (protocol.chunks frame limits, chunk lengths from the announce) and in time
  (`stall_s` without progress fails the peer). A bad frame is answered with an error frame and the stream closed.
- `shaper` (swarm_node.shaping.Shaper) throttles chunk bytes sent and received: app-level bandwidth shaping for
  benchmarks and simulations.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from protocol.chunks import (
    LENGTH_BYTES,
    PROTOCOL_ID,
    AnnounceFrame,
    AnnounceRequest,
    ChunkHeader,
    ChunkRequest,
    ErrorFrame,
    decode_request,
    decode_response,
    encode_frame,
    frame_length,
)
from protocol.codec import decode, encode
from protocol.errors import Verdict, WireError
from protocol.limits import Limits
from protocol.messages import TOPIC_POLICY, PolicyAnnounce, policy_owner
from protocol.relay import (
    DEFAULT_SCHEDULE,
    Action,
    Cancel,
    Complete,
    Failed,
    Receiver,
    Request,
    ScheduleError,
    Stored,
    chunk_count_for,
    chunk_digests,
    chunk_span,
    make_plan,
    split,
)
from protocol.validation import AcceptPolicy, ReplayGuard, validate_gossip
from swarm_node.transport.base import Delivery, Stream, Transport, TransportError, ValidationResult
from swarm_node.transport.shaping import Shaper

log = logging.getLogger(__name__)

PIECE_BYTES = 64 << 10  # unit of shaped reads and writes: small enough that streams sharing a link interleave
MAX_CATALOG = 256  # announces accepted from one catalog answer
# (owner policy id, version, base_version): a delta to v and the snapshot of v are different payloads.
Key = tuple[str, int, int]


def _key(announce: PolicyAnnounce) -> Key:
    return announce.owner, announce.version, announce.base_version


class BroadcastError(Exception):
    """A broadcast operation cannot be done (nothing trusted to fetch, a payload that failed verification)."""


class _PeerFailed(Exception):
    """The peer we pull from refused, broke the protocol or stalled."""


@dataclass
class BroadcastStats:
    published: int = 0
    completed: int = 0
    failed: int = 0
    bad_chunks: int = 0  # chunks that failed their SHA-256 (then pulled from another holder)
    peer_failures: int = 0  # peers dropped mid-pull (broken stream, stall, error frame, bad chunk)
    # (bad_chunks, peer_failures and reassigned are added when a version completes or fails)
    reassigned: int = 0  # chunks moved to another holder
    served_chunks: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    protocol_errors: Counter[str] = field(default_factory=Counter)  # bad frames from peers, by reason


class _Signal:
    """Wake every waiter when something changed (a chunk stored, a version announced)."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def notify(self) -> None:
        self._event.set()
        self._event = asyncio.Event()

    async def wait_until(self, predicate: Callable[[], bool], timeout: float) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not predicate():
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            try:
                await asyncio.wait_for(self._event.wait(), remaining)
            except asyncio.TimeoutError:
                return predicate()
        return True


class _Version:
    """One payload version this node holds, is receiving, or only knows the announce of."""

    def __init__(self, announce: PolicyAnnounce) -> None:
        self.announce = announce  # always from the owner: its gossip signature, its own stream, or ourselves
        self.payload: bytes | None = None
        self.receiver: Receiver | None = None
        self.queue_when_done = False  # received through a relay plan (fetch returns its result instead)
        self.error: str = ""
        self.changed = _Signal()
        self.done: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self.pulls: dict[str, set[asyncio.Task[None]]] = {}
        self.streams: dict[str, set[Stream]] = {}

    def chunk(self, k: int) -> bytes | None:
        if self.payload is not None:
            return self.payload[slice(*chunk_span(self.announce.size, self.announce.chunk_count, k))]
        return self.receiver.chunk(k) if self.receiver is not None else None

    def length(self, k: int) -> int:
        start, stop = chunk_span(self.announce.size, self.announce.chunk_count, k)
        return stop - start


class PolicyBroadcaster:
    """See the module docstring."""

    def __init__(self, transport: Transport, *, limits: Limits | None = None, chunk_bytes: int = 1 << 20,
                 schedule: str = DEFAULT_SCHEDULE, keep: int = 8, follows: Collection[str] | None = None,
                 shaper: Shaper | None = None, stall_s: float = 30.0, announce_wait_s: float = 10.0,
                 on_payload: Callable[[PolicyAnnounce, bytes], None] | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.limits = limits or Limits()
        if not 1 <= chunk_bytes <= self.limits.max_chunk_bytes:
            raise ValueError(f"chunk_bytes must be in [1, {self.limits.max_chunk_bytes}], got {chunk_bytes}")
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        make_plan(schedule, "source", ["receiver"])  # an unknown schedule fails here, not on the first publish
        self.transport = transport
        self.chunk_bytes = chunk_bytes
        self.schedule = schedule
        self.keep = keep
        self.follows = frozenset(follows) if follows is not None else None
        self.shaper = shaper or Shaper()
        self.stall_s = stall_s
        self.announce_wait_s = announce_wait_s
        self.on_payload = on_payload
        self.clock = clock
        self.stats = BroadcastStats()
        self.completed: asyncio.Queue[tuple[PolicyAnnounce, bytes]] = asyncio.Queue()
        self._replay = ReplayGuard(self.limits.max_age_s)
        self._accept = AcceptPolicy(tasks=frozenset(), max_index=1)  # announces carry no task references
        self._versions: dict[Key, _Version] = {}
        self._announced = _Signal()
        self._tasks: set[asyncio.Task[Any]] = set()

    # ------------------------------------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        await self.transport.serve_stream(PROTOCOL_ID, self._serve)
        self.transport.set_validator(TOPIC_POLICY, self._validate)
        await self.transport.subscribe(TOPIC_POLICY, self._on_delivery)

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for version in self._versions.values():
            await self._close_streams(version)
            if not version.done.done():
                version.done.set_exception(BroadcastError("broadcaster stopped"))
                version.done.exception()  # retrieved: nobody may be waiting on it

    # ---------------------------------------------------------------------------------------------- source side
    async def publish(self, owner: str, version: int, base_version: int, encoding: str, payload: bytes,
                      state_sha256: str, receivers: Sequence[str], schedule: str | None = None) -> PolicyAnnounce:
        """Announce `payload` as `owner`'s `version` and serve it; `receivers` (peer ids, in the order the plan
        uses) pull it along the relay plan. With no receivers the version is only announced and kept for fetch."""
        if policy_owner(owner) != self.transport.peer_id:
            raise ValueError(f"policy {owner!r} is not owned by this node ({self.transport.peer_id})")
        if not payload:
            raise ValueError("empty payload")
        if (owner, version, base_version) in self._versions:
            raise ValueError(f"{owner} v{version} (base {base_version}) was already published")
        count = chunk_count_for(len(payload), self.chunk_bytes)
        digests = chunk_digests(split(payload, count))
        order = tuple(dict.fromkeys(r for r in receivers if r != self.transport.peer_id))
        spec = (schedule or self.schedule) if order else ""
        if order:
            make_plan(spec, self.transport.peer_id, order)
        announce = PolicyAnnounce(
            owner=owner, version=version, base_version=base_version, size=len(payload),
            sha256=hashlib.sha256(payload).digest(), chunk_count=count, encoding=encoding, created_at=self.clock(),
            chunk_sha256=digests, state_sha256=state_sha256, schedule=spec, receivers=order)
        data = encode(announce)
        try:
            decode(data, self.limits)  # what receivers will check: fail here, not silently on every receiver
        except WireError as err:
            raise BroadcastError(f"announce for {owner} v{version} is not valid: {err}") from err
        held = self._remember(announce)
        held.payload = bytes(payload)
        held.done.set_result(held.payload)
        self._announced.notify()
        await self.transport.publish(TOPIC_POLICY, data)
        self.stats.published += 1
        return announce

    # -------------------------------------------------------------------------------------------- receiver side
    def _validate(self, signer: str, data: bytes) -> ValidationResult:
        result = validate_gossip(TOPIC_POLICY, data, signer, limits=self.limits, policy=self._accept,
                                 now=self.clock(), replay=self._replay)
        return ValidationResult.of(result.verdict)

    def _on_delivery(self, delivery: Delivery) -> None:
        try:
            announce = decode(delivery.data, self.limits)
        except WireError:  # passed the validator, so this does not happen; never let it reach the transport
            return
        if isinstance(announce, PolicyAnnounce):
            self.on_announce(announce)

    def on_announce(self, announce: PolicyAnnounce) -> None:
        """An owner-signed announce (from gossip): remember it; join its relay plan if it lists us."""
        key = _key(announce)
        if key in self._versions or (self.follows is not None and announce.owner not in self.follows):
            return
        held = self._remember(announce)
        self._announced.notify()
        if self._versions.get(key) is not held:
            return  # older than every version we keep
        if self.transport.peer_id not in announce.receivers or not announce.chunk_sha256:
            return
        try:
            plan = make_plan(announce.schedule, policy_owner(announce.owner), announce.receivers)
        except ScheduleError as exc:  # e.g. a newer peer's schedule: we do not relay, our children fall back
            log.warning("announce %s v%d: %s", announce.owner, announce.version, exc)
            return
        held.receiver = Receiver.in_plan(plan, self.transport.peer_id, announce.chunk_sha256, announce.sha256)
        held.queue_when_done = True
        self._apply(held, held.receiver.start())

    async def fetch(self, owner: str, version: int, from_peers: Sequence[str],
                    base_version: int | None = None) -> tuple[PolicyAnnounce, bytes]:
        """Pull a payload we do not hold from `from_peers` (spread over them, each falling back to the next):
        the snapshot of `version` by default, the delta from `base_version` to `version` if given.

        The announce must be trusted: seen on gossip, or served by the owner itself (its peer id among
        from_peers). Raises BroadcastError if none is, or if the payload cannot be completed (TransportError if
        the owner cannot be reached for its announce)."""
        base = version if base_version is None else base_version
        held = self._versions.get((owner, version, base))
        if held is None or held.error:  # unknown, or an earlier attempt failed: start afresh
            announce = held.announce if held is not None else \
                await self._trusted_announce(owner, version, base, from_peers)
            held = self._remember(announce)
        if held.payload is None and held.receiver is None:
            peers = [p for p in dict.fromkeys(from_peers) if p != self.transport.peer_id]
            if not peers or not held.announce.chunk_sha256:
                raise BroadcastError(f"{owner} v{version}: no peers to fetch from, or no chunk digests announced")
            held.receiver = Receiver.from_holders(peers, held.announce.chunk_sha256, held.announce.sha256)
            self._apply(held, held.receiver.start())
        return held.announce, await asyncio.shield(held.done)

    async def catalog(self, peer: str, owner: str) -> list[PolicyAnnounce]:
        """The versions of `owner` that `peer` holds (complete), oldest first. Untrusted unless peer is the owner."""
        stream = await self.transport.open_stream(peer, PROTOCOL_ID)
        out: list[PolicyAnnounce] = []
        finished = False
        try:
            await stream.write(encode_frame(AnnounceRequest(owner)))
            await stream.close()
            while len(out) < MAX_CATALOG:
                frame = await self._read_frame(stream, decode_response, eof_ok=True)
                if frame is None:
                    finished = True
                    break
                if isinstance(frame, ErrorFrame):
                    raise BroadcastError(f"{peer} refused the catalog request: {frame.reason}")
                if not isinstance(frame, AnnounceFrame):
                    raise BroadcastError(f"{peer} answered a catalog request with {type(frame).__name__}")
                msg = decode(frame.data, self.limits)
                if isinstance(msg, PolicyAnnounce) and msg.owner == owner:
                    out.append(msg)
        except WireError as err:
            self.stats.protocol_errors[err.reason] += 1
            raise BroadcastError(f"{peer} sent a bad catalog answer: {err}") from err
        finally:
            if not finished:
                await _reset_quietly(stream)
        return out

    def held(self, owner: str) -> list[PolicyAnnounce]:
        """Announces of `owner`'s versions this node holds complete, oldest first."""
        return [v.announce for (o, _, _), v in sorted(self._versions.items(), key=lambda kv: kv[0])
                if o == owner and v.payload is not None]

    def payload(self, owner: str, version: int, base_version: int) -> bytes | None:
        held = self._versions.get((owner, version, base_version))
        return held.payload if held is not None else None

    def progress(self, owner: str, version: int, base_version: int) -> tuple[int, int] | None:
        """(chunks held, chunk count) of a payload this node knows, else None."""
        held = self._versions.get((owner, version, base_version))
        if held is None:
            return None
        count = held.announce.chunk_count
        if held.payload is not None:
            return count, count
        return (count - held.receiver.missing if held.receiver is not None else 0), count

    # ------------------------------------------------------------------------------------------------ internals
    def _remember(self, announce: PolicyAnnounce) -> _Version:
        """Hold a version; past `keep` versions of one owner the oldest is forgotten (its pulls cancelled)."""
        held = _Version(announce)
        self._versions[_key(announce)] = held
        mine = sorted(k for k in self._versions if k[0] == announce.owner)
        for key in mine[:-self.keep]:
            old = self._versions.pop(key)
            self._spawn(self._close_streams(old))
            if not old.done.done():
                old.done.set_exception(BroadcastError(f"{key[0]} v{key[1]} (base {key[2]}) evicted by newer versions"))
                old.done.exception()
            old.error = old.error or "evicted"
            old.changed.notify()
        return held

    def _apply(self, held: _Version, actions: list[Action]) -> None:
        """Carry out what the relay state machine asks for."""
        for action in actions:
            if isinstance(action, Request):
                self._spawn(self._pull(held, action.peer, action.chunks), held.pulls.setdefault(action.peer, set()))
            elif isinstance(action, Cancel):
                current = asyncio.current_task()
                for task in held.pulls.pop(action.peer, set()):
                    if task is not current:
                        task.cancel()
            elif isinstance(action, Stored):
                held.changed.notify()
            elif isinstance(action, Complete):
                self._complete(held)
            elif isinstance(action, Failed):
                self._fail(held, action.reason)

    def _complete(self, held: _Version) -> None:
        assert held.receiver is not None
        held.payload = held.receiver.payload()
        self._count_receiver(held.receiver)
        held.receiver = None  # the payload now serves every chunk; drop the per-chunk copies
        self.stats.completed += 1
        held.done.set_result(held.payload)
        held.changed.notify()
        if not held.queue_when_done:
            return
        item = (held.announce, held.payload)
        if self.completed.qsize() >= self.keep:  # nobody reads: keep the newest, like the version store
            self.completed.get_nowait()
        self.completed.put_nowait(item)
        if self.on_payload is not None:
            self.on_payload(*item)

    def _fail(self, held: _Version, reason: str) -> None:
        log.warning("policy %s v%d failed: %s", held.announce.owner, held.announce.version, reason)
        self.stats.failed += 1
        if held.receiver is not None:
            self._count_receiver(held.receiver)
        held.error = reason
        held.receiver = None
        if not held.done.done():
            held.done.set_exception(BroadcastError(f"{held.announce.owner} v{held.announce.version}: {reason}"))
            held.done.exception()
        held.changed.notify()
        self._spawn(self._close_streams(held))

    def _count_receiver(self, receiver: Receiver) -> None:
        self.stats.bad_chunks += receiver.stats.bad_chunks
        self.stats.peer_failures += receiver.stats.failed_peers
        self.stats.reassigned += receiver.stats.reassigned

    async def _pull(self, held: _Version, peer: str, chunks: tuple[int, ...]) -> None:
        """Pull `chunks` from `peer` in order, feeding each to the receiver as it arrives."""
        receiver = held.receiver
        announce = held.announce
        stream: Stream | None = None
        finished = False
        try:
            stream = await self.transport.open_stream(peer, PROTOCOL_ID)
            held.streams.setdefault(peer, set()).add(stream)
            await stream.write(encode_frame(ChunkRequest(announce.owner, announce.version, announce.base_version,
                                                         chunks)))
            await stream.close()
            for k in chunks:
                frame = await self._read_frame(stream, decode_response)
                if isinstance(frame, ErrorFrame):
                    raise _PeerFailed(f"refused: {frame.reason}")
                if not isinstance(frame, ChunkHeader) or frame.chunk != k:
                    raise WireError("unexpected_frame", Verdict.REJECT, f"expected chunk {k}, got {frame}")
                data = await self._read_chunk(stream, held.length(k))
                if receiver is not held.receiver or receiver is None:
                    return  # the version completed, failed or was evicted meanwhile
                self._apply(held, receiver.on_chunk(peer, k, data))
                if peer in receiver.dead or receiver.state != "running":
                    return
            finished = await self._read_frame(stream, decode_response, eof_ok=True) is None  # the server's close
        except (TransportError, WireError, _PeerFailed, asyncio.TimeoutError) as exc:
            if isinstance(exc, WireError):
                self.stats.protocol_errors[exc.reason] += 1
            if receiver is not None and receiver is held.receiver and receiver.state == "running":
                log.info("pull of %s v%d from %s failed: %s", announce.owner, announce.version, peer,
                         exc or type(exc).__name__)
                self._apply(held, receiver.on_peer_failed(peer))
        finally:
            if stream is not None:
                held.streams.get(peer, set()).discard(stream)
                if not finished:
                    await _reset_quietly(stream)

    async def _serve(self, stream: Stream) -> None:
        """One incoming request: chunks of a version (each sent as soon as we hold it) or our catalog."""
        try:
            request = await self._read_frame(stream, decode_request)
            if await asyncio.wait_for(stream.read(1), self.stall_s) != b"":
                raise WireError("bad_frame", Verdict.REJECT, "data after the request (half-close after it)")
            if isinstance(request, AnnounceRequest):
                for announce in self.held(request.owner):
                    await stream.write(encode_frame(AnnounceFrame(encode(announce))))
            else:
                await self._serve_chunks(stream, request)
            await stream.close()
        except WireError as err:
            self.stats.protocol_errors[err.reason] += 1
            log.info("bad chunk-stream request from %s: %s", stream.remote_peer, err)
            try:
                await stream.write(encode_frame(ErrorFrame(f"{err.reason}: {err.detail}")))
                await stream.close()
            except TransportError:
                pass
        except asyncio.TimeoutError:
            await _reset_quietly(stream)

    async def _serve_chunks(self, stream: Stream, request: ChunkRequest) -> None:
        key = (request.owner, request.version, request.base_version)
        known = await self._announced.wait_until(lambda: key in self._versions, self.announce_wait_s)
        held = self._versions.get(key)
        if not known or held is None:
            await stream.write(encode_frame(ErrorFrame(f"unknown_version: {request.owner} v{request.version}")))
            return
        if request.chunks[-1] >= held.announce.chunk_count:
            raise WireError("bad_index", Verdict.REJECT, f"chunk {request.chunks[-1]} of {held.announce.chunk_count}")
        for k in request.chunks:
            ok = await held.changed.wait_until(lambda k=k: held.chunk(k) is not None or bool(held.error)  # type: ignore[misc]
                                               or (held.payload is None and held.receiver is None), self.stall_s)
            data = held.chunk(k)
            if not ok or data is None:  # we failed, were evicted, or do not relay this version at all
                await stream.write(encode_frame(ErrorFrame(f"not_held: chunk {k} ({held.error or 'not relaying'})")))
                return
            await stream.write(encode_frame(ChunkHeader(k)))
            for start in range(0, len(data), PIECE_BYTES):
                piece = data[start:start + PIECE_BYTES]
                await self.shaper.up(len(piece))
                await stream.write(piece)
            self.stats.served_chunks += 1
            self.stats.bytes_sent += len(data)

    async def _read_frame(self, stream: Stream, decoder: Callable[[bytes, Limits], Any], eof_ok: bool = False) -> Any:
        """One frame, bounded in size before reading its body and in time by stall_s per read.
        With eof_ok, a clean end of stream before the frame returns None."""
        prefix = await asyncio.wait_for(stream.read(LENGTH_BYTES), self.stall_s)
        if not prefix and eof_ok:
            return None
        if len(prefix) < LENGTH_BYTES:
            prefix += await self._read_exactly(stream, LENGTH_BYTES - len(prefix))
        body = await self._read_exactly(stream, frame_length(prefix, self.limits))
        return decoder(body, self.limits)

    async def _read_exactly(self, stream: Stream, n: int) -> bytes:
        parts: list[bytes] = []
        got = 0
        while got < n:
            part = await asyncio.wait_for(stream.read(n - got), self.stall_s)
            if not part:
                raise TransportError(f"stream ended after {got} of {n} bytes")
            parts.append(part)
            got += len(part)
        return b"".join(parts)

    async def _read_chunk(self, stream: Stream, n: int) -> bytes:
        parts: list[bytes] = []
        got = 0
        while got < n:
            part = await asyncio.wait_for(stream.read(min(PIECE_BYTES, n - got)), self.stall_s)
            if not part:
                raise TransportError(f"stream ended inside a chunk ({got} of {n} bytes)")
            await self.shaper.down(len(part))
            parts.append(part)
            got += len(part)
        self.stats.bytes_received += n
        return b"".join(parts)

    async def _trusted_announce(self, owner: str, version: int, base_version: int,
                                from_peers: Sequence[str]) -> PolicyAnnounce:
        source = policy_owner(owner)
        if source in from_peers:
            for announce in await self.catalog(source, owner):
                if (announce.version, announce.base_version) == (version, base_version):
                    return announce
            raise BroadcastError(f"the owner {source} does not hold {owner} v{version} (base {base_version})")
        raise BroadcastError(f"no trusted announce for {owner} v{version}: it was not seen on gossip and the owner "
                             f"is not among the peers to fetch from")

    async def _close_streams(self, held: _Version) -> None:
        for tasks in held.pulls.values():
            for task in tasks:
                if task is not asyncio.current_task():
                    task.cancel()
        for streams in held.streams.values():
            for stream in list(streams):
                await _reset_quietly(stream)

    def _spawn(self, coro: Any, group: set[asyncio.Task[Any]] | None = None) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        if group is not None:
            group.add(task)
            task.add_done_callback(group.discard)


async def _reset_quietly(stream: Stream) -> None:
    try:
        await stream.reset()
    except TransportError:
        pass

