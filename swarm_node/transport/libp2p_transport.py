"""libp2p transport (py-libp2p 0.8.1): the node side (asyncio) of a supervised network host.

Architecture, and the measurement behind it. py-libp2p is trio-only and pure Python (Noise, yamux, protobuf and
gossipsub all hold the GIL). The host runs either in a child process (`libp2p_host`, isolation "process") or on a
trio thread inside the node (isolation "thread"); both speak the same frames (libp2p_ipc) over a socketpair, so
only the isolation differs. Measured with `python -m bench.gossip --arch` (bench/results/gossip_arch.json): a
training-loop stand-in (torch + Python work) on a node that receives 100 groups/s made 145 steps/s with no network,
87 with the host in a child process and 51 with it on a thread (medians of 3 interleaved runs, 2 cores at load
average ~9, so noisy: single runs ranged 62-134 and 29-93). We chose "process" (the default):
  * a remote crash or leak in py-libp2p ends only the child; the supervisor here restarts it with the same
    identity and listen port, re-subscribes, re-serves protocols and redials the peers it knew, and training sees
    nothing but TransportUnavailable on calls made while it is down (tests kill it with SIGKILL and crash it);
  * its Python work competes with the trainer and vLLM for CPU but not for their GIL, which cost more above;
  * thread isolation stays available (cheaper start, ~0.1 s instead of ~1-2 s) but has no crash isolation.
Validators run in the node (a VALIDATE/VERDICT round trip over the socket per message), so they are plain
Python callables with the node's state (e.g. the protocol's replay guard), not something the child must import and
configure.

Contract: implements `base.Transport`. Calls made while the host is down (crashed, restarting) raise
`TransportUnavailable` at once instead of blocking the training loop. `stats.restarts` counts restarts;
`host_counters()` returns the running host's guard/validation counters. Construct with an `identity.Identity` (the peer
id is stable across restarts) and a `LibP2PConfig`.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

from swarm_node.identity import Identity
from swarm_node.transport.base import (
    Delivery,
    DeliveryHandler,
    PeerInfo,
    Stream,
    StreamHandler,
    StreamReset,
    Transport,
    TransportError,
    TransportStats,
    TransportUnavailable,
    Validator,
    run_validator,
)
from swarm_node.transport.libp2p_ipc import STREAM_CHUNK, STREAM_WINDOW, FrameDecoder, HostSettings, Op, encode
from swarm_node.transport.supervisor import Backoff, RestartTracker

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LibP2PConfig:
    """host: settings for the network host. isolation: a key of LAUNCHERS. restart: backoff between restarts.
    start_timeout_s: a host that is not READY by then counts as a failed start. call_timeout_s: a request the
    host does not answer in time raises TransportError. health_interval_s: how often the node polls the host
    (peer list refresh); two unanswered polls in a row make the supervisor kill and restart a hung host."""

    host: HostSettings = field(default_factory=HostSettings)
    isolation: str = "process"
    restart: Backoff = field(default_factory=Backoff)
    start_timeout_s: float = 60.0
    call_timeout_s: float = 30.0
    health_interval_s: float = 5.0
    host_log_level: str = "WARNING"


class HostHandle:
    """A launched network host: how to wait for it to end and how to end it."""

    pid: int | None = None

    async def wait(self) -> str:
        """Wait until the host has ended; returns how (for the log)."""
        raise NotImplementedError

    def kill(self) -> None:
        raise NotImplementedError


class _ProcessHandle(HostHandle):
    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.pid = proc.pid

    async def wait(self) -> str:
        code = await self.proc.wait()
        return f"exit code {code}" if code >= 0 else f"killed by signal {-code}"

    def kill(self) -> None:
        if self.proc.returncode is None:
            self.proc.kill()


async def launch_process(child_sock: socket.socket, config: LibP2PConfig) -> HostHandle:
    """The host as a child process that inherits its end of the socketpair (the key never appears in argv)."""
    fd = child_sock.fileno()
    # The host's stdout goes to our stderr: a library print() must never land in a node's stdout (tools and
    # tests read structured output there). Its log goes to stderr anyway.
    try:
        stdout: int = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # stderr replaced by an object without a descriptor
        stdout = subprocess.DEVNULL
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "swarm_node.transport.libp2p_host", "--ipc-fd", str(fd),
        "--log-level", config.host_log_level, pass_fds=(fd,), stdin=subprocess.DEVNULL, stdout=stdout,
    )
    child_sock.close()
    return _ProcessHandle(proc)


class _ThreadHandle(HostHandle):
    def __init__(self, thread: threading.Thread, done: asyncio.Future[str], sock: socket.socket) -> None:
        self.thread, self.done, self.sock = thread, done, sock

    async def wait(self) -> str:
        return await asyncio.shield(self.done)

    def kill(self) -> None:
        # A thread cannot be killed; closing its socket makes the host see EOF and return.
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


async def launch_thread(child_sock: socket.socket, config: LibP2PConfig) -> HostHandle:
    """The host on a trio thread in this process (no crash isolation)."""
    import trio  # imported here so the process isolation never loads trio or libp2p into the node

    from swarm_node.transport.libp2p_host import run_host

    loop = asyncio.get_running_loop()
    done: asyncio.Future[str] = loop.create_future()

    def body() -> None:
        how = "returned"
        try:
            trio.run(run_host, child_sock)
        except BaseException as exc:  # report how the thread ended; the supervisor decides what to do
            how = f"raised {type(exc).__name__}: {exc}"
        finally:
            child_sock.close()
            loop.call_soon_threadsafe(lambda: done.done() or done.set_result(how))

    thread = threading.Thread(target=body, name="libp2p-host", daemon=True)
    thread.start()
    return _ThreadHandle(thread, done, child_sock)


Launcher = Callable[[socket.socket, LibP2PConfig], Awaitable[HostHandle]]
LAUNCHERS: dict[str, Launcher] = {"process": launch_process, "thread": launch_thread}


class _IpcStream(Stream):
    """A stream bridged by the host: reads come as S_DATA frames, writes go out as S_DATA under credit."""

    def __init__(self, session: _Session, sid: int, peer: str, protocol_id: str,
                 remote_addr: tuple[str, int] | None = None) -> None:
        self.session, self.sid = session, sid
        self.remote_peer, self.protocol_id, self.remote_addr = peer, protocol_id, remote_addr
        self._buf = bytearray()
        self._eof = False
        self._closed = False
        self._reset: str | None = None
        self._unreported = 0
        self._send_credit = STREAM_WINDOW
        self._readable = asyncio.Event()
        self._writable = asyncio.Event()

    # frames from the host
    def _feed(self, data: bytes) -> None:
        self._buf += data
        self._readable.set()

    def _feed_eof(self) -> None:
        self._eof = True
        self._readable.set()
        self._forget_if_done()

    def _forget_if_done(self) -> None:
        if self._eof and self._closed:
            self.session.streams.pop(self.sid, None)

    def _abort(self, reason: str) -> None:
        if self._reset is None:
            self._reset = reason
        self._readable.set()
        self._writable.set()

    def _credit(self, n: int) -> None:
        self._send_credit += n
        self._writable.set()

    # Stream API
    async def read(self, max_bytes: int = 1 << 16) -> bytes:
        while not self._buf and not self._eof and self._reset is None:
            self._readable.clear()
            await self._readable.wait()
        if self._reset is not None:
            raise StreamReset(self._reset)
        out = bytes(self._buf[:max_bytes])
        del self._buf[:max_bytes]
        self._unreported += len(out)
        if self._unreported >= STREAM_WINDOW // 4 or (self._eof and self._unreported):
            self.session.send(Op.S_CREDIT, self.sid, self._unreported)
            self._unreported = 0
        return out

    async def write(self, data: bytes) -> None:
        if self._closed:
            raise TransportError("write after close")
        view = memoryview(data)
        for start in range(0, len(view), STREAM_CHUNK):
            chunk = bytes(view[start:start + STREAM_CHUNK])
            while self._send_credit < len(chunk) and self._reset is None:
                self._writable.clear()
                await self._writable.wait()
            if self._reset is not None:
                raise StreamReset(self._reset)
            self._send_credit -= len(chunk)
            self.session.send(Op.S_DATA, self.sid, chunk)
            await self.session.drain()

    async def close(self) -> None:
        if not self._closed and self._reset is None:
            self._closed = True
            self.session.send(Op.S_CLOSE, self.sid)
            self._forget_if_done()

    async def reset(self) -> None:
        if self._reset is None:
            self.session.send(Op.S_RESET, self.sid, "reset by this node")
            self._abort("reset by this node")
        self.session.streams.pop(self.sid, None)


class _Session:
    """One running host: its socket, pending requests and open streams. Ends when the socket closes."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, handle: HostHandle) -> None:
        self.reader, self.writer, self.handle = reader, writer, handle
        self.decoder = FrameDecoder()
        self.pending: dict[int, asyncio.Future[Any]] = {}
        self.streams: dict[int, _IpcStream] = {}
        self.req_ids = itertools.count(1)
        self.alive = True

    def send(self, op: Op, *fields: Any) -> None:
        if not self.alive:
            raise TransportUnavailable("network layer is restarting")
        self.writer.write(encode(op, *fields))

    async def drain(self) -> None:
        try:
            await self.writer.drain()
        except ConnectionError as exc:
            raise TransportUnavailable("network layer went away") from exc

    async def read_frames(self) -> list[tuple[Op, list[Any]]]:
        """Next batch of frames; [] when the host has gone."""
        while True:
            try:
                data = await self.reader.read(1 << 20)
            except ConnectionError:
                data = b""
            if not data:
                return []
            frames = self.decoder.feed(data)
            if frames:
                return frames

    def end(self, why: str) -> None:
        """Fail what waits on this host; idempotent."""
        self.alive = False
        for fut in self.pending.values():
            if not fut.done():
                fut.set_exception(TransportUnavailable(f"network layer ended ({why})"))
        self.pending.clear()
        for stream in self.streams.values():
            stream._abort(f"network layer ended ({why})")
        self.streams.clear()
        self.writer.close()


