"""Pipelined broadcast of policy payloads (deltas, snapshots) over any `Transport`: announce on gossip, pull
chunks over the `/swarm-node/chunks/1` stream protocol along the relay plan in the announce.

Parts (this module is the facade that wires them): `store` (held versions, stats), `serve` (answering chunk and
catalog requests), `pull` (pulling, relaying, catalogs), `streams` (bounded reads, shaping, background tasks).

Contract:
- `PolicyBroadcaster(transport, limits=..., chunk_bytes=1 MiB, schedule=DEFAULT_SCHEDULE, keep=8, ...)`; `await start()`
  serves the chunk protocol and takes over TOPIC_POLICY (validator: protocol.validation.validate_gossip, so
  limits, schema, owner == signer, freshness and replay; then subscribe). `await stop()` ends its tasks and streams.
- Source side: `await publish(owner, version, base_version, encoding, payload, state_sha256, receivers)` splits
  the payload into chunks of at most chunk_bytes, gossips a `PolicyAnnounce` (chunk digests, schedule, receivers)
  and serves the chunks; it returns the announce once it is gossiped, not once everyone has the payload.
- Receiver side: an accepted announce that lists this node runs a `protocol.relay.Receiver` for the plan: each
  stripe is pulled from its parent, and every verified chunk is served at once to the children waiting for it (a
  relay forwards chunk k as soon as it has it). A bad chunk or a failed/stalled peer moves the chunks still owed to
  the next ancestor (the source last), and the peer that sent a bad chunk is reported to `on_peer_event(peer,
  "bad_chunk")` (a plain hook: the worker role scores it in its reputation, as for a bad gossip peer); a relay that
  `blocked(peer)` names (the node's peer guard: graylisted, banned, denied) is not pulled from at all. A
  complete, verified payload goes to `completed` (an asyncio.Queue of (announce, payload), oldest dropped past
  `keep` unread entries) and to `on_payload` if given. (What `fetch` pulls is returned to its caller instead.)
- Payloads are keyed by (owner, version, base_version): the delta to v and the snapshot of v are different ones.
  Every node holds the newest `keep` payloads per owner (complete or being relayed) and serves them:
  `await fetch(owner, version, from_peers, base_version=None)` pulls one spread over holders (a late joiner with no
  base fetches a snapshot, the default; what a peer holds is listed by `await catalog(peer, owner)`).
- Trust: chunk digests come only from an announce the owner signed on gossip, or one the owner itself served over
  a stream (streams are authenticated by the transport), never from a third party.
- Every read is bounded in size (protocol.chunks frame limits, chunk lengths from the announce) and in time
  (`stall_s` without progress fails the peer). A bad frame is answered with an error frame and the stream closed.
- `shaper` (swarm_node.transport.shaping.Shaper) throttles chunk bytes sent and received: app-level bandwidth
  shaping for benchmarks and simulations.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Callable, Collection, Sequence

from protocol.chunks import PROTOCOL_ID
from protocol.codec import decode, encode
from protocol.errors import WireError
from protocol.limits import Limits
from protocol.messages import TOPIC_POLICY, PolicyAnnounce, policy_owner
from protocol.relay import DEFAULT_SCHEDULE, Receiver, ScheduleError, chunk_count_for, chunk_digests, make_plan, split
from protocol.validation import AcceptPolicy, ReplayGuard, validate_gossip
from swarm_node.policy_sync.pull import ChunkPuller
from swarm_node.policy_sync.serve import ChunkServer
from swarm_node.policy_sync.store import BroadcastError, BroadcastStats, HeldVersion, VersionStore, key_of
from swarm_node.policy_sync.streams import StreamIO, TaskSet
from swarm_node.transport.base import Delivery, Transport, ValidationResult
from swarm_node.transport.shaping import Shaper

__all__ = ["BroadcastError", "BroadcastStats", "PolicyBroadcaster"]

log = logging.getLogger(__name__)


class PolicyBroadcaster:
    """See the module docstring."""

    def __init__(self, transport: Transport, *, limits: Limits | None = None, chunk_bytes: int = 1 << 20,
                 schedule: str = DEFAULT_SCHEDULE, keep: int = 8, follows: Collection[str] | None = None,
                 shaper: Shaper | None = None, stall_s: float = 30.0, announce_wait_s: float = 10.0,
                 on_payload: Callable[[PolicyAnnounce, bytes], None] | None = None,
                 on_peer_event: Callable[[str, str], None] | None = None,
                 blocked: Callable[[str], bool] | None = None,
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
        self._tasks = TaskSet()
        self._store = VersionStore(keep, self._tasks.spawn)
        self._versions = self._store.versions  # the same dict (tests reach in to forget what gossip delivered)
        io = StreamIO(self.limits, stall_s, self.shaper, self.stats)
        self._server = ChunkServer(self._store, io, self.stats, announce_wait_s)
        self._puller = ChunkPuller(transport, io, self.limits, self.stats, self._tasks, self._deliver,
                                  on_peer_event, blocked)

    # ------------------------------------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        await self.transport.serve_stream(PROTOCOL_ID, self._server.serve)
        self.transport.set_validator(TOPIC_POLICY, self._validate)
        await self.transport.subscribe(TOPIC_POLICY, self._on_delivery)

    async def stop(self) -> None:
        await self._tasks.cancel_all()
        for version in self._versions.values():
            await version.close_streams()
            version.fail_done(BroadcastError("broadcaster stopped"))

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
        held = self._store.remember(announce)
        held.payload = bytes(payload)
        held.done.set_result(held.payload)
        self._store.announced.notify()
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
        key = key_of(announce)
        if key in self._versions or (self.follows is not None and announce.owner not in self.follows):
            return
        held = self._store.remember(announce)
        self._store.announced.notify()
        if self._versions.get(key) is not held:
            return  # older than every version we keep
        if self.transport.peer_id not in announce.receivers or not announce.chunk_sha256:
            return
        try:
            plan = make_plan(announce.schedule, policy_owner(announce.owner), announce.receivers)
        except ScheduleError as exc:  # e.g. a newer peer's schedule: we do not relay, our children fall back
            log.warning("announce %s v%d: %s", announce.owner, announce.version, exc)
            return
        receiver = Receiver.in_plan(plan, self.transport.peer_id, announce.chunk_sha256, announce.sha256)
        held.queue_when_done = True
        self._puller.start(held, receiver)

    async def fetch(self, owner: str, version: int, from_peers: Sequence[str],
                    base_version: int | None = None) -> tuple[PolicyAnnounce, bytes]:
        """Pull a payload we do not hold from `from_peers` (spread over them, each falling back to the next):
        the snapshot of `version` by default, the delta from `base_version` to `version` if given.

        The announce must be trusted: seen on gossip, or served by the owner itself (its peer id among
        from_peers). Raises BroadcastError if none is, or if the payload cannot be completed (TransportError if
        the owner cannot be reached for its announce)."""
        base = version if base_version is None else base_version
        held: HeldVersion | None = self._versions.get((owner, version, base))
        if held is None or held.error:  # unknown, or an earlier attempt failed: start afresh
            announce = held.announce if held is not None else \
                await self._puller.trusted_announce(owner, version, base, from_peers)
            held = self._store.remember(announce)
        if held.payload is None and held.receiver is None:
            peers = [p for p in dict.fromkeys(from_peers) if p != self.transport.peer_id]
            if not peers or not held.announce.chunk_sha256:
                raise BroadcastError(f"{owner} v{version}: no peers to fetch from, or no chunk digests announced")
            self._puller.start(held, Receiver.from_holders(peers, held.announce.chunk_sha256, held.announce.sha256))
        return held.announce, await asyncio.shield(held.done)

    async def catalog(self, peer: str, owner: str) -> list[PolicyAnnounce]:
        """The versions of `owner` that `peer` holds (complete), oldest first. Untrusted unless peer is the owner."""
        return await self._puller.catalog(peer, owner)

    def held(self, owner: str) -> list[PolicyAnnounce]:
        """Announces of `owner`'s versions this node holds complete, oldest first."""
        return self._store.held(owner)

    def payload(self, owner: str, version: int, base_version: int) -> bytes | None:
        return self._store.payload((owner, version, base_version))

    def progress(self, owner: str, version: int, base_version: int) -> tuple[int, int] | None:
        """(chunks held, chunk count) of a payload this node knows, else None."""
        return self._store.progress((owner, version, base_version))

    # ------------------------------------------------------------------------------------------------ internals
    def _deliver(self, announce: PolicyAnnounce, payload: bytes) -> None:
        """A payload received through a relay plan: to `completed` (the newest `keep` unread) and `on_payload`."""
        item = (announce, payload)
        if self.completed.qsize() >= self.keep:  # nobody reads: keep the newest, like the version store
            self.completed.get_nowait()
        self.completed.put_nowait(item)
        if self.on_payload is not None:
            self.on_payload(*item)
