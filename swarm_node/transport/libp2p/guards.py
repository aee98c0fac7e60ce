"""Guards for py-libp2p 0.8.1 pubsub: the two measured remote crashes, application verdicts, library limits, and
per-stream peer bookkeeping (issue 27).

Runs inside the network host (trio). Contract:
- Crash (a): `Pubsub.continuously_read_stream` parses each frame with `rpc_pb2.RPC.ParseFromString`; an invalid
  protobuf raises `google.protobuf.message.DecodeError`, which `Pubsub.stream_handler` does not catch (it catches
  StreamError, ParseError, IncompleteReadError only), so it escapes the connection's nursery and kills the host.
  `GuardedPubsub.stream_handler` catches it (and, as the last line at this trust boundary, any other Exception
  raised while handling one peer's pubsub stream), resets that stream and drops the peer from pubsub.
- Crash (b): `validators.signature_validator` falls back to `deserialize_public_key(msg.key)` when the `from`
  field is not an identity-multihash peer id, and re-raises when that key is malformed; `Pubsub.push_msg` runs
  in a service task, so the exception kills the pubsub service. `install_signature_guard` rebinds the name
  `signature_validator` in `libp2p.pubsub.pubsub` (the only caller) to a wrapper that returns False (invalid
  signature) instead of raising. `GuardedPubsub.push_msg` also catches anything else one message raises.
- Application verdicts: py-libp2p validators return a bool, so there is no IGNORE. `GuardedPubsub.validate_msg`
  asks `app_validate(topic, signer, data)` for each subscribed topic of the message: REJECT raises
  ValidationError (the library then counts an invalid message against the forwarder's score), IGNORE raises
  `IgnoredMessage`, which `push_msg` swallows: not delivered, not forwarded, not penalised. Our own publishes are
  not validated. The library's validation cache is bypassed so the replay guard sees every copy.
- Duplicates in flight: the library marks a message seen only after validation; while one copy awaits the
  node's verdict, further copies from other forwarders are dropped here (else they would be validated and
  delivered twice, and an honest forwarder could be penalised by the replay guard).
- Graylist: `push_msg` ignores, before validation, a message from a forwarder whose router score is under the
  graylist threshold (py-libp2p 0.8.1 checks that threshold only for gossip and GRAFTs, not for messages).
- Validation budget: each unseen message takes a token from its forwarder's bucket and from one for all
  forwarders (`forward_budget`, a shaping.RequestBudget); without one it is ignored before its signature is
  checked (counters["forwarder_over_budget"]), so a peer relaying floods of freshly made identities costs us a
  bounded number of validations per second.
- Stale streams: `reap_stale_streams` drops a peer's pubsub stream whose connection has closed (a peer that
  restarted and redialled before we noticed), so the library re-opens one on the live connection.
- Streams, not peer ids: a failed write on a stream we have since replaced (the relayed connection under it
  closed) no longer ends the peer's new stream (`write_msg`, `handle_sending_messages`), and `reopen_streams`
  re-opens our stream to a peer still talking to us when the library has given up (py-libp2p 0.8.1 keys both by
  peer id).
- Subscriptions outlive our outbound stream: when our stream to a peer dies while the peer's own stream to us
  is open (a relayed connection closed under a direct one), the peer's subscriptions are kept
  (`_handle_dead_peer`; py-libp2p 0.8.1 forgets them, and the peer never announces them again).
- `raise_library_limits` patches the hard-coded per-peer outbound queue (32 RPCs) and subscription channel (32).
- Throughput (same wire format): `GuardedPubsub.handle_sending_messages` merges the RPCs queued for a peer into
  one RPC per write, and `install_record_caches` stops rebuilding and re-verifying the signed peer record that
  rides on every RPC (what each gained: docs/MEASUREMENTS.md).
With `crash_guards=False` the two crash paths behave as in the library (to test supervision).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

from google.protobuf.message import DecodeError
from libp2p.exceptions import ValidationError
from libp2p.network.stream.exceptions import StreamClosed, StreamReset
from libp2p.peer import peerstore as peerstore_module
from libp2p.peer.envelope import consume_envelope
from libp2p.peer.id import ID
from libp2p.peer.peer_record import PEER_RECORD_ENVELOPE_DOMAIN
from libp2p.pubsub import gossipsub as gossipsub_module
from libp2p.pubsub import pubsub as pubsub_module
from libp2p.pubsub import rpc_queue
from libp2p.pubsub import utils as pubsub_utils
from libp2p.pubsub.pb import rpc_pb2
from libp2p.pubsub.pubsub import Pubsub
from libp2p.pubsub.validators import signature_validator as library_signature_validator
from libp2p.utils import encode_varint_prefixed

from swarm_node.transport.base import ValidationResult
from swarm_node.transport.shaping import RequestBudget

log = logging.getLogger(__name__)

AppValidate = Callable[[str, str, bytes], Awaitable[ValidationResult]]


class IgnoredMessage(Exception):
    """A message the application IGNOREs: dropped without penalising its forwarder."""


def install_signature_guard(counters: Counter[str]) -> None:
    """Make a malformed key an invalid signature instead of an exception (crash b). Idempotent per process."""

    def guarded_signature_validator(msg: rpc_pb2.Message) -> bool:
        try:
            return library_signature_validator(msg)
        except Exception:  # deserialize_public_key raises several types for peer-chosen bytes; all mean "invalid"
            counters["malformed_key"] += 1
            log.warning("dropped a pubsub message with a malformed signing key (from field %s)",
                        msg.from_id[:40].hex())
            return False

    pubsub_module.signature_validator = guarded_signature_validator


def install_record_caches(ttl_s: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
    """Cache the signed peer record each pubsub RPC carries, on both ends. Per-process, idempotent.

    py-libp2p 0.8.1 rebuilds our record's address list (multiaddr parsing) for every RPC it sends, and verifies
    the sender's record signature and re-parses its addresses for every RPC it receives (twice when the RPC has
    control entries): the largest CPU cost per gossip message in profiles. Outbound: reuse our envelope for
    `ttl_s` (a changed listen address shows up within that time) while it is still the peerstore's local record:
    identify and the DHT call the library's own function, which issues a newer record when our addresses change,
    and a peer that has the newer one refuses an RPC with an older one, messages and all. Inbound: an envelope
    byte-identical to one already accepted from the same peer within `ttl_s` was verified then; accept it without
    verifying again. An RPC whose record is the sender's own but older than the one we hold (built before its
    addresses changed, overtaken by identify on another stream) keeps its messages; only the record is dropped.
    """
    original_env = peerstore_module.env_to_send_in_RPC
    original_consume = pubsub_utils.maybe_consume_signed_record
    ours: dict[int, tuple[float, Any, bytes]] = {}  # id(host) -> (when, the local record, its envelope)
    theirs: dict[tuple[int, ID], tuple[float, bytes]] = {}

    def cached_env(host: Any) -> tuple[bytes, bool]:
        now = clock()
        hit = ours.get(id(host))
        if hit is not None and now - hit[0] < ttl_s and hit[1] is host.get_peerstore().get_local_record():
            return hit[2], False
        envelope, issued = original_env(host)
        ours[id(host)] = (now, host.get_peerstore().get_local_record(), envelope)
        return envelope, issued

    def cached_consume(rpc: rpc_pb2.RPC, host: Any, peer_id: ID) -> bool:
        if not rpc.HasField("senderRecord"):
            return True
        now = clock()
        key = (id(host), peer_id)
        hit = theirs.get(key)
        if hit is not None and now - hit[0] < ttl_s and hit[1] == rpc.senderRecord:
            return True
        if original_consume(rpc, host, peer_id):
            theirs[key] = (now, rpc.senderRecord)
            return True
        return older_own_record(rpc.senderRecord, host, peer_id)

    for module in (pubsub_module, gossipsub_module):
        module.env_to_send_in_RPC = cached_env  # type: ignore[attr-defined]
        module.maybe_consume_signed_record = cached_consume  # type: ignore[attr-defined]


def older_own_record(record: bytes, host: Any, peer_id: ID) -> bool:
    """Whether `record` is `peer_id`'s own signed peer record, older than the one our peerstore holds for it: late
    address news, not a forgery (py-libp2p 0.8.1 drops the whole RPC for it)."""
    try:
        envelope, peer_record = consume_envelope(record, PEER_RECORD_ENVELOPE_DOMAIN)
        held = host.get_peerstore().get_peer_record(peer_id)
        return (peer_record.peer_id == peer_id == ID.from_pubkey(envelope.public_key)
                and held is not None and held.record().seq > peer_record.seq)
    except Exception:  # a record that does not parse or verify: not the sender's own
        return False


def raise_library_limits(queue_size: int, max_message_bytes: int, subscription_channel: int) -> None:
    """Per-process: the library builds each peer's RpcQueue() and each subscription channel from constants."""
    rpc_queue.RpcQueue.__init__.__defaults__ = (queue_size, max_message_bytes)
    pubsub_module.SUBSCRIPTION_CHANNEL_SIZE = subscription_channel