class LibP2PTransport(Transport):
    """See the module docstring."""

    def __init__(self, identity: Identity, config: LibP2PConfig | None = None) -> None:
        self.identity = identity
        self.config = config or LibP2PConfig()
        if self.config.isolation not in LAUNCHERS:
            raise ValueError(f"unknown isolation {self.config.isolation!r}; known: {sorted(LAUNCHERS)}")
        self._peer_id = identity.peer_id
        self.stats = TransportStats()
        self._session: _Session | None = None
        self._up = asyncio.Event()
        self._stopping = False
        self._handlers: dict[str, list[DeliveryHandler]] = {}
        self._validators: dict[str, Validator] = {}
        self._stream_handlers: dict[str, StreamHandler] = {}
        self._known_addrs: dict[str, str] = {}  # peer id -> a multiaddr that reached it (redialled on restart)
        self._peers_snapshot: list[PeerInfo] = []
        self._listen: tuple[str, ...] = ()  # concrete listen addrs of the first start (same port on restart)
        self._advertised: list[str] = []
        self._tasks: set[asyncio.Task[Any]] = set()
        self._supervisor: asyncio.Task[None] | None = None
        self._tracker = RestartTracker()

    @property
    def peer_id(self) -> str:
        return self._peer_id

    @property
    def is_up(self) -> bool:
        return self._up.is_set()

    @property
    def host_pid(self) -> int | None:
        return self._session.handle.pid if self._session is not None else None

    async def wait_up(self, timeout: float) -> None:
        await asyncio.wait_for(self._up.wait(), timeout)

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
        session = _Session(reader, writer, handle)
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

    async def _restore(self, session: _Session) -> None:
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
            self._peers_snapshot = []
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
    async def _read_loop(self, session: _Session, first: list[tuple[Op, list[Any]]]) -> None:
        frames = first
        while True:
            for op, fields in frames:
                self._dispatch(session, op, fields)
            frames = await session.read_frames()
            if not frames:
                session.end("its socket closed")
                return

    def _dispatch(self, session: _Session, op: Op, fields: list[Any]) -> None:
        if op is Op.RESULT:
            req_id, ok, value = fields
            fut = session.pending.pop(req_id, None)
            if fut is not None and not fut.done():
                if ok:
                    fut.set_result(value)
                else:
                    fut.set_exception(TransportError(value))
        elif op is Op.VALIDATE:
            vid, topic, signer, data = fields
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
            stream = _IpcStream(session, sid, peer, protocol, remote)
            session.streams[sid] = stream
            handler = self._stream_handlers.get(protocol)
            if handler is None:
                self._spawn(stream.reset())
            else:
                self._spawn(self._serve_one(handler, stream))
        elif op in (Op.S_DATA, Op.S_CLOSE, Op.S_RESET, Op.S_CREDIT):
            stream = session.streams.get(fields[0])
            if stream is None:
                return
            if op is Op.S_DATA:
                stream._feed(fields[1])
            elif op is Op.S_CLOSE:
                stream._feed_eof()
            elif op is Op.S_RESET:
                stream._abort(f"reset by peer or host: {fields[1]}")
                session.streams.pop(fields[0], None)
            else:
                stream._credit(fields[1])
        else:
            log.error("unexpected frame %s from the network host", op.name)

    async def _serve_one(self, handler: StreamHandler, stream: _IpcStream) -> None:
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
                if stream._eof and stream._reset is None:
                    await stream.close()
                else:
                    await stream.reset()
            except TransportUnavailable:
                pass

    # -- requests -------------------------------------------------------------------------------------------
    async def _call(self, method: str, *args: Any, session: _Session | None = None) -> Any:
        """One request to the host. `session` is given only while (re)starting, before the transport is up."""
        if session is None:
            session = self._session
            if session is None or not self._up.is_set():
                raise TransportUnavailable("network layer is down (restarting)")
        if not session.alive:
            raise TransportUnavailable("network layer is down (restarting)")
        req_id = next(session.req_ids)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        session.pending[req_id] = fut
        session.send(Op.CALL, req_id, method, list(args))
        await session.drain()
        try:
            return await asyncio.wait_for(fut, self.config.call_timeout_s)
        except asyncio.TimeoutError:
            session.pending.pop(req_id, None)
            raise TransportError(f"network host did not answer {method} within {self.config.call_timeout_s} s") \
                from None

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
        stream = _IpcStream(session, sid, peer_id, protocol_id)
        session.streams[sid] = stream
        return stream

    async def connect(self, multiaddr: str) -> str:
        peer = await self._call("connect", multiaddr)
        self._known_addrs[peer] = multiaddr
        return str(peer)

    async def peers(self) -> list[PeerInfo]:
        return await self._refresh_peers()

    async def host_counters(self) -> dict[str, int]:
        """What the current host's guards and validation dropped (counts restart from 0 with each host)."""
        return dict(await self._call("counters"))

    def peers_snapshot(self) -> list[PeerInfo]:
        """The peer list as of the last poll (every health_interval_s), without a round trip."""
        return list(self._peers_snapshot)

    async def _refresh_peers(self) -> list[PeerInfo]:
        rows = await self._call("peers")
        infos = [PeerInfo(peer, tuple(addrs), latency, tuple(topics)) for peer, addrs, latency, topics in rows]
        self._peers_snapshot = infos
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
