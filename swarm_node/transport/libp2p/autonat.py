"""AutoNAT (libp2p's /libp2p/autonat/1.0.0) with a dial-back that is never fooled by the asker's own connection.

Why a subclass: py-libp2p 0.8.1's `AutoNATService._try_dial` calls `host.connect`, which returns at once when any
connection to the peer exists, and the asker always has one (it sent the request over it): every asker, NAT or
not, is told "reachable". `FreshDialAutoNAT._try_dial` instead opens a new TCP connection to the address and runs
the Noise handshake on it, so the answer is OK only if the address accepts a connection from outside *and* the
peer behind it holds the asker's key; then it closes that connection. The library's own guards stay (it dials
only addresses at the asker's observed IP, and refuses requests that arrive over a relay). The wire protocol is
the standard one, so a go/rust/js peer can ask us or answer us.

Contract (trio, runs in the network host): `FreshDialAutoNAT(host)` serves the protocol; `ask(server)` sends one
DIAL request with `dialback_candidates()` and records the answer in `verdicts` (reachability.Verdicts).
As a server it dials back each asking IP at most once per DIALBACK_INTERVAL_S (more: E_DIAL_REFUSED, counted in
`refused_rate`), at most MAX_CONCURRENT_DIALBACKS at once.
`dialback_candidates()`: our TCP listen port at every IP we have, plus what identify's observed addresses say.
"""

from __future__ import annotations

import logging

import multiaddr
import trio
from libp2p.host.autonat.autonat import AutoNATService
from libp2p.host.autonat.pb.autonat_pb2 import Message
from libp2p.peer.id import ID

from swarm_node.transport.reachability import Verdicts

log = logging.getLogger(__name__)

DIALBACK_TIMEOUT_S = 5.0
ASK_TIMEOUT_S = 15.0
DIALBACK_INTERVAL_S = 10.0  # at most one dial-back per asking IP in this long; more are refused
MAX_CONCURRENT_DIALBACKS = 4


def tcp_parts(addr: multiaddr.Multiaddr) -> tuple[str, int] | None:
    parts = str(addr).strip("/").split("/")
    if len(parts) >= 4 and parts[0] in ("ip4", "ip6") and parts[2] == "tcp":
        return parts[1], int(parts[3])
    return None