def inbound_is_live(stream: Any) -> bool:
    """True while a peer's pubsub stream to us can still carry RPCs: open, on a connection that is open."""
    if stream is None or stream.is_closed:  # a property of NetStream
        return False
    return not getattr(stream.muxed_conn, "is_closed", True)


class GuardedPubsub(Pubsub):
    """Pubsub with the crash guards, application verdicts (with IGNORE) and in-flight de-duplication."""

    def __init__(self, *args: Any, app_validate: AppValidate, crash_guards: bool = True,
                 counters: Counter[str] | None = None, forward_budget: RequestBudget | None = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.app_validate = app_validate
        self.crash_guards = crash_guards
        self.forward_budget = forward_budget
        self.counters: Counter[str] = counters if counters is not None else Counter()
        self._validating: set[bytes] = set()
        self._inbound: dict[ID, Any] = {}  # peer -> its pubsub stream to us, while we read it
        self._opening: Counter[ID] = Counter()  # peer -> our stream openings to it in progress

    async def stream_handler(self, stream: Any) -> None:
        peer_id = stream.muxed_conn.peer_id
        self._inbound[peer_id] = stream  # the peer's subscriptions arrive on it (see _handle_dead_peer)
        try:
            await self._read_inbound(stream, peer_id)
        finally:
            if self._inbound.get(peer_id) is stream:
                del self._inbound[peer_id]

    async def _read_inbound(self, stream: Any, peer_id: ID) -> None:
        if not self.crash_guards:
            await super().stream_handler(stream)
            return
        try:
            await super().stream_handler(stream)
        except DecodeError:
            self.counters["undecodable_frame"] += 1
            log.warning("peer %s sent an undecodable pubsub frame; dropping its pubsub stream", peer_id)
            await self._drop_stream(stream, peer_id)
        except Exception:  # trust boundary: nothing one peer sends may end more than that peer's stream
            self.counters["stream_error"] += 1
            log.warning("pubsub stream from %s failed; dropping it", peer_id, exc_info=True)
            await self._drop_stream(stream, peer_id)

    async def _drop_stream(self, stream: Any, peer_id: ID) -> None:
        await stream.reset()  # NetStream.reset swallows the muxer's errors itself
        if self._inbound.get(peer_id) is stream:
            del self._inbound[peer_id]  # its subscriptions go with it
        self._handle_dead_peer(peer_id)

    def _handle_dead_peer(self, peer_id: ID) -> None:
        """The library's dead-peer handling, keeping the subscriptions the peer announced on a stream still open.

        py-libp2p 0.8.1 bug: `Pubsub._handle_dead_peer` runs whenever our *outbound* stream to a peer dies and
        forgets every subscription of that peer, then re-opens an outbound stream if the peer is still connected.
        But a peer announces its subscriptions once, at the start of *its* stream to us; when that inbound stream
        lives on (on another connection: the direct one after DCUtR closed the relayed one), they are never
        announced again, so we believe the peer subscribed to nothing and publish nothing to it, for good: the
        one-way exchange of issue 27 (docs/NAT.md). Here they are put back through the library's own
        `handle_subscription` once it has forgotten them.
        """
        kept = sorted(t for t, members in self.peer_topics.items() if peer_id in members) \
            if inbound_is_live(self._inbound.get(peer_id)) else []
        super()._handle_dead_peer(peer_id)
        for topic in kept:
            self.handle_subscription(peer_id, rpc_pb2.RPC.SubOpts(subscribe=True, topicid=topic))
        if kept:
            self.counters["subscriptions_kept"] += 1

    async def handle_sending_messages(self, peer_id: ID, stream: Any, queue: rpc_queue.RpcQueue) -> None:
        """The library's per-peer sender, merging the RPCs queued while the previous write was in flight.

        Under load the library writes (and the peer parses, and verifies the signed peer record of) one RPC per
        message and per control message. An RPC may carry many messages and control entries, so everything
        waiting in the queue goes out as one RPC of at most the RPC size limit: same bytes on the wire format,
        far fewer writes, frames, decryptions and record verifications.
        """
        limit = queue.max_message_size - _MERGE_MARGIN_BYTES
        try:
            while True:
                rpc = await queue.pop()
                if rpc is None:
                    return
                merged = rpc
                size = rpc.ByteSize()
                while size < limit:
                    nxt = queue._queue.pop()  # non-blocking pop of the library's PriorityQueue (pinned 0.8.1)
                    if nxt is None:
                        break
                    nxt_size = nxt.ByteSize()
                    if size + nxt_size > limit:
                        if not await self.write_msg(stream, merged):
                            return
                        merged, size = nxt, nxt_size
                        continue
                    if merged is rpc:
                        merged = rpc_pb2.RPC()
                        merged.CopyFrom(rpc)
                    merged.MergeFrom(nxt)  # repeated fields concatenate; the sender record is the same bytes
                    size = merged.ByteSize()
                    self.counters["rpcs_merged"] += 1
                if not await self.write_msg(stream, merged):
                    return
        except Exception:  # as the library's loop: a broken stream ends this peer, not the host
            log.debug("sending loop for %s ended", peer_id, exc_info=True)
            if self.peers.get(peer_id) is stream:  # a replaced stream's end must not end its successor
                self._handle_dead_peer(peer_id)

    async def write_msg(self, stream: Any, rpc_msg: rpc_pb2.RPC) -> bool:
        """The library's write (a varint-prefixed RPC), ending the peer only if `stream` is still its stream.

        py-libp2p 0.8.1 bug: `Pubsub.write_msg` calls `_handle_dead_peer(peer)` on any failed write, keyed by peer
        id. When the relayed connection under our stream closes, the writes queued on that old stream (the sending
        loop, `send_recent_messages`, `flush_pending_messages`: one per cached message) keep failing after the
        library has already registered a new stream on the direct connection, and the first of them removes the
        new stream. The retry it schedules is skipped while the retry that registered the new stream is still
        finishing, so we never write to that peer again (measured in the netns topology: docs/NAT.md).
        """
        try:
            await stream.write(encode_varint_prefixed(rpc_msg.SerializeToString()))
            return True
        except (StreamClosed, StreamReset):
            peer_id = stream.muxed_conn.peer_id
            if self.peers.get(peer_id) is stream:
                self._handle_dead_peer(peer_id)
            else:
                self.counters["stale_stream_write"] += 1
            return False

    async def _handle_new_peer_with_retry(self, peer_id: ID, timeout: float | None = None) -> None:
        self._opening[peer_id] += 1  # the library's first opening and its retries alike
        try:
            await super()._handle_new_peer_with_retry(peer_id, timeout)
        finally:
            self._opening[peer_id] -= 1
            if self._opening[peer_id] <= 0:
                del self._opening[peer_id]

    def reopen_streams(self) -> list[ID]:
        """Schedule the library's stream (re)opening for every peer that talks pubsub to us on an open stream but
        to whom we hold no stream and none is being opened; returns those peers. The host calls it every second:
        the last line against any other path by which py-libp2p 0.8.1 forgets our stream to a connected peer (its
        retry, scheduled once per peer, gives up on an unexpected error)."""
        orphans = [peer for peer, stream in self._inbound.items()
                   if peer not in self.peers and not self._opening[peer]
                   and peer not in self._peer_stream_retries_pending  # scheduled, not started yet
                   and inbound_is_live(stream) and not self.is_peer_blacklisted(peer)]
        for peer in orphans:
            self.counters["pubsub_stream_reopened"] += 1
            self._schedule_peer_stream_retry(peer)
        return orphans

    def reap_stale_streams(self) -> list[ID]:
        """Drop pubsub streams whose connection has closed; returns the peers concerned.

        When a peer restarts with the same identity and redials before we have processed the old connection's
        end, the library sees "still connected" and keeps the old, dead stream: our messages to that peer are
        written into a closed connection until a write fails. The host calls this every second; the library's
        own dead-peer handling then re-opens a stream on the live connection.
        """
        stale = [peer for peer, stream in self.peers.items()
                 if getattr(getattr(stream, "muxed_conn", None), "is_closed", False)]
        for peer in stale:
            self.counters["stale_stream"] += 1
            self._handle_dead_peer(peer)
        return stale

    async def push_msg(self, msg_forwarder: ID, msg: rpc_pb2.Message) -> None:
        scorer = getattr(self.router, "scorer", None)
        if scorer is not None and scorer.is_graylisted(msg_forwarder, list(msg.topicIDs)):
            self.counters["graylisted_forwarder"] += 1  # the spec's graylist: the library only gates gossip
            return
        msg_id = self._msg_id_constructor(msg)
        if msg_id in self._validating:
            self.counters["duplicate_in_flight"] += 1
            return
        if (self.forward_budget is not None and msg_forwarder != self.my_id and not self._is_msg_seen(msg)
                and self.forward_budget.take(msg_forwarder) != "ok"):
            self.counters["forwarder_over_budget"] += 1  # seen copies cost nothing: the library drops them unread
            return
        self._validating.add(msg_id)
        try:
            await super().push_msg(msg_forwarder, msg)
        except IgnoredMessage:
            pass
        except Exception:
            if not self.crash_guards:
                raise
            self.counters["message_error"] += 1
            log.warning("dropped a pubsub message forwarded by %s that raised", msg_forwarder, exc_info=True)
        finally:
            self._validating.discard(msg_id)

    async def validate_msg(self, msg_forwarder: ID, msg: rpc_pb2.Message) -> None:
        if msg_forwarder == self.my_id:
            return  # our own publish
        signer = ID(msg.from_id).to_base58()  # StrictSign already verified that from_id signed it
        worst = ValidationResult.ACCEPT
        for topic in msg.topicIDs:
            if topic not in self.topic_ids:
                continue
            verdict = await self.app_validate(topic, signer, msg.data)
            worst = max(worst, verdict, key=_SEVERITY.__getitem__)
        if worst is ValidationResult.REJECT:
            raise ValidationError("rejected by the application validator")
        if worst is ValidationResult.IGNORE:
            raise IgnoredMessage


_MERGE_MARGIN_BYTES = 64 << 10  # headroom under the RPC limit for the sender record and framing
_SEVERITY = {ValidationResult.ACCEPT: 0, ValidationResult.IGNORE: 1, ValidationResult.REJECT: 2}

