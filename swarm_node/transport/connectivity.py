"""Connectivity: staying connected to bootstrap peers, and telling the user whether peers can dial us.

Contract (works on any `Transport`):
- `BootstrapKeeper(transport, addrs).run()`: dials every bootstrap address at start; whenever we have no peer at
  all, redials them (and the peers it learnt) with exponential backoff. When none answers it logs one clear
  WARNING ("no bootstrap peer answered ... training solo") and keeps retrying quietly; `state` is "solo" or
  "connected" for status output.
- `local_self_check(addrs)`: classifies our advertised addresses (loopback / private / public) and test-dials
  the local ones over TCP; `ReachabilityReport.advice` says what to do when peers outside could not dial us.
- The dial-back protocol (`serve_dialback`, `ask_dialback`): a peer we are connected to opens a plain TCP
  connection to the IP it sees our connection come from, at the port we name, and answers reachable or not.
  It only ever dials the asker's own observed IP, so it cannot be used to make a node dial third parties.
- Peer exchange (`serve_peer_exchange`, `ask_peers`): a peer answers with up to MAX_SHARED_PEERS multiaddrs of
  the peers it is connected to; `BootstrapKeeper` asks after joining and while it has fewer than `min_peers`, so
  the swarm stays connected when its bootstrap leaves. Answers are untrusted: bounded, strictly checked, and we
  dial at most `min_peers` of them per round.
- `start_network(transport, bootstrap)`: everything above wired for a node at start (what `swarm-node join` runs).
- Pure helpers: `tcp_endpoint(multiaddr)`, `classify_host(ip)`, `expand_unspecified(multiaddr)`,
  `encode_peer_list`, `decode_peer_list`.
"""

from __future__ import annotations

import asyncio
import enum
import ipaddress
import logging
import random
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass

import msgpack

from swarm_node.transport.base import Stream, Transport, TransportError, TransportUnavailable
from swarm_node.transport.nat_report import watch_nat
from swarm_node.transport.supervisor import Backoff

log = logging.getLogger(__name__)

DIALBACK_PROTOCOL = "/swarm-node/dialback/1.0.0"
PEERS_PROTOCOL = "/swarm-node/peers/1.0.0"
DIAL_TIMEOUT_S = 3.0
MAX_SHARED_PEERS = 32
MAX_ADDRS_PER_PEER = 4
MAX_ADDR_CHARS = 256
MAX_PEER_LIST_BYTES = MAX_SHARED_PEERS * MAX_ADDRS_PER_PEER * (MAX_ADDR_CHARS + 8) + 16


class Reach(enum.Enum):
    LOOPBACK = "loopback"
    PRIVATE = "private"
    PUBLIC = "public"
    UNSPECIFIED = "unspecified"
    NAME = "dns name"


def tcp_endpoint(multiaddr: str) -> tuple[str, int] | None:
    """(host, port) of a /ip4|ip6|dns|dns4|dns6/<host>/tcp/<port>/... multiaddr, else None."""
    parts = multiaddr.strip("/").split("/")
    if len(parts) < 4 or parts[0] not in ("ip4", "ip6", "dns", "dns4", "dns6") or parts[2] != "tcp":
        return None
    try:
        port = int(parts[3])
    except ValueError:
        return None
    return (parts[1], port) if 0 < port < 65536 else None


def classify_host(host: str) -> Reach:
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return Reach.NAME
    if ip.is_unspecified:
        return Reach.UNSPECIFIED
    if ip.is_loopback:
        return Reach.LOOPBACK
    # is_private covers RFC 1918, link-local and unique-local; 100.64/10 (carrier-grade NAT) is "shared".
    if ip.is_private or ip in ipaddress.ip_network("100.64.0.0/10"):
        return Reach.PRIVATE
    return Reach.PUBLIC


