"""py-libp2p 0.8.1's QUIC transport on loopback (no namespaces needed), against TCP + Noise + yamux: a measurement,
not a test. `python -m tests.netns.quic_probe {basic,bulk,churn,idle} [--transport quic|tcp] ...`; docs/NAT.md
quotes its output.

- basic: connect, a stream echo, gossipsub both ways (times).
- bulk --mib M --runs N [--patch-read]: one stream of M MiB written in 64 KiB pieces, then close_write; the reader
  keeps everything to EOF and the bytes are compared. Over QUIC the tail goes missing in some runs: the last data
  frame arrives with the FIN while `QUICStream.read` is between its buffer check and its `_read_closed` check
  (transport/quic/stream.py:251-266), so it reports EOF with bytes still buffered. --patch-read re-checks the buffer
  on EOF (our would-be workaround), to show that this is the cause.
- churn --cycles N: connect, one echo, disconnect, N times; fds, RSS, trio tasks and the QUIC listener's
  `_conn_by_quic_id` table (one entry left per closed connection) every 25 cycles.
- idle --seconds S: gossip, S seconds of quiet, gossip again (QUIC streams end after STREAM_READ_TIMEOUT, 30 s).
"""

from __future__ import annotations

import argparse
import gc
import os
import resource
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from typing import Any

import multiaddr
import trio
from libp2p import new_host
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.crypto.x25519 import create_new_key_pair as create_x25519_key_pair
from libp2p.network.stream.exceptions import StreamEOF
from libp2p.peer.peerinfo import info_from_p2p_addr
from libp2p.pubsub.gossipsub import PROTOCOL_ID_V11, PROTOCOL_ID_V12, GossipSub
from libp2p.pubsub.pubsub import Pubsub
from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_PROTOCOL_ID
from libp2p.security.noise.transport import Transport as NoiseTransport
from libp2p.tools.anyio_service import background_trio_service
from libp2p.transport.quic import stream as quic_stream

ECHO, SINK, TOPIC = "/probe/echo/1", "/probe/sink/1", "probe"
T0 = time.monotonic()


def say(*parts: object) -> None:
    print(f"{time.monotonic() - T0:7.2f}s", *parts, flush=True)


def _host(transport: str) -> tuple[Any, list[multiaddr.Multiaddr]]:
    key_pair = create_new_key_pair()
    security = {NOISE_PROTOCOL_ID: NoiseTransport(key_pair, noise_privkey=create_x25519_key_pair().private_key)}
    addrs = [multiaddr.Multiaddr("/ip4/127.0.0.1/udp/0/quic-v1" if transport == "quic" else "/ip4/127.0.0.1/tcp/0")]
    return new_host(key_pair=key_pair, sec_opt=security, listen_addrs=addrs), addrs


async def _read_all(stream: Any) -> bytes:
    data = bytearray()
    while True:
        try:
            chunk = await stream.read(1 << 16)
        except StreamEOF:
            return bytes(data)
        if not chunk:
            return bytes(data)
        data += chunk


async def _echo(stream: Any) -> None:
    await stream.write(b"echo:" + await stream.read(1024))
    await _read_all(stream)


async def _pair(transport: str, body: Callable[[Any, Any], Awaitable[None]]) -> None:
    (a, la), (b, lb) = _host(transport), _host(transport)
    async with AsyncExitStack() as stack:
        await stack.enter_async_context(a.run(la))
        await stack.enter_async_context(b.run(lb))
        a.set_stream_handler(ECHO, _echo)
        await body(a, b)


async def _echo_once(a: Any, b: Any) -> None:
    stream = await b.new_stream(a.get_id(), [ECHO])
    await stream.write(b"x")
    assert await stream.read(64) == b"echo:x"
    await stream.close()


async def basic(args: argparse.Namespace) -> None:
    async def body(a: Any, b: Any) -> None:
        gs = {h: GossipSub(protocols=[PROTOCOL_ID_V12, PROTOCOL_ID_V11], degree=3, degree_low=2, degree_high=4,
                           heartbeat_interval=1, heartbeat_initial_delay=0.1) for h in (a, b)}
        ps = {h: Pubsub(h, gs[h], strict_signing=True) for h in (a, b)}
        async with AsyncExitStack() as stack:
            for h in (a, b):
                await stack.enter_async_context(background_trio_service(ps[h]))
                await stack.enter_async_context(background_trio_service(gs[h]))
                await ps[h].wait_until_ready()
            subs = {h: await ps[h].subscribe(TOPIC) for h in (a, b)}
            start = time.monotonic()
            await b.connect(info_from_p2p_addr(a.get_addrs()[0]))
            say(f"{args.transport}: connected in {time.monotonic() - start:.3f} s over",
                [type(c.muxed_conn).__name__ for c in b.get_network().get_connections(a.get_id())])
            start = time.monotonic()
            await _echo_once(a, b)
            say(f"{args.transport}: echo in {time.monotonic() - start:.3f} s")
            while b.get_id() not in ps[a].peer_topics.get(TOPIC, set()):
                await trio.sleep(0.05)
            for src, dst in ((a, b), (b, a)):
                start = time.monotonic()
                await ps[src].publish(TOPIC, b"hello " + src.get_id().to_bytes()[-4:])
                while (await subs[dst].get()).from_id != src.get_id().to_bytes():
                    pass
                say(f"{args.transport}: gossip delivered in {time.monotonic() - start:.3f} s")
            if args.idle:
                say(f"{args.transport}: {args.idle:.0f} s of quiet")
                await trio.sleep(args.idle)
                start = time.monotonic()
                await ps[a].publish(TOPIC, b"after the quiet")
                with trio.move_on_after(10):
                    while (await subs[b].get()).data != b"after the quiet":
                        pass
                    say(f"{args.transport}: gossip after {args.idle:.0f} s of quiet delivered in "
                        f"{time.monotonic() - start:.3f} s")
                    return
                say(f"{args.transport}: gossip after {args.idle:.0f} s of quiet NOT delivered within 10 s")

    await _pair(args.transport, body)


