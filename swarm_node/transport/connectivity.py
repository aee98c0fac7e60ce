"""Connectivity: staying connected to bootstrap peers, and telling the user whether peers can dial us.

Contract (works on any `Transport`):
- `BootstrapKeeper(transport, addrs).run()`: dials every bootstrap address at start; whenever we have no peer at
  all, redials them with exponential backoff. When none answers it logs one clear WARNING ("no bootstrap peer
  answered ... training solo") and keeps retrying quietly; `state` is "solo" or "connected" for status output.
- `local_self_check(addrs)`: classifies our advertised addresses (loopback / private / public) and test-dials
  each one over TCP; `ReachabilityReport.advice` says what to do when peers outside could not dial us.
- The dial-back protocol (`serve_dialback`, `ask_dialback`): a peer we are connected to opens a plain TCP
  connection to the IP it sees our connection come from, at the port we name, and answers reachable or not.
  It only ever dials the asker's own observed IP, so it cannot be used to make a node dial third parties.
- Pure helpers: `tcp_endpoint(multiaddr)`, `classify_host(ip)`, `expand_unspecified(multiaddr)`.
"""

from __future__ import annotations

import asyncio
import enum
import ipaddress
import logging
import random
import socket
import struct
from dataclasses import dataclass

from swarm_node.transport.base import Stream, Transport, TransportError, TransportUnavailable
from swarm_node.transport.supervisor import Backoff

log = logging.getLogger(__name__)

DIALBACK_PROTOCOL = "/swarm-node/dialback/1.0.0"
DIAL_TIMEOUT_S = 3.0


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
    results = [(a, ep, classify_host(ep[0]), await tcp_dial(*ep)) for a, ep in endpoints]
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


class BootstrapKeeper:
    """Keep at least one peer: dial the bootstrap addresses at start and whenever we are alone, with backoff."""

    def __init__(self, transport: Transport, addrs: list[str], backoff: Backoff | None = None,
                 check_interval_s: float = 5.0, rng: random.Random | None = None) -> None:
        self.transport = transport
        self.addrs = list(addrs)
        self.backoff = backoff or Backoff(initial_s=1.0, factor=2.0, max_s=60.0)
        self.check_interval_s = check_interval_s
        self.rng = rng or random.Random()
        self.state = "solo"

    async def dial_all(self) -> list[str]:
        """Dial every bootstrap address once; returns the peer ids that answered."""
        answered: list[str] = []
        for addr in self.addrs:
            try:
                answered.append(await self.transport.connect(addr))
            except (TransportError, ValueError) as exc:
                log.info("bootstrap %s did not answer: %s", addr, exc)
        return answered

    async def run(self) -> None:
        attempt = 0
        warned = False
        if not self.addrs:
            log.warning("no --bootstrap given: training solo until a peer dials us")
            return
        while True:
            try:
                alone = not await self.transport.peers()
                answered = await self.dial_all() if alone else []
            except TransportUnavailable:
                await asyncio.sleep(self.check_interval_s)
                continue
            if alone and not answered:
                self.state = "solo"
                if not warned:
                    log.warning("no bootstrap peer answered (tried %s); training solo and retrying with backoff "
                                "(up to every %.0f s)", ", ".join(self.addrs), self.backoff.max_s)
                    warned = True
                await asyncio.sleep(self.backoff.delay(attempt, self.rng.random()))
                attempt += 1
                continue
            if answered:
                log.info("connected to bootstrap peer(s) %s", ", ".join(answered))
            self.state = "connected"
            attempt, warned = 0, False
            await asyncio.sleep(self.check_interval_s)
