"""Launching the libp2p network host, and where it runs: a child process or a trio thread in this process.

py-libp2p is trio-only and pure Python, so the host runs apart from the node's event loop: in a child process
(`host_process.py`, isolation "process", the default: a crash in py-libp2p ends only the child, which the supervisor
in `transport.py` restarts) or on a trio thread inside the node (isolation "thread": a cheaper start, no crash
isolation); both speak the same frames (`ipc.py`) over a socketpair, so only the isolation differs. Why "process"
is the default, measured: docs/MEASUREMENTS.md.

Contract: `LAUNCHERS[config.isolation](child_sock, config)` starts a host on its end of a socketpair and returns a
`HostHandle` (wait for its end, kill it). The process launcher passes the socket as an inherited descriptor (the
key never appears in argv) and sends the host's stdout to our stderr; neither launcher loads trio or libp2p into
the node unless the thread isolation is used.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from swarm_node.transport.libp2p.ipc import HostSettings
from swarm_node.transport.supervisor import Backoff


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


class ProcessHandle(HostHandle):
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
        sys.executable, "-m", "swarm_node.transport.libp2p.host_process", "--ipc-fd", str(fd),
        "--log-level", config.host_log_level, pass_fds=(fd,), stdin=subprocess.DEVNULL, stdout=stdout,
    )
    child_sock.close()
    return ProcessHandle(proc)


class ThreadHandle(HostHandle):
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

    from swarm_node.transport.libp2p.host import run_host

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
    return ThreadHandle(thread, done, child_sock)


Launcher = Callable[[socket.socket, LibP2PConfig], Awaitable[HostHandle]]
LAUNCHERS: dict[str, Launcher] = {"process": launch_process, "thread": launch_thread}