class FreshDialAutoNAT(AutoNATService):
    """AutoNAT server and client whose dial-back always uses a new connection (see the module docstring)."""

    def __init__(self, host: object, need_public: int) -> None:
        super().__init__(host, serve=True)  # type: ignore[arg-type]
        self.verdicts = Verdicts(need_public=need_public)
        self.dialbacks_served = 0
        self.refused_rate = 0
        self._last_dialback: dict[str, float] = {}  # asking IP -> trio time of its last dial-back
        self._dialing = trio.Semaphore(MAX_CONCURRENT_DIALBACKS)

    async def _handle_dial(self, message: Message, observed_ip: str | None, is_relayed: bool) -> Message:
        """Rate limits first: one dial-back per asking IP per DIALBACK_INTERVAL_S, and at most
        MAX_CONCURRENT_DIALBACKS at once (a flood of requests cannot make us dial without bound)."""
        now = trio.current_time()
        if observed_ip is not None and not is_relayed:
            last = self._last_dialback.get(observed_ip)
            if last is not None and now - last < DIALBACK_INTERVAL_S:
                self.refused_rate += 1
                response = Message()
                response.type = Message.DIAL_RESPONSE
                response.dialResponse.status = Message.E_DIAL_REFUSED
                response.dialResponse.statusText = "too many dial-back requests; try later"
                return response
            if len(self._last_dialback) >= 4096:  # bounded: forget the oldest half
                for ip, _ in sorted(self._last_dialback.items(), key=lambda kv: kv[1])[:2048]:
                    del self._last_dialback[ip]
            self._last_dialback[observed_ip] = now
        async with self._dialing:
            return await super()._handle_dial(message, observed_ip, is_relayed)

    async def _try_dial(self, peer_id: ID, addrs: list[bytes]) -> bytes | None:
        """Dial up to 4 of the asker's addresses at once, each on a new connection; the first that completes a
        Noise handshake with `peer_id` wins. Bounded by DIALBACK_TIMEOUT_S in all (a NAT drops rather than
        refuses, so a dial-back that fails mostly times out)."""
        winner: list[bytes] = []
        with trio.move_on_after(DIALBACK_TIMEOUT_S) as scope:
            async with trio.open_nursery() as nursery:
                for raw_addr in addrs[:4]:
                    nursery.start_soon(self._dial_one, peer_id, raw_addr, winner, scope)
        if winner:
            self.dialbacks_served += 1
            return winner[0]
        return None

    async def _dial_one(self, peer_id: ID, raw_addr: bytes, winner: list[bytes], scope: trio.CancelScope) -> None:
        maddr = multiaddr.Multiaddr(raw_addr)
        swarm = self.host.get_network()
        transport = swarm.transport_manager.transport_for_dialing(maddr)  # type: ignore[attr-defined]
        if transport is None or tcp_parts(maddr) is None:
            return
        raw_conn = None
        try:
            raw_conn = await transport.dial(maddr)
            secured = await swarm.upgrader.upgrade_security(raw_conn, True, peer_id)  # type: ignore[attr-defined]
            await secured.close()
            winner.append(bytes(raw_addr))
            scope.cancel()
        except Exception as exc:  # a dial that fails in any way is a "no" for that address
            log.debug("AutoNAT dial-back to %s failed: %s", maddr, exc)
        finally:
            if raw_conn is not None:
                with trio.CancelScope(shield=True):
                    try:
                        await raw_conn.close()
                    except Exception:  # already closed with the secured connection
                        pass

    def dialback_candidates(self) -> list[bytes]:
        """Our listen port at every IP we know for ourselves (listen addrs, identify's observations)."""
        ports = sorted({p[1] for a in self.host.get_transport_addrs() if (p := tcp_parts(a)) is not None})
        ips: list[str] = []
        for addr in self.host.get_transport_addrs():
            part = tcp_parts(addr)
            if part is not None and part[0] not in ("0.0.0.0", "::"):
                ips.append(part[0])
        observed = getattr(self.host, "_observed_addr_manager", None)
        seen_addrs = list(observed.addrs(1)) if observed is not None else []
        for addr in seen_addrs:
            part = tcp_parts(addr)
            if part is not None:
                ips.append(part[0])
        out = [multiaddr.Multiaddr(f"/ip4/{ip}/tcp/{port}") for ip in dict.fromkeys(ips) for port in ports
               if ":" not in ip]
        out += [a for a in seen_addrs if tcp_parts(a) is not None]  # the mapped port itself (full-cone NATs)
        return [a.to_bytes() for a in dict.fromkeys(out)]

    def observed_addrs(self) -> list[str]:
        observed = getattr(self.host, "_observed_addr_manager", None)
        return [str(a) for a in observed.addrs(1)] if observed is not None else []

    async def ask(self, server: ID) -> None:
        """One dial-back request to `server`; its answer (if it gives one) replaces its previous verdict."""
        try:
            status, addr = await self.query_server(server, self.dialback_candidates(), ASK_TIMEOUT_S)
        except Exception as exc:  # does not speak AutoNAT, went away, timed out: no verdict
            log.debug("AutoNAT request to %s failed: %s", server, exc)
            return
        if status == int(Message.OK) and addr is not None:
            part = tcp_parts(multiaddr.Multiaddr(addr))
            self.verdicts.record(server.to_base58(), part[0] if part is not None else None)
        elif status == int(Message.E_DIAL_ERROR):
            self.verdicts.record(server.to_base58(), None)
        # E_DIAL_REFUSED / E_BAD_REQUEST / E_INTERNAL_ERROR: the server would not try; no verdict
