"""Which digest senders a node dials before it pulls, and at which address (issue 32): pure, no I/O, no clock.

Contract:
- `scope(ip)`: "public", "private", "link_local", "loopback", or "never" (unspecified, multicast, reserved, shared
  and other special ranges: never dialled). An IPv4-mapped IPv6 address has its IPv4 address's scope.
- `announced_addrs(listen_addrs, limit)`: the addresses a node puts in its digest batches: its listen addresses in
  the form `protocol.addrs` accepts (the `/p2p/` part dropped), distinct, of its widest scope only (public, else
  private, else link-local, else loopback: a node with a public address does not tell the swarm its LAN's), in
  order, at most `limit`.
- `own_scopes(listen_addrs)`: the scopes of the networks the node itself listens on.
- `dialable(addrs, own)`: the addresses learnt from a peer that this node may dial, in the sender's order: public
  ones, and private, link-local or loopback ones only when the node itself listens on a network of that scope
  (a peer must not make us dial into our own LAN or host because it named such an address).
- `DialBook`: the caps on dials, per round (`new_round`): at most `dials_per_round` new dials, at most one per IP
  (whatever the port: an address names a host that may be a third party's), none to an IP whose dial failed
  (`failed`) within the last `dial_backoff_rounds` rounds. `plan(senders, connected, addrs_of, own)` returns
  {sender: address} for the senders, in the order given, that are not connected and have an address the caps
  allow; the planned dials count at once.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Collection, Iterable, Mapping

from protocol.addrs import IPAddress, parse_dial_addr
from swarm_node.sharing.fanin import FanInParams

SCOPE_ORDER = ("public", "private", "link_local", "loopback")  # widest first
NEVER = "never"


def scope(ip: IPAddress) -> str:
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return scope(ip.ipv4_mapped)
    if ip.is_unspecified or ip.is_multicast:
        return NEVER
    if ip.is_loopback:
        return "loopback"
    if ip.is_link_local:
        return "link_local"
    if ip.is_global:
        return "public"
    if ip.is_private and not ip.is_reserved:
        return "private"
    return NEVER


def _strip_peer(addr: str) -> str:
    head, sep, _ = addr.partition("/p2p/")
    return head if sep else addr


def _scoped(addrs: Iterable[str]) -> list[tuple[str, str]]:
    """(address, scope) of each address in `protocol.addrs`' form, `/p2p/` dropped, in order, distinct."""
    out: list[tuple[str, str]] = []
    for addr in addrs:
        bare = _strip_peer(addr)
        parsed = parse_dial_addr(bare)
        if parsed is not None and all(bare != seen for seen, _ in out):
            out.append((bare, scope(parsed[0])))
    return out


def announced_addrs(listen_addrs: Iterable[str], limit: int) -> tuple[str, ...]:
    scoped = _scoped(listen_addrs)
    widest = next((s for s in SCOPE_ORDER if any(s == own for _, own in scoped)), NEVER)
    return tuple(a for a, s in scoped if s == widest)[:limit] if widest != NEVER else ()


def own_scopes(listen_addrs: Iterable[str]) -> frozenset[str]:
    return frozenset(s for _, s in _scoped(listen_addrs) if s != NEVER)


def dialable(addrs: Iterable[str], own: Collection[str]) -> tuple[str, ...]:
    return tuple(a for a, s in _scoped(addrs) if s == "public" or (s != NEVER and s in own))


def host_of(addr: str) -> str:
    """The IP an address names (the unit the per-round and back-off caps count)."""
    return addr.split("/")[2]


class DialBook:
    def __init__(self, params: FanInParams) -> None:
        self.params = params
        self.round = 0
        self._dialled: set[str] = set()  # IPs dialled this round
        self._failed_at: dict[str, int] = {}  # IP -> the round its last dial failed

    def new_round(self) -> None:
        self.round += 1
        self._dialled = set()
        horizon = self.round - self.params.dial_backoff_rounds
        self._failed_at = {ip: r for ip, r in self._failed_at.items() if r >= horizon}

    def failed(self, addr: str) -> None:
        self._failed_at[host_of(addr)] = self.round

    def plan(self, senders: Iterable[str], connected: Collection[str], addrs_of: Mapping[str, Iterable[str]],
             own: Collection[str]) -> dict[str, str]:
        out: dict[str, str] = {}
        for sender in senders:
            if len(self._dialled) >= self.params.dials_per_round:
                break
            if sender in connected or sender in out:
                continue
            for addr in dialable(addrs_of.get(sender, ()), own):
                ip = host_of(addr)
                if ip not in self._dialled and ip not in self._failed_at:
                    self._dialled.add(ip)
                    out[sender] = addr
                    break
        return out
