"""libp2p transport (py-libp2p 0.8.1): the node side (asyncio) of a supervised network host.

Architecture: py-libp2p is trio-only and pure Python, so the network host runs apart from the node, in a child
process (the default) or on a trio thread (`launch.py`; why a process: docs/MEASUREMENTS.md); the
node talks to it in frames (`ipc.py`) over a socketpair (`session.py`). This module supervises the host:
it restarts a crashed or hung host with the same identity and listen port, re-subscribes, re-serves protocols and
redials the peers it knew. Validators run in the node (a VALIDATE/VERDICT round trip over the socket per
message), so they are plain Python callables with the node's state (e.g. the protocol's replay guard), not
something the child must import and configure.

Contract: implements `base.Transport`. Calls made while the host is down (crashed, restarting) raise
`TransportUnavailable` at once instead of blocking the training loop. `stats.restarts` counts restarts;
`host_counters()` returns the running host's guard/validation counters; `nat_status()` its reachability,
relays and DHT discovery (nat.py). `set_peer_scores(scores)` sends the
node's reputation table to the host (SCORES: gossipsub's application-specific score), re-sent after a restart.
Construct with an `identity.Identity` (the peer id is stable across restarts) and a `LibP2PConfig`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import signal
import socket
import time
from collections.abc import Awaitable, Mapping
from dataclasses import replace
from typing import Any

from swarm_node.identity import Identity
from swarm_node.transport.base import (
    Delivery,
    DeliveryHandler,
    PeerInfo,
    Stream,
    StreamHandler,
    Transport,
    TransportError,
    TransportStats,
    TransportUnavailable,
    ValidationResult,
    Validator,
    run_validator,
)
from swarm_node.transport.libp2p.ipc import IpcError, Op, check_scores, encode
from swarm_node.transport.libp2p.launch import LAUNCHERS, LibP2PConfig
from swarm_node.transport.libp2p.session import IpcStream, Session
from swarm_node.transport.supervisor import RestartTracker

__all__ = ["LibP2PConfig", "LibP2PTransport"]

log = logging.getLogger(__name__)


class LibP2PTransport(Transport):
    """See the module docstring."""

    def __init__(self, identity: Identity, config: LibP2PConfig | None = None) -> None:
        self.identity = identity
        self.config = config or LibP2PConfig()
        if self.config.isolation not in LAUNCHERS:
            raise ValueError(f"unknown isolation {self.config.isolation!r}; known: {sorted(LAUNCHERS)}")
        self._peer_id = identity.peer_id
        self.stats = TransportStats()
        self._session: Session | None = None
        self._up = asyncio.Event()
        self._stopping = False
        self._handlers: dict[str, list[DeliveryHandler]] = {}
        self._validators: dict[str, Validator] = {}
        self._stream_handlers: dict[str, StreamHandler] = {}
        self._known_addrs: dict[str, str] = {}  # peer id -> a multiaddr that reached it (redialled on restart)
        self._listen: tuple[str, ...] = ()  # concrete listen addrs of the first start (same port on restart)
        self._advertised: list[str] = []
        self._tasks: set[asyncio.Task[Any]] = set()
        self._supervisor: asyncio.Task[None] | None = None
        self._tracker = RestartTracker()
        self._app_scores: dict[str, float] = {}  # the last SCORES table (re-sent to a restarted host)

    @property
    def peer_id(self) -> str:
        return self._peer_id

    @property
    def is_up(self) -> bool:
        return self._up.is_set()

    @property
    def host_pid(self) -> int | None:
        return self._session.handle.pid if self._session is not None else None

    # -- lifecycle ------------------------------------------------------------------------------------------
    async def start(self) -> None:
        if self._supervisor is not None:
            raise TransportError("already started")
        await self._launch(self.config.host.listen)
        self._supervisor = asyncio.get_running_loop().create_task(self._supervise(), name="libp2p-supervisor")

    async def stop(self) -> None:
        self._stopping = True
        self._up.clear()
        session = self._session
        if session is not None:
            session.end("stopped")
            try:
                await asyncio.wait_for(session.handle.wait(), 10)
            except asyncio.TimeoutError:
                session.handle.kill()
                await session.handle.wait()
        for task in [self._supervisor, *self._tasks]:
            if task is not None:
                task.cancel()
        await asyncio.gather(*[t for t in [self._supervisor, *self._tasks] if t is not None],
                             return_exceptions=True)

    async def _launch(self, listen: tuple[str, ...]) -> None:
        parent_sock, child_sock = socket.socketpair()
        handle = await LAUNCHERS[self.config.isolation](child_sock, self.config)
        reader, writer = await asyncio.open_unix_connection(sock=parent_sock)
        session = Session(reader, writer, handle)
        settings = replace(self.config.host, listen=listen)
        writer.write(encode(Op.HELLO, self.identity.to_bytes(), settings.to_wire()))
        try:
            frames = await asyncio.wait_for(session.read_frames(), self.config.start_timeout_s)
        except asyncio.TimeoutError:
            frames = []
        if not frames or frames[0][0] is not Op.READY:
            session.end("failed to start")
            handle.kill()
            how = await handle.wait()
            raise TransportError(f"network host failed to start ({how}); see its log above")
        (_, (peer_id, transport_addrs, advertised)), rest = frames[0], frames[1:]
        self._session = session
        self._spawn(self._read_loop(session, rest))
        try:
            if peer_id != self._peer_id:
                raise TransportError(f"network host reports peer id {peer_id}, expected {self._peer_id}")
            await self._restore(session)
        except TransportError:
            session.end("failed while starting")
            handle.kill()
            await handle.wait()
            raise
        if not self._listen:
            self._listen = tuple(transport_addrs)
        self._advertised = list(advertised)
        self._tracker.started(time.monotonic())
        self._up.set()

    async def _restore(self, session: Session) -> None:
        """Re-apply subscriptions and stream protocols, then redial known peers in the background."""
        # Loop until stable: subscribe()/serve_stream() calls made while we await are picked up too.
        topics: set[str] = set()
        protocols: set[str] = set()
        while set(self._handlers) - topics or set(self._stream_handlers) - protocols:
            for topic in sorted(set(self._handlers) - topics):
                await self._call("subscribe", topic, topic in self._validators, session=session)
                topics.add(topic)
            for protocol in sorted(set(self._stream_handlers) - protocols):
                await self._call("serve", protocol, session=session)
                protocols.add(protocol)
        if self._app_scores:
            session.send(Op.SCORES, self._app_scores)
        for addr in list(self._known_addrs.values()):
            self._spawn(self._redial(addr))

    async def _redial(self, addr: str) -> None:
        try:
            await self.connect(addr)
        except TransportError as exc:
            log.info("could not redial %s after restart: %s", addr, exc)

    async def _supervise(self) -> None:
        health_failures = 0
        while not self._stopping:
            session = self._session
            assert session is not None
            ended = asyncio.ensure_future(session.handle.wait())
            while not ended.done():
                done, _ = await asyncio.wait({ended}, timeout=self.config.health_interval_s)
                if done or self._stopping:
                    break
                try:
                    await self._refresh_peers()
                    health_failures = 0
                except TransportUnavailable:
                    pass
                except TransportError:
                    health_failures += 1
                    if health_failures >= 2:
                        log.warning("network host unresponsive; killing it (the supervisor restarts it)")
                        session.handle.kill()
            how = await ended
            if self._stopping:
                return
            self._up.clear()
            session.end(how)
            self.stats.restarts += 1
            await self._restart_after_failure(how)

    async def _restart_after_failure(self, how: str) -> None:
        listen = self._listen or self.config.host.listen
        while not self._stopping:
            attempt = self._tracker.failed(time.monotonic())
            delay = self.config.restart.delay(attempt, random.random())
            log.warning("network layer ended (%s); restarting it in %.1f s (training goes on; peers will be "
                        "redialled)", how, delay)
            await asyncio.sleep(delay)
            try:
                await self._launch(listen)
                log.warning("network layer restarted: peer id %s, listening on %s", self._peer_id,
                            ", ".join(self._advertised))
                return
            except (TransportError, OSError) as exc:
                how = str(exc)
                listen = self.config.host.listen  # the old port may be taken: fall back to the configured one

    # -- frames from the host -------------------------------------------------------------------------------
    async def _read_loop(self, session: Session, first: list[tuple[Op, list[Any]]]) -> None:
        frames = first
        while True:
            for op, fields in frames:
                self._dispatch(session, op, fields)
            frames = await session.read_frames()
            if not frames:
                session.end("its socket closed")
                return

    def _dispatch(self, session: Session, op: Op, fields: list[Any]) -> None:
        if op is Op.RESULT:
            req_id, ok, value = fields
            session.on_result(req_id, ok, value)
        elif op is Op.VALIDATE:
            vid, topic, signer, data, deadline = fields
            if time.time() > deadline:  # the host has already ignored it: validating it would only delay the rest
                self.stats.validation_expired += 1
                verdict = ValidationResult.IGNORE
            else:
                verdict = run_validator(self._validators.get(topic), signer, data)
                self.stats.validated[verdict.name] += 1
            session.send(Op.VERDICT, vid, int(verdict))
        elif op is Op.DELIVER:
            topic, data, signer, received_at = fields
            delivery = Delivery(topic, data, signer, received_at)
            self.stats.delivered += 1
            for handler in self._handlers.get(topic, ()):
                handler(delivery)
        elif op is Op.S_OPEN:
            sid, peer, protocol, remote_host, remote_port = fields
            remote = (remote_host, remote_port) if remote_host is not None else None
            stream = session.open(sid, peer, protocol, remote)
            handler = self._stream_handlers.get(protocol)
            if handler is None:
                self._spawn(stream.reset())
            else:
                self._spawn(self._serve_one(handler, stream))
        elif op in (Op.S_DATA, Op.S_CLOSE, Op.S_RESET, Op.S_CREDIT):
            session.on_stream_frame(op, fields)
        else:
            log.error("unexpected frame %s from the network host", op.name)

    async def _serve_one(self, handler: StreamHandler, stream: IpcStream) -> None:
        try:
            await handler(stream)
        except TransportError as exc:
            log.info("stream %s from %s ended: %s", stream.protocol_id, stream.remote_peer, exc)
        except Exception:  # a protocol handler failing on one peer's stream must not end anything else
            log.warning("stream handler %s failed on a stream from %s", stream.protocol_id, stream.remote_peer,
                        exc_info=True)
        finally:
            # A handler that returns is done with the stream: finish it cleanly, or abort it if unread.
            try:
                await stream.finish()
            except TransportUnavailable:
                pass

    # -- requests -------------------------------------------------------------------------------------------
    async def _call(self, method: str, *args: Any, session: Session | None = None) -> Any:
        """One request to the host. `session` is given only while (re)starting, before the transport is up."""
        if session is None:
            session = self._session
            if session is None or not self._up.is_set():
                raise TransportUnavailable("network layer is down (restarting)")
        return await session.request(method, args, self.config.call_timeout_s)

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- Transport API --------------------------------------------------------------------------------------
    def listen_addrs(self) -> list[str]:
        from swarm_node.transport.connectivity import expand_unspecified

        out: list[str] = []
        for addr in self._advertised:
            for expanded in expand_unspecified(addr):
                if expanded not in out:
                    out.append(expanded)
        return out

    async def publish(self, topic: str, data: bytes) -> None:
        await self._call("publish", topic, data)
        self.stats.published += 1

    async def subscribe(self, topic: str, handler: DeliveryHandler) -> None:
        """While the host is down the subscription is recorded and applied when it is back."""
        self._handlers.setdefault(topic, []).append(handler)
        if self._up.is_set():
            await self._call("subscribe", topic, topic in self._validators)

    async def unsubscribe(self, topic: str) -> None:
        """Handlers and validator go at once (nothing more is delivered to us); the host leaves the topic when it is
        up (while it is down there is nothing to leave: `_restore` re-subscribes only the topics still handled)."""
        if self._handlers.pop(topic, None) is None:
            return
        self._validators.pop(topic, None)
        if self._up.is_set():
            await self._call("unsubscribe", topic)

    def set_validator(self, topic: str, validator: Validator) -> None:
        """Effective at once for later messages; if already subscribed, the host is told in the background (the
        host learns which topics are validated through subscribe). Set it before subscribing to be sure."""
        self._validators[topic] = validator
        if topic in self._handlers and self._up.is_set():
            self._spawn(self._call("subscribe", topic, True))

    async def serve_stream(self, protocol_id: str, handler: StreamHandler) -> None:
        self._stream_handlers[protocol_id] = handler
        if self._up.is_set():
            await self._call("serve", protocol_id)

    async def open_stream(self, peer_id: str, protocol_id: str) -> Stream:
        session = self._session
        sid = await self._call("open_stream", peer_id, protocol_id)
        assert session is not None
        return session.open(sid, peer_id, protocol_id)

    async def connect(self, multiaddr: str) -> str:
        peer = await self._call("connect", multiaddr)
        self._known_addrs[peer] = multiaddr
        return str(peer)

    async def peers(self) -> list[PeerInfo]:
        return await self._refresh_peers()

    async def set_peer_scores(self, scores: Mapping[str, float]) -> None:
        """Replace the host's table of application-specific peer scores (at most MAX_SCORES; ValueError if not
        finite). While the host is down it is kept and sent when the host is back."""
        try:
            table = check_scores(dict(scores))
        except IpcError as exc:
            raise ValueError(str(exc)) from exc
        self._app_scores = table
        session = self._session
        if session is not None and self._up.is_set():
            session.send(Op.SCORES, table)
            await session.drain()

    async def nat_status(self) -> dict[str, Any]:
        """The host's view of NAT traversal (nat.NatServices.status): "reachability" (public | private |
        unknown) and its one-line summary "line", relay reservations, "relayed_bytes", DHT discoveries, paths, and
        per peer "traffic" (open direct and relayed connections, the path our gossip takes: paths.peer_traffic)."""
        return dict(await self._call("nat_status"))

    async def host_counters(self) -> dict[str, int]:
        """What the current host's guards and validation dropped (counts restart from 0 with each host)."""
        return dict(await self._call("counters"))

    async def _refresh_peers(self) -> list[PeerInfo]:
        rows = await self._call("peers")
        infos = [PeerInfo(peer, tuple(addrs), latency, tuple(topics)) for peer, addrs, latency, topics in rows]
        for info in infos:
            for addr in info.addrs:
                if "/tcp/" in addr and "/ip4/0.0.0.0/" not in addr:
                    full = addr if "/p2p/" in addr else f"{addr}/p2p/{info.peer_id}"
                    self._known_addrs.setdefault(info.peer_id, full)
                    break
        return infos

    def kill_host_for_test(self) -> int | None:
        """SIGKILL the host process (tests of the supervisor); returns its pid."""
        session = self._session
        if session is None:
            return None
        pid = session.handle.pid
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
        else:
            session.handle.kill()
        return pid
