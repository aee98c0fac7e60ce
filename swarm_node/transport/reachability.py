"""Reachability verdicts from AutoNAT dial-backs, sans-I/O.

Contract: `Verdicts(need_public)` collects one verdict per AutoNAT server (the latest answer of each counts):
`record(server, dialled_ip)` for a server that dialled us back on a fresh connection at `dialled_ip`,
`record(server, None)` for one that tried and failed. `status()` is
  - "public" once `need_public` distinct servers reached us at a public IP and more servers reached us than failed;
  - "private" once any server failed and fewer than `need_public` reached us publicly;
  - "unknown" before that (the node is never called public without proof; it reserves a relay once private).
A dial-back that reached us at a private or loopback IP (a peer on our own LAN) proves nothing about the internet
and is not counted. A node behind NAT can only be called public if `need_public` servers lie, or its router
forwards the port (then it is public). `status_line(...)` is the one line a node logs at start and /status shows.
"""

from __future__ import annotations

import enum
import ipaddress
from dataclasses import dataclass, field

PUBLIC_CONFIRMATIONS = 3  # libp2p's AutoNAT asks for "more than three"; a small swarm may have fewer servers


class Reachability(enum.Enum):
    UNKNOWN = "unknown"
    PUBLIC = "public"
    PRIVATE = "private"


def is_public_ip(ip: str) -> bool:
    try:
        addr = ipaddress.ip_address(ip)
    except ValueError:
        return False
    return addr.is_global


@dataclass
class Verdicts:
    need_public: int = PUBLIC_CONFIRMATIONS
    reached: dict[str, bool] = field(default_factory=dict)  # server -> reached us at a public IP

    def __post_init__(self) -> None:
        if self.need_public < 1:
            raise ValueError(f"need_public must be >= 1, got {self.need_public}")

    def record(self, server: str, dialled_ip: str | None) -> None:
        if dialled_ip is None:
            self.reached[server] = False
        elif is_public_ip(dialled_ip):
            self.reached[server] = True
        else:
            self.reached.pop(server, None)  # a LAN peer reached us: says nothing about the internet

    @property
    def successes(self) -> int:
        return sum(self.reached.values())

    @property
    def failures(self) -> int:
        return len(self.reached) - self.successes

    def status(self) -> Reachability:
        if self.successes >= self.need_public and self.successes > self.failures:
            return Reachability.PUBLIC
        if self.failures:
            return Reachability.PRIVATE
        return Reachability.UNKNOWN


def status_line(status: Reachability, verdicts: Verdicts, observed: list[str], circuit_addrs: list[str]) -> str:
    """One line for the log at start and for /status."""
    tally = f"{verdicts.successes} of {len(verdicts.reached)} AutoNAT servers reached us by a fresh dial"
    seen = f"; peers see us at {', '.join(observed[:3])}" if observed else ""
    if status is Reachability.PUBLIC:
        return f"reachability: public ({tally}{seen}); serving as a relay if enabled"
    if status is Reachability.PRIVATE:
        via = (f"; reachable through relay at {circuit_addrs[0]}" if circuit_addrs
               else "; no relay reservation yet")
        return f"reachability: private, behind NAT or firewall ({tally}{seen}){via}"
    return f"reachability: unknown so far ({tally}{seen}); a relay slot is reserved once a dial-back fails"