def _patch_read() -> None:
    original = quic_stream.QUICStream.read

    async def read(self: Any, n: int | None = None) -> bytes:
        try:
            return await original(self, n)
        except quic_stream._QUICStreamEOF:
            async with self._receive_buffer_lock:  # the final frame came with the FIN while read() looked away
                if self._receive_buffer:
                    return self._extract_data_from_buffer(-1 if n is None else n)
            raise

    quic_stream.QUICStream.read = read  # type: ignore[method-assign]


async def bulk(args: argparse.Namespace) -> None:
    if args.patch_read:
        _patch_read()
    got: list[bytes] = []
    done = trio.Event()

    async def sink(stream: Any) -> None:
        got.append(await _read_all(stream))
        await stream.write(b"ok")
        await stream.close_write()
        done.set()

    async def body(a: Any, b: Any) -> None:
        nonlocal done
        a.set_stream_handler(SINK, sink)
        await b.connect(info_from_p2p_addr(a.get_addrs()[0]))
        bad = 0
        for run in range(args.runs):
            data = os.urandom(args.mib << 20)
            got.clear()
            done = trio.Event()
            start = time.monotonic()
            stream = await b.new_stream(a.get_id(), [SINK])
            for i in range(0, len(data), 1 << 16):
                await stream.write(data[i:i + (1 << 16)])
            await stream.close_write()
            await done.wait()
            took = time.monotonic() - start
            ok = got[0] == data
            bad += not ok
            say(f"{args.transport} run {run}: {len(data) / took / 1e6:.2f} MB/s, "
                + ("intact" if ok else f"TRUNCATED: {len(got[0])} of {len(data)} bytes "
                   f"(the first {len(got[0])} equal: {got[0] == data[:len(got[0])]})"))
        say(f"{args.transport}: {bad} of {args.runs} transfers lost bytes" + (" (read patched)" if args.patch_read
                                                                               else ""))

    await _pair(args.transport, body)


async def churn(args: argparse.Namespace) -> None:
    def rss_mb() -> float:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize() / 1e6

    def quic_tables(host: Any) -> str:
        for t in host.get_network().transport_manager.get_transports():
            for listener in getattr(t, "_listeners", []):
                return f"listener _conn_by_quic_id {len(listener._conn_by_quic_id)}"
        return ""

    async def body(a: Any, b: Any) -> None:
        target = info_from_p2p_addr(a.get_addrs()[0])
        fds, rss = len(os.listdir("/proc/self/fd")), rss_mb()
        start = time.monotonic()
        for i in range(1, args.cycles + 1):
            await b.connect(target)
            await _echo_once(a, b)
            await b.disconnect(a.get_id())
            if i % 25 == 0:
                await trio.sleep(1.0)
                gc.collect()
                say(f"{args.transport} cycle {i}: {(time.monotonic() - start) / i * 1000:.0f} ms a cycle, fds "
                    f"{len(os.listdir('/proc/self/fd')) - fds:+d}, RSS {rss_mb() - rss:+.1f} MB, trio tasks "
                    f"{trio.lowlevel.current_statistics().tasks_living}, A's connections "
                    f"{len(a.get_network().get_connections())}, A's {quic_tables(a)}")

    await _pair(args.transport, body)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["basic", "bulk", "churn", "idle"])
    parser.add_argument("--transport", default="quic", choices=["quic", "tcp"])
    parser.add_argument("--mib", type=int, default=4)
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--patch-read", action="store_true")
    parser.add_argument("--cycles", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=45.0)
    args = parser.parse_args()
    args.idle = args.seconds if args.what == "idle" else 0.0
    run = {"basic": basic, "idle": basic, "bulk": bulk, "churn": churn}[args.what]
    trio.run(run, args)


if __name__ == "__main__":
    main()