def primary_ipv4() -> str | None:
    """The local IPv4 address of the default route (a UDP connect sends no packet), None without a route."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # TEST-NET-1: never routed anywhere real
            return str(probe.getsockname()[0])
        except OSError:
            return None


def expand_unspecified(multiaddr: str, primary: str | None = None) -> list[str]:
    """A listener on 0.0.0.0 is not dialable: name the addresses it actually accepts on (primary, loopback)."""
    if not multiaddr.startswith("/ip4/0.0.0.0/"):
        return [multiaddr]
    rest = multiaddr[len("/ip4/0.0.0.0/"):]
    primary = primary if primary is not None else primary_ipv4()
    hosts = [h for h in (primary, "127.0.0.1") if h]
    return [f"/ip4/{h}/{rest}" for h in dict.fromkeys(hosts)]


@dataclass(frozen=True)
class ReachabilityReport:
    reachable: bool | None  # None: could not tell
    summary: str
    advice: str

    def log_lines(self) -> list[str]:
        return [self.summary] + ([self.advice] if self.advice else [])


async def tcp_dial(host: str, port: int, timeout: float = DIAL_TIMEOUT_S) -> bool:
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    except (OSError, asyncio.TimeoutError):
        return False
    writer.close()
    try:
        await writer.wait_closed()
    except OSError:
        pass
    return True


def _forward_advice(port: int) -> str:
    return (f"to let peers outside your network dial you, forward TCP port {port} on your router to this machine "
            f"and start with --announce-addr /ip4/<your public IP>/tcp/{port}; meanwhile you can still dial out "
            f"(--bootstrap) and exchange with the peers you reach")


async def local_self_check(addrs: list[str]) -> ReachabilityReport:
    """What our advertised addresses imply, plus a TCP dial to each (does something listen there?)."""
    endpoints = [(a, ep) for a in addrs if (ep := tcp_endpoint(a)) is not None]
    if not endpoints:
        return ReachabilityReport(None, f"no TCP address to check among {addrs}", "")
    # Only local addresses are dialled: a public one may not loop back through the NAT (no hairpinning), so a
    # failed dial from here would say nothing; a peer's dial-back judges those.
    results = []
    for addr, ep in endpoints:
        reach = classify_host(ep[0])
        local = reach in (Reach.LOOPBACK, Reach.PRIVATE)
        results.append((addr, ep, reach, await tcp_dial(*ep) if local else True))
    dead = [a for a, _, reach, ok in results if not ok and reach in (Reach.LOOPBACK, Reach.PRIVATE)]
    if dead:
        return ReachabilityReport(False, f"nothing accepts connections at {', '.join(dead)}",
                                  "check --listen and --announce-addr: they must name this machine")
    kinds = {reach for _, _, reach, _ in results}
    port = results[0][1][1]
    if kinds <= {Reach.LOOPBACK}:
        return ReachabilityReport(False, "listening on loopback only: only processes on this machine can dial us",
                                  f"listen on all interfaces (--listen /ip4/0.0.0.0/tcp/{port}) to let others in")
    if Reach.PUBLIC in kinds or Reach.NAME in kinds:
        public = [a for a, _, reach, _ in results if reach in (Reach.PUBLIC, Reach.NAME)]
        return ReachabilityReport(None, f"announcing {', '.join(public)}; a peer's dial-back will confirm whether "
                                        f"it is reachable", "")
    private = [a for a, _, reach, _ in results if reach is Reach.PRIVATE]
    return ReachabilityReport(None, f"peers on this network can dial {', '.join(private)}; peers elsewhere "
                                    f"cannot unless a port is forwarded", _forward_advice(port))


async def serve_dialback(transport: Transport) -> None:
    """Answer dial-back requests: one at a time, only to the asker's observed IP."""
    busy = asyncio.Semaphore(1)

    async def handler(stream: Stream) -> None:
        (port,) = struct.unpack("!H", await stream.read_exactly(2))
        if stream.remote_addr is None or port == 0:
            answer = 2
        else:
            async with busy:
                answer = 1 if await tcp_dial(stream.remote_addr[0], port) else 0
        await stream.write(bytes([answer]))
        await stream.close()
        await stream.read()  # wait for the asker's end (or EOF) so the answer is not cut off by a reset

    await transport.serve_stream(DIALBACK_PROTOCOL, handler)


async def ask_dialback(transport: Transport, peer_id: str, port: int, timeout: float = 10.0) -> bool | None:
    """Ask a connected peer to dial us on `port`: True/False, None when it cannot tell or does not answer."""
    try:
        stream = await transport.open_stream(peer_id, DIALBACK_PROTOCOL)
        await stream.write(struct.pack("!H", port))
        answer = await asyncio.wait_for(stream.read_exactly(1), timeout)
        await stream.close()
    except (TransportError, asyncio.TimeoutError):
        return None
    return {0: False, 1: True}.get(answer[0])


async def peer_check(transport: Transport, peer_id: str, addr: str) -> ReachabilityReport:
    """Reachability of `addr` as seen from `peer_id` (a connected peer that serves the dial-back protocol)."""
    endpoint = tcp_endpoint(addr)
    if endpoint is None:
        return ReachabilityReport(None, f"cannot check {addr}: not a TCP address", "")
    verdict = await ask_dialback(transport, peer_id, endpoint[1])
    if verdict is None:
        return ReachabilityReport(None, f"peer {peer_id} could not tell whether it can dial us", "")
    if verdict:
        return ReachabilityReport(True, f"peer {peer_id} dialled us back on TCP port {endpoint[1]}: reachable", "")
    return ReachabilityReport(False, f"peer {peer_id} could NOT dial us back on TCP port {endpoint[1]}",
                              _forward_advice(endpoint[1]))


