"""The dialable addresses a digest batch may carry (schema 4): `/ip4/<a>/tcp/<port>` and `/ip6/<a>/tcp/<port>`.

Contract (sans-I/O, stdlib only): `parse_dial_addr(text)` returns `(ip, port)` for an address in canonical form
(the IP as Python's `ipaddress` writes it: dotted quad, compressed lower-case IPv6, no zone; the port in decimal
without a leading zero, 1..65535), else None. No DNS names (a name is resolved at dial time, so a receiver could
not check what it dials before it does), no relay or other protocols, no `/p2p/` part: the address is the gossip
signer's, and the receiver appends the signer's peer id itself. One spelling per address keeps the receivers'
per-address caps exact.
"""

from __future__ import annotations

import ipaddress

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
_PARSERS: dict[str, type[ipaddress.IPv4Address] | type[ipaddress.IPv6Address]] = {
    "ip4": ipaddress.IPv4Address, "ip6": ipaddress.IPv6Address}


def parse_dial_addr(text: str) -> tuple[IPAddress, int] | None:
    parts = text.split("/")
    if len(parts) != 5 or parts[0] != "" or parts[1] not in _PARSERS or parts[3] != "tcp" or "%" in parts[2]:
        return None
    try:
        ip = _PARSERS[parts[1]](parts[2])
    except ValueError:
        return None
    port = parts[4]
    if str(ip) != parts[2] or not (port.isascii() and port.isdigit()) or str(int(port)) != port:
        return None
    if not 1 <= int(port) <= 65535:
        return None
    return ip, int(port)
