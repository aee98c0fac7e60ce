"""The client side of `/swarm-node/chunks/1`: pull chunks for a `protocol.relay.Receiver` and carry out what it
asks (relaying, fetching), and ask a peer for its catalog.

Contract: `start(held, receiver)` runs the receiver for a held version: each `Request(peer, chunks)` becomes a
pull task (one stream, chunks read in order, each fed to the receiver as it arrives, so that a relay serves it at
once); a failed, refused or stalled stream reports the peer failed, which moves what it owed to the next holder.
On `Complete` the version keeps the whole payload, its `done` is set, and a version received through a relay plan
is handed to `deliver(announce, payload)`; on `Failed` it records the error, fails `done` and closes its streams.
Receiver counters are added to `stats` once a version completes or fails. A chunk that fails its SHA-256 is
also reported as `on_peer_event(peer, "bad_chunk")` (if given: the node's reputation; never raises into a pull).
A relay that `blocked(peer)` says is graylisted, banned or denied (the node's peer guard, if given) is never pulled
from: its request fails at once, before any stream is opened, and what it owed moves to the next holder; the
owner of the policy (the source, whose chunks are checked against its own signed digests) is always pulled from.
`catalog(peer, owner)` lists the versions a peer holds (untrusted unless the peer is the owner);
`trusted_announce` gets one from the owner.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from protocol.chunks import (
    PROTOCOL_ID,
    AnnounceFrame,
    AnnounceRequest,
    ChunkHeader,
    ChunkRequest,
    ErrorFrame,
    decode_response,
    encode_frame,
)
from protocol.codec import decode
from protocol.errors import Verdict, WireError
from protocol.limits import Limits
from protocol.messages import PolicyAnnounce, policy_owner
from protocol.relay import Action, Cancel, Complete, Failed, Receiver, Request, Stored
from swarm_node.policy_sync.store import BroadcastError, BroadcastStats, HeldVersion
from swarm_node.policy_sync.streams import StreamIO, TaskSet, reset_quietly
from swarm_node.transport.base import Stream, Transport, TransportError

log = logging.getLogger(__name__)

MAX_CATALOG = 256  # announces accepted from one catalog answer


class _PeerFailed(Exception):
    """The peer we pull from refused, broke the protocol or stalled."""


class ChunkPuller:
    """Drives receivers over `transport`; see the module docstring."""

    def __init__(self, transport: Transport, io: StreamIO, limits: Limits, stats: BroadcastStats, tasks: TaskSet,
                 deliver: Callable[[PolicyAnnounce, bytes], None],
                 on_peer_event: Callable[[str, str], None] | None = None,
                 blocked: Callable[[str], bool] | None = None) -> None:
        self.transport = transport
        self.io = io
        self.limits = limits
        self.stats = stats
        self.tasks = tasks
        self.deliver = deliver
        self.on_peer_event = on_peer_event
        self.blocked = blocked

    def start(self, held: HeldVersion, receiver: Receiver) -> None:
        held.receiver = receiver
        self.apply(held, receiver.start())

    def apply(self, held: HeldVersion, actions: list[Action]) -> None:
        """Carry out what the relay state machine asks for."""
        for action in actions:
            if isinstance(action, Request):
                pulls = held.pulls.setdefault(action.peer, set())
                self.tasks.spawn(self._pull(held, action.peer, action.chunks), pulls)
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

    def _complete(self, held: HeldVersion) -> None:
        assert held.receiver is not None
        held.payload = held.receiver.payload()
        self._count_receiver(held.receiver)
        held.receiver = None  # the payload now serves every chunk; drop the per-chunk copies
        self.stats.completed += 1
        held.done.set_result(held.payload)
        held.changed.notify()
        if held.queue_when_done:
            self.deliver(held.announce, held.payload)

    def _fail(self, held: HeldVersion, reason: str) -> None:
        log.warning("policy %s v%d failed: %s", held.announce.owner, held.announce.version, reason)
        self.stats.failed += 1
        if held.receiver is not None:
            self._count_receiver(held.receiver)
        held.error = reason
        held.receiver = None
        held.fail_done(BroadcastError(f"{held.announce.owner} v{held.announce.version}: {reason}"))
        held.changed.notify()
        self.tasks.spawn(held.close_streams())

    def _count_receiver(self, receiver: Receiver) -> None:
        self.stats.bad_chunks += receiver.stats.bad_chunks
        self.stats.peer_failures += receiver.stats.failed_peers
        self.stats.reassigned += receiver.stats.reassigned

    async def _pull(self, held: HeldVersion, peer: str, chunks: tuple[int, ...]) -> None:
        """Pull `chunks` from `peer` in order, feeding each to the receiver as it arrives."""
        receiver = held.receiver
        announce = held.announce
        stream: Stream | None = None
        finished = False
        try:
            if self.refuses(peer, announce):
                raise _PeerFailed("blocked by our reputation")
            stream = await self.transport.open_stream(peer, PROTOCOL_ID)
            held.streams.setdefault(peer, set()).add(stream)
            await stream.write(encode_frame(ChunkRequest(announce.owner, announce.version, announce.base_version,
                                                         chunks)))
            await stream.close()
            for k in chunks:
                frame = await self.io.read_frame(stream, decode_response)
                if isinstance(frame, ErrorFrame):
                    raise _PeerFailed(f"refused: {frame.reason}")
                if not isinstance(frame, ChunkHeader) or frame.chunk != k:
                    raise WireError("unexpected_frame", Verdict.REJECT, f"expected chunk {k}, got {frame}")
                data = await self.io.read_chunk(stream, held.length(k))
                if receiver is not held.receiver or receiver is None:
                    return  # the version completed, failed or was evicted meanwhile
                bad_before = receiver.stats.bad_chunks
                self.apply(held, receiver.on_chunk(peer, k, data))
                if receiver.stats.bad_chunks > bad_before:
                    self.report(peer, "bad_chunk")
                if peer in receiver.dead or receiver.state != "running":
                    return
            finished = await self.io.read_frame(stream, decode_response, eof_ok=True) is None  # the server's close
        except (TransportError, WireError, _PeerFailed, asyncio.TimeoutError) as exc:
            if isinstance(exc, WireError):
                self.stats.protocol_errors[exc.reason] += 1
            if receiver is not None and receiver is held.receiver and receiver.state == "running":
                log.info("pull of %s v%d from %s failed: %s", announce.owner, announce.version, peer,
                         exc or type(exc).__name__)
                self.apply(held, receiver.on_peer_failed(peer))
        finally:
            if stream is not None:
                held.streams.get(peer, set()).discard(stream)
                if not finished:
                    await reset_quietly(stream)

    def refuses(self, peer: str, announce: PolicyAnnounce) -> bool:
        """Whether `peer` is a relay we do not pull from (blocked); never the policy's owner."""
        return (self.blocked is not None and peer != policy_owner(announce.owner) and self.blocked(peer))

    def report(self, peer: str, reason: str) -> None:
        """A peer misbehaved on a chunk stream: tell the hook (its failure is logged, never raised)."""
        if self.on_peer_event is None:
            return
        try:
            self.on_peer_event(peer, reason)
        except Exception:  # a hook bug must not break the pull that found the bad peer
            log.exception("on_peer_event(%s, %s) failed", peer, reason)

    async def catalog(self, peer: str, owner: str) -> list[PolicyAnnounce]:
        """The versions of `owner` that `peer` holds (complete), oldest first. Untrusted unless peer is the owner."""
        stream = await self.transport.open_stream(peer, PROTOCOL_ID)
        out: list[PolicyAnnounce] = []
        finished = False
        try:
            await stream.write(encode_frame(AnnounceRequest(owner)))
            await stream.close()
            while len(out) < MAX_CATALOG:
                frame = await self.io.read_frame(stream, decode_response, eof_ok=True)
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
                await reset_quietly(stream)
        return out

    async def trusted_announce(self, owner: str, version: int, base_version: int,
                               from_peers: Sequence[str]) -> PolicyAnnounce:
        """The owner's own announce of a version (asked over its stream), if the owner is among `from_peers`."""
        source = policy_owner(owner)
        if source in from_peers:
            for announce in await self.catalog(source, owner):
                if (announce.version, announce.base_version) == (version, base_version):
                    return announce
            raise BroadcastError(f"the owner {source} does not hold {owner} v{version} (base {base_version})")
        raise BroadcastError(f"no trusted announce for {owner} v{version}: it was not seen on gossip and the owner "
                             f"is not among the peers to fetch from")
