"""Connectivity: staying connected to bootstrap peers, and telling the user what our own addresses imply.

Finding the rest of the swarm and learning whether peers can dial us are the transport's job, done with the
standard libp2p protocols (libp2p/nat.py: Kademlia rendezvous on the swarm topic, AutoNAT with a fresh-connection
dial-back, circuit relays, DCUtR; docs/NAT.md). This module speaks no protocol of its own.

Contract (works on any `Transport`):
- `BootstrapKeeper(transport, addrs).run()`: dials every bootstrap address at start; whenever we have no peer at
  all, redials them, and when none answers the peers we were last connected to (`known`, at most
  MAX_KNOWN_PEERS, one address each, all at once), with exponential backoff. When nobody answers it logs one
  clear WARNING ("no bootstrap peer answered ... training solo") and keeps retrying quietly; `state` is "solo" or
  "connected" for status output. `on_peers(peers)`, if given, gets the peers connected now at every check (every
  `check_interval_s` while connected), e.g. for the status API's connected-peer count.
- `local_self_check(addrs)`: classifies our advertised addresses (loopback / private / public) and test-dials
  the local ones over TCP; `ReachabilityReport.advice` says what to do when peers outside could not dial us.
- `start_network(transport, bootstrap)`: everything above wired for a node at start (what `swarm-node join` runs),
  plus `nat_report.watch_nat` on a transport with NAT traversal (its AutoNAT verdict, logged and for /status).
- Pure helpers: `tcp_endpoint(multiaddr)`, `classify_host(ip)`, `expand_unspecified(multiaddr)`,
  `dialable_addr(peer_info)`.
"""

from __future__ import annotations

import asyncio
import enum
import ipaddress
import logging
import random
import socket
from collections.abc import Callable
from dataclasses import dataclass

from swarm_node.transport.base import PeerInfo, Transport, TransportError, TransportUnavailable
from swarm_node.transport.nat_report import watch_nat
from swarm_node.transport.supervisor import Backoff

log = logging.getLogger(__name__)

DIAL_TIMEOUT_S = 3.0
MAX_KNOWN_PEERS = 32  # peers we were connected to, redialled (one address each) when we have none left


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
    # failed dial from here would say nothing; AutoNAT (peers dialling us back) judges those.
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
        return ReachabilityReport(None, f"announcing {', '.join(public)}; AutoNAT (peers' dial-back) will confirm "
                                        f"whether it is reachable", "")
    private = [a for a, _, reach, _ in results if reach is Reach.PRIVATE]
    return ReachabilityReport(None, f"peers on this network can dial {', '.join(private)}; peers elsewhere "
                                    f"cannot dial it directly unless a port is forwarded (AutoNAT will tell)",
                              _forward_advice(port))


def _unspecified(multiaddr: str) -> bool:
    endpoint = tcp_endpoint(multiaddr)
    return endpoint is not None and classify_host(endpoint[0]) is Reach.UNSPECIFIED


def dialable_addr(info: PeerInfo) -> str | None:
    """An address to redial a connected peer at later: its first address that is neither a wildcard nor a relay
    circuit, with /p2p/<peer id> appended when missing; None when it has none."""
    for addr in info.addrs:
        if _unspecified(addr) or "/p2p-circuit" in addr:
            continue
        return addr if "/p2p/" in addr else f"{addr.rstrip('/')}/p2p/{info.peer_id}"
    return None


class BootstrapKeeper:
    """Keep peers: dial the bootstrap addresses at start, and whenever we have no peer at all redial them and the
    peers we were last connected to, with backoff. Finding more peers is the transport's (libp2p: the DHT)."""

    def __init__(self, transport: Transport, addrs: list[str], backoff: Backoff | None = None,
                 check_interval_s: float = 5.0, rng: random.Random | None = None,
                 on_peers: Callable[[list[PeerInfo]], None] | None = None) -> None:
        self.transport = transport
        self.on_peers = on_peers
        self.addrs = list(addrs)
        self.backoff = backoff or Backoff(initial_s=1.0, factor=2.0, max_s=60.0)
        self.check_interval_s = check_interval_s
        self.rng = rng or random.Random()
        self.state = "solo"
        self.known: dict[str, str] = {}  # peer id -> an address of a peer we were connected to (newest last)
        self.tasks: list[asyncio.Task[None]] = []  # what start_network runs on the loop for this keeper

    def stop(self) -> None:
        for task in self.tasks:
            task.cancel()

    def remember(self, peers: list[PeerInfo]) -> None:
        """Note where our current peers can be redialled; the oldest are forgotten past MAX_KNOWN_PEERS."""
        for info in peers:
            addr = dialable_addr(info)
            if addr is not None:
                self.known.pop(info.peer_id, None)
                self.known[info.peer_id] = addr
        for peer in list(self.known)[:max(0, len(self.known) - MAX_KNOWN_PEERS)]:
            del self.known[peer]

    async def _dial(self, addr: str) -> str | None:
        try:
            return await self.transport.connect(addr)
        except (TransportError, ValueError) as exc:
            log.info("%s did not answer: %s", addr, exc)
            return None

    async def dial_all(self) -> list[str]:
        """Dial every bootstrap address; if none answers, every known peer at once (a peer behind NAT may make its
        dial wait out the connect timeout). Returns the peer ids that answered."""
        answered = [peer for addr in self.addrs if (peer := await self._dial(addr)) is not None]
        if not answered:
            others = [addr for addr in self.known.values() if addr not in self.addrs]
            answered = [peer for peer in await asyncio.gather(*map(self._dial, others)) if peer is not None]
        return list(dict.fromkeys(answered))

    async def run(self) -> None:
        attempt = 0
        warned = False
        if not self.addrs:
            log.warning("no --bootstrap given: training solo until a peer dials us")
        while True:
            try:
                peers = await self.transport.peers()
                if self.on_peers is not None:
                    self.on_peers(peers)
                self.remember(peers)
                connected = {p.peer_id for p in peers}
                answered = await self.dial_all() if not connected and (self.addrs or self.known) else []
                connected |= set(answered)
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
    """Node start-up on a started transport: log our addresses and what the local reachability check says, and
    start the BootstrapKeeper. A transport with NAT traversal (`nat_status`, libp2p) also gets
    `nat_report.watch_nat`: its AutoNAT verdict logged in one line at each change, and `on_nat(summary)` for
    /status. Returns the keeper (its task runs on the loop; `state` says solo/connected)."""
    addrs = transport.listen_addrs()
    log.warning("peer id %s; others can join with --bootstrap %s", transport.peer_id, addrs[0] if addrs else "?")
    for line in (await local_self_check(addrs)).log_lines():
        log.warning("reachability: %s", line)
    keeper = BootstrapKeeper(transport, bootstrap, **keeper_args)  # type: ignore[arg-type]
    loop = asyncio.get_running_loop()
    keeper.tasks.append(loop.create_task(keeper.run(), name="bootstrap-keeper"))
    if hasattr(transport, "nat_status"):
        keeper.tasks.append(loop.create_task(watch_nat(transport, on_nat), name="nat-report"))
    return keeper