def _unspecified(multiaddr: str) -> bool:
    endpoint = tcp_endpoint(multiaddr)
    return endpoint is not None and classify_host(endpoint[0]) is Reach.UNSPECIFIED


def encode_peer_list(addrs: list[str]) -> bytes:
    return msgpack.packb(addrs[:MAX_SHARED_PEERS * MAX_ADDRS_PER_PEER], use_bin_type=True)


def decode_peer_list(data: bytes, own_peer_id: str) -> dict[str, list[str]]:
    """peer id -> addresses from a peer's answer; ValueError for anything but a bounded list of /p2p multiaddrs."""
    if len(data) > MAX_PEER_LIST_BYTES:
        raise ValueError(f"peer list of {len(data)} bytes")
    try:
        items = msgpack.unpackb(data, raw=False)
    except (ValueError, msgpack.ExtraData) as exc:
        raise ValueError(f"undecodable peer list: {exc}") from None
    if not isinstance(items, list) or len(items) > MAX_SHARED_PEERS * MAX_ADDRS_PER_PEER:
        raise ValueError("peer list is not a bounded list")
    out: dict[str, list[str]] = {}
    for addr in items:
        if not isinstance(addr, str) or len(addr) > MAX_ADDR_CHARS or not addr.startswith("/"):
            raise ValueError(f"not a multiaddr: {str(addr)[:80]!r}")
        parts = addr.rstrip("/").split("/")
        if len(parts) < 3 or parts[-2] != "p2p" or not parts[-1].isalnum():
            raise ValueError(f"address without /p2p/<peer id>: {addr[:80]!r}")
        if parts[-1] != own_peer_id and len(out.setdefault(parts[-1], [])) < MAX_ADDRS_PER_PEER:
            out[parts[-1]].append(addr)
    if len(out) > MAX_SHARED_PEERS:
        raise ValueError(f"{len(out)} peers in one answer")
    return out


async def serve_peer_exchange(transport: Transport) -> None:
    """Answer peer-exchange requests with the dialable addresses of our other peers."""

    async def handler(stream: Stream) -> None:
        addrs: list[str] = []
        for info in await transport.peers():
            if info.peer_id == stream.remote_peer:
                continue
            usable = [a for a in info.addrs if "/p2p/" in a and not _unspecified(a)]
            addrs += usable[:MAX_ADDRS_PER_PEER]
            if len(addrs) >= MAX_SHARED_PEERS * MAX_ADDRS_PER_PEER:
                break
        await stream.write(encode_peer_list(addrs))
        await stream.close()
        await stream.read()

    await transport.serve_stream(PEERS_PROTOCOL, handler)


async def ask_peers(transport: Transport, peer_id: str, timeout: float = 10.0) -> dict[str, list[str]]:
    """The peers `peer_id` is connected to ({} when it does not answer or answers nonsense)."""
    try:
        stream = await transport.open_stream(peer_id, PEERS_PROTOCOL)
        await stream.close()

        async def read_all() -> bytes:
            data = b""
            while chunk := await stream.read(1 << 16):
                data += chunk
                if len(data) > MAX_PEER_LIST_BYTES:
                    raise ValueError("peer list too long")
            return data

        return decode_peer_list(await asyncio.wait_for(read_all(), timeout), transport.peer_id)
    except (TransportError, ValueError, asyncio.TimeoutError) as exc:
        log.info("peer exchange with %s failed: %s", peer_id, exc)
        return {}


