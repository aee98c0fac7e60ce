"""UPnP port mapping: a node's first NAT-traversal attempt, before AutoNAT's verdict, relays and hole punching.

Contract (trio, runs in the network host; NatServices starts `PortMapper().run(port)` in its nursery when
`HostSettings.upnp` is on, and waits for `settled` before its first AutoNAT round):
- `run(port)` finds the router's Internet Gateway Device (SSDP, then its description), asks its external IP and, if
  that IP is public, asks it to forward TCP `port` to us with the same external port (so the address AutoNAT's
  servers dial back, our listen port at the IP they see us at, is the mapped one) for LEASE_S seconds, renewed
  every LEASE_S / 2, so a node that dies without deleting it leaves nothing forwarded for long (a gateway that
  takes only permanent mappings gets lease 0). The first attempt ends within BUDGET_S whatever the gateway does
  (then `settled` is set and the outcome logged at INFO); when cancelled (the host stops) it deletes the mapping,
  for at most REMOVE_TIMEOUT_S. Nothing raises out of `run()`: a gateway that answers garbage, refuses, stalls or
  goes away becomes an outcome, and the node goes on with AutoNAT and relays.
- `outcome` (`UpnpOutcome`): a state (off | trying | not_tried | mapped | no_gateway | double_nat | refused), the
  one line the node logs and /status shows, and `external_addr` (/ip4/<ip>/tcp/<port>) while mapped, which
  NatServices adds first to the addresses we advertise (identify, DHT provider records).
- Pure: `usable_external_ip` (only a global address: private, carrier-grade NAT 100.64.0.0/10 or none means a
  NAT in front of the gateway, a double NAT, where a mapping reaches no one), `judge` (what an attempt's answers
  mean), `mappable_port` (which listen port is worth mapping).

Why miniupnpc directly and not py-libp2p 0.8.1's `libp2p.discovery.upnp.UpnpManager` (a thin wrapper over the same
miniupnpc), measured against miniupnpd 2.3.1 in a router namespace (tests/integration/test_nat_upnp.py):
- no deadline can bound it: its calls run on threads trio cannot abandon, so a gateway that stalls also stalls the
  host's shutdown. Ours are abandoned at the deadline.
- every failure is the same `False`, with misleading ERROR logs: with no gateway at all, miniupnpc's `discover()`
  raises Exception("Success"), which the manager takes for one device found, then logs "UPnP devices were found,
  but none are valid Internet Gateway Devices"; a gateway whose WAN address is private (miniupnpd then answers an
  empty external IP) is logged as "a smart home device". The one line we owe the user could not say which it was.
- its double-NAT check is `is_private`, which is False for carrier-grade NAT addresses (100.64.0.0/10): it would map
  a port nobody on the internet can reach, and we would advertise it.
- it maps with lease 0 (permanent): a host killed before it deletes the mapping (the supervisor SIGKILLs a hung
  one) would leave the port forwarded on the user's router for good.
"""

from __future__ import annotations

import ipaddress
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import miniupnpc
import trio

from swarm_node.transport.reachability import is_public_ip

log = logging.getLogger(__name__)

# miniupnpc waits at least 1 s per SSDP search type and tries 4 when no one answers: 4 s to learn there is no
# gateway (measured), ~1 s to find one that answers. The rest is for its description and two SOAP calls.
BUDGET_S = 6.0
DISCOVER_DELAY_MS = 1000
LEASE_S = 3600
REMOVE_TIMEOUT_S = 3.0
DESCRIPTION = "swarm-node"
GOING_ON = "continuing with AutoNAT/relays"


@dataclass(frozen=True)
class UpnpOutcome:
    state: str
    line: str
    external_addr: str = ""  # /ip4/<ip>/tcp/<port> while mapped

    def status(self) -> dict[str, str]:
        return {"state": self.state, "line": self.line, "external_addr": self.external_addr}


OFF = UpnpOutcome("off", "UPnP: off (network.upnp = false)")
TRYING = UpnpOutcome("trying", "UPnP: looking for a gateway")
NOT_TRIED = UpnpOutcome("not_tried", "UPnP: not tried (no TCP listen port on a LAN address to map)")


def usable_external_ip(ip: str | None) -> bool:
    """Whether peers on the internet could reach a port mapped at `ip`: only a global address. Private, carrier-grade
    NAT (100.64.0.0/10), loopback, unspecified, empty or unparsable: no (another NAT sits in front of the gateway)."""
    return ip is not None and is_public_ip(ip)


def judge(port: int, external_ip: str | None, error: str = "", mapped: bool = False) -> UpnpOutcome:
    """What one attempt's answers mean. `external_ip`: None when no gateway answered (`error` says why, when known),
    else the gateway's answer ("" when it gave none); `mapped`: whether it took the mapping (`error`: why not)."""
    why = f" ({error})" if error else ""
    if external_ip is None:
        return UpnpOutcome("no_gateway", f"UPnP: no {'usable ' if error else ''}gateway answered{why}; {GOING_ON}")
    if not external_ip:
        return UpnpOutcome("double_nat", "UPnP: the gateway reports no public external address (double NAT, or its "
                                         f"internet link is down); no port mapped; {GOING_ON}")
    if not usable_external_ip(external_ip):
        return UpnpOutcome("double_nat", f"UPnP: the gateway's external address {external_ip} is not public: another "
                                         f"NAT is in front of it (double NAT); no port mapped; {GOING_ON}")
    if not mapped:
        return UpnpOutcome("refused", f"UPnP: the gateway at {external_ip} refused to map TCP port {port}{why}; "
                                      f"{GOING_ON}")
    return UpnpOutcome("mapped", f"UPnP: mapped TCP port {port} as {external_ip}:{port}",
                       f"/ip4/{external_ip}/tcp/{port}")


def mappable_port(listen_addrs: list[str]) -> int | None:
    """The TCP port of the first IPv4 listen address that a gateway could forward to: a wildcard or a LAN address.
    None when we listen only on loopback (nothing outside could reach it) or on public addresses (nothing to
    traverse). IPv6 needs no port mapping (an IGD opens v6 pinholes, which we do not ask for)."""
    for addr in listen_addrs:
        parts = addr.strip("/").split("/")
        if len(parts) < 4 or parts[0] != "ip4" or parts[2] != "tcp":
            continue
        try:
            ip = ipaddress.ip_address(parts[1])
        except ValueError:
            continue
        if ip.is_unspecified or not (ip.is_loopback or ip.is_global):
            return int(parts[3])
    return None


class PortMapper:
    """One UPnP port mapping, kept while the host runs (see the module docstring). `gateway` makes the miniupnpc
    client (tests pass a fake one)."""

    def __init__(self, gateway: Callable[[], Any] = miniupnpc.UPnP, budget_s: float = BUDGET_S,
                 lease_s: int = LEASE_S) -> None:
        self._new_gateway = gateway
        self.budget_s, self.lease_s = budget_s, lease_s
        self.outcome = TRYING
        self.settled = trio.Event()
        self.external_ip: str | None = None
        self._gateway: Any = None
        self._lease = lease_s

    async def run(self, port: int | None) -> None:
        if port is None:
            self.outcome = NOT_TRIED
            self.settled.set()
            return
        try:
            self.outcome = await self._first_attempt(port)
            self.settled.set()
            log.info("%s", self.outcome.line)
            while self._gateway is not None:  # renew the lease (or retry a refusal) while the gateway is there
                await trio.sleep(self.lease_s / 2 if self._lease else math.inf)
                outcome = judge(port, None, f"the gateway did not answer within {self.budget_s:g} s")
                with trio.move_on_after(self.budget_s):
                    outcome = await self._refresh(port)
                if outcome.line != self.outcome.line:
                    log.info("%s", outcome.line)
                self.outcome = outcome
        except Exception as exc:  # miniupnpc raising where we did not expect it: UPnP is only a first attempt
            log.warning("UPnP failed", exc_info=True)
            self.outcome = judge(port, None, f"{type(exc).__name__}: {exc}")
        finally:
            self.settled.set()
            if self.outcome.state == "mapped":
                await self._delete(port)

    async def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """A blocking miniupnpc call on a worker thread that a deadline or cancellation abandons (the thread ends
        on its own when miniupnpc's socket timeouts fire)."""
        return await trio.to_thread.run_sync(fn, *args, abandon_on_cancel=True)

    async def _first_attempt(self, port: int) -> UpnpOutcome:
        error = f"no answer within {self.budget_s:g} s"
        with trio.move_on_after(self.budget_s):
            error = await self._discover()
            if self._gateway is None or not usable_external_ip(self.external_ip):
                return judge(port, self.external_ip, error)
            return await self._map(port)
        return judge(port, self.external_ip, error)

    async def _discover(self) -> str:
        """Find the gateway and its external IP (sets `_gateway` and `external_ip`); returns why not, if known."""
        gateway = self._new_gateway()
        gateway.discoverdelay = DISCOVER_DELAY_MS
        try:
            found = await self._call(gateway.discover)
        except Exception as exc:
            # miniupnpc's discover() raises Exception("Success") when no device answered at all.
            return "" if str(exc) == "Success" else f"discovery failed: {exc}"
        if not found:
            return ""
        try:
            await self._call(gateway.selectigd)
            external = await self._call(gateway.externalipaddress)
        except Exception as exc:  # a device answered, but no gateway we can use (or garbage)
            return f"a device answered but is not a usable gateway: {exc}"
        self._gateway = gateway
        self.external_ip = external if isinstance(external, str) else ""
        return ""

    async def _map(self, port: int) -> UpnpOutcome:
        gw = self._gateway
        try:
            try:
                await self._call(gw.addportmapping, port, "TCP", gw.lanaddr, port, DESCRIPTION, "", self._lease)
            except Exception as exc:
                if not (self._lease and "OnlyPermanentLeasesSupported" in str(exc)):
                    raise
                self._lease = 0  # an IGDv1 router that takes only permanent mappings; deleted at shutdown
                await self._call(gw.addportmapping, port, "TCP", gw.lanaddr, port, DESCRIPTION, "", 0)
        except Exception as exc:  # refused (a conflict, a deny rule), or an answer miniupnpc could not read
            return judge(port, self.external_ip, str(exc) or type(exc).__name__)
        return judge(port, self.external_ip, mapped=True)

    async def _refresh(self, port: int) -> UpnpOutcome:
        """The lease renewal: the external IP may have changed (we must not advertise a stale one), then map."""
        try:
            external = await self._call(self._gateway.externalipaddress)
        except Exception as exc:
            return judge(port, None, f"the gateway stopped answering: {exc}")
        self.external_ip = external if isinstance(external, str) else ""
        if not usable_external_ip(self.external_ip):
            return judge(port, self.external_ip)
        return await self._map(port)

    async def _delete(self, port: int) -> None:
        # Shielded: this runs because the host is being cancelled; bounded so shutdown never waits on the gateway.
        with trio.CancelScope(shield=True) as scope:
            scope.deadline = trio.current_time() + REMOVE_TIMEOUT_S
            try:
                await self._call(self._gateway.deleteportmapping, port, "TCP")
                log.info("UPnP: removed the mapping of TCP port %d", port)
            except Exception as exc:  # gone already, or the gateway went away: its lease ends it
                log.info("UPnP: could not remove the mapping of TCP port %d: %s", port, exc)