class BootstrapKeeper:
    """Keep peers: dial the bootstrap addresses at start and whenever we are alone (with backoff), and learn
    more peers by peer exchange while we have fewer than `min_peers`."""

    def __init__(self, transport: Transport, addrs: list[str], backoff: Backoff | None = None,
                 check_interval_s: float = 5.0, rng: random.Random | None = None, min_peers: int = 4,
                 exchange_interval_s: float = 30.0) -> None:
        self.transport = transport
        self.addrs = list(addrs)
        self.backoff = backoff or Backoff(initial_s=1.0, factor=2.0, max_s=60.0)
        self.check_interval_s = check_interval_s
        self.rng = rng or random.Random()
        self.min_peers = min_peers
        self.exchange_interval_s = exchange_interval_s
        self.state = "solo"
        self.learnt: dict[str, list[str]] = {}  # peers heard of by exchange, redialled when we are alone
        self.tasks: list[asyncio.Task[None]] = []  # what start_network runs on the loop for this keeper

    def stop(self) -> None:
        for task in self.tasks:
            task.cancel()

    async def dial_all(self) -> list[str]:
        """Dial every bootstrap address (then learnt peers) once; returns the peer ids that answered."""
        answered: list[str] = []
        for addr in self.addrs + [a for addrs in self.learnt.values() for a in addrs[:1]]:
            try:
                peer = await self.transport.connect(addr)
            except (TransportError, ValueError) as exc:
                log.info("%s did not answer: %s", addr, exc)
                continue
            if peer not in answered:
                answered.append(peer)
        return answered

    async def exchange(self, connected: set[str]) -> list[str]:
        """Ask one connected peer for its peers and dial new ones, up to min_peers; returns those reached."""
        if not connected or len(connected) >= self.min_peers:
            return []
        heard = await ask_peers(self.transport, self.rng.choice(sorted(connected)))
        self.learnt.update(heard)
        reached: list[str] = []
        for peer, addrs in heard.items():
            if peer in connected or len(connected) + len(reached) >= self.min_peers:
                continue
            for addr in addrs:
                try:
                    reached.append(await self.transport.connect(addr))
                    break
                except (TransportError, ValueError):
                    continue
        if reached:
            log.info("connected to %d more peer(s) by peer exchange", len(reached))
        return reached

    async def run(self) -> None:
        attempt = 0
        warned = False
        if not self.addrs:
            log.warning("no --bootstrap given: training solo until a peer dials us")
        loop = asyncio.get_running_loop()
        next_exchange = loop.time()
        while True:
            try:
                connected = {p.peer_id for p in await self.transport.peers()}
                answered = await self.dial_all() if not connected and (self.addrs or self.learnt) else []
                connected |= set(answered)
                if connected and (answered or loop.time() >= next_exchange):
                    connected |= set(await self.exchange(connected))
                    next_exchange = loop.time() + self.exchange_interval_s
            except TransportUnavailable:
                await asyncio.sleep(self.check_interval_s)
                continue
            if not connected:
                self.state = "solo"
                if not warned and self.addrs:
                    log.warning("no bootstrap peer answered (tried %s); training solo and retrying with backoff "
                                "(up to every %.0f s)", ", ".join(self.addrs), self.backoff.max_s)
                    warned = True
                await asyncio.sleep(self.backoff.delay(attempt, self.rng.random()))
                attempt += 1
                continue
            if answered:
                log.info("connected to peer(s) %s", ", ".join(answered))
            self.state = "connected"
            attempt, warned = 0, False
            await asyncio.sleep(self.check_interval_s)


async def start_network(transport: Transport, bootstrap: list[str],
                        on_nat: Callable[[dict[str, object]], None] | None = None,
                        **keeper_args: object) -> BootstrapKeeper:
    """Node start-up on a started transport: serve dial-back and peer exchange, log our addresses and what the
    local reachability check says, start the BootstrapKeeper, and once the first peer answers, log what its
    dial-back says. A transport with NAT traversal (`nat_status`, libp2p) also gets `nat_report.watch_nat`: its
    AutoNAT verdict logged in one line at each change, and `on_nat(summary)` for /status.
    Returns the keeper (its task runs on the loop; `state` says solo/connected)."""
    await serve_dialback(transport)
    await serve_peer_exchange(transport)
    addrs = transport.listen_addrs()
    log.warning("peer id %s; others can join with --bootstrap %s", transport.peer_id, addrs[0] if addrs else "?")
    for line in (await local_self_check(addrs)).log_lines():
        log.warning("reachability: %s", line)
    keeper = BootstrapKeeper(transport, bootstrap, **keeper_args)  # type: ignore[arg-type]
    loop = asyncio.get_running_loop()
    keeper.tasks.append(loop.create_task(keeper.run(), name="bootstrap-keeper"))

    async def first_peer_check() -> None:
        while not (peers := await _peers_or_empty(transport)):
            await asyncio.sleep(1.0)
        endpoint_addr = next((a for a in addrs if tcp_endpoint(a) is not None), None)
        if endpoint_addr is None:
            return
        for line in (await peer_check(transport, peers[0], endpoint_addr)).log_lines():
            log.warning("reachability: %s", line)

    keeper.tasks.append(loop.create_task(first_peer_check(), name="reachability"))
    if hasattr(transport, "nat_status"):
        keeper.tasks.append(loop.create_task(watch_nat(transport, on_nat), name="nat-report"))
    return keeper


async def _peers_or_empty(transport: Transport) -> list[str]:
    try:
        return [p.peer_id for p in await transport.peers()]
    except TransportUnavailable:
        return []
