"""`[network]` (libp2p for `join`), `[echo]` (ECHO-2 publishing and reporting) and `[status]` (the status API)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from protocol.relay import DEFAULT_SCHEDULE, ScheduleError, make_plan
from swarm_node import variants
from swarm_node.config.checks import non_negative, one_of, positive
from swarm_node.errors import ConfigError


@dataclass(frozen=True)
class NetworkConfig:
    """libp2p settings for `join`: listen/announce multiaddrs without /p2p, bootstrap multiaddrs with it."""

    section: ClassVar[str] = "network"

    role: str = "peer"  # variants.ROLES: peer (SAPO) | learner | worker (ECHO-2)
    learner: str = ""  # worker: the learner's peer id to follow
    listen: str = "/ip4/0.0.0.0/tcp/0"
    announce_addr: list[str] = field(default_factory=list)
    bootstrap: list[str] = field(default_factory=list)
    identity: str = ""  # key file; empty: RUN_DIR/identity.key (created on first use)
    # Serve as a circuit relay for peers behind NAT: auto = once AutoNAT says we are public (docs/NAT.md).
    relay: str = "auto"  # auto | on | off
    relay_circuit_mb: int = 64  # bytes one relayed circuit may carry before the relay resets it
    relay_max_reservations: int = 32  # peers that may hold a slot on us as a relay
    # Ask the router to forward our listen port by UPnP first, where it offers that (docs/NAT.md).
    upnp: bool = True

    def validate(self) -> None:
        one_of(self, "role", variants.ROLES)
        one_of(self, "relay", variants.RELAY_MODES)
        if self.relay_circuit_mb < 1 or self.relay_max_reservations < 0:
            raise ConfigError("network.relay_circuit_mb must be >= 1 and network.relay_max_reservations >= 0")
        if not isinstance(self.upnp, bool):
            raise ConfigError(f"network.upnp must be true or false, got {self.upnp!r}")
        if self.role == "worker" and not self.learner:
            raise ConfigError("a worker needs the learner to follow: --learner PEER_ID (printed by the learner)")
        for addr in [self.listen, *self.announce_addr, *self.bootstrap]:
            if not isinstance(addr, str) or not addr.startswith("/"):
                raise ConfigError(f"{addr!r} is not a multiaddr (e.g. /ip4/1.2.3.4/tcp/4001/p2p/12D3Koo...)")
        for addr in self.bootstrap:
            if "/p2p/" not in addr:
                raise ConfigError(f"bootstrap address {addr!r} lacks the peer id (/p2p/...)")
        if "/tcp/" not in self.listen or "/udp/" in self.listen:
            # py-libp2p 0.8.1's QUIC loses data and cannot hole-punch (docs/NAT.md): the host builds TCP only, and
            # a QUIC listen address would silently listen on nothing.
            raise ConfigError(f"network.listen {self.listen!r}: the node listens on TCP only "
                              f"(/ip4/0.0.0.0/tcp/PORT); py-libp2p 0.8.1's QUIC is not used (docs/NAT.md)")


@dataclass(frozen=True)
class EchoConfig:
    """ECHO-2 mode: how a learner publishes its policy and how workers report (see swarm_node/echo/)."""

    section: ClassVar[str] = "echo"

    encoding: str = "topk"  # variants.CODECS: policy delta encoding (policy_sync/codecs.py)
    publish_every: int = 1  # kappa: publish a policy update every kappa learner steps
    schedule: str = DEFAULT_SCHEDULE  # relay schedule for the pipelined broadcast (protocol.relay)
    chunk_bytes: int = 1 << 20
    keep_versions: int = 8  # updates kept to serve late joiners
    heartbeat_s: float = 5.0  # a worker's status message period
    cost_per_hour: float = 0.0  # a worker's price, reported to its learner, which prefers cheap throughput
    snapshot_every: int = 25  # the learner also publishes a full snapshot every N updates, for joiners
    # A worker refuses an update whose L2 norm (new - current policy) exceeds this per published step (0: off).
    # 10.0 is ~60x the default model's updates (docs/MEASUREMENTS.md). The norm grows with lr and sqrt(parameters):
    # raise it for a larger model or learning rate.
    max_delta_norm: float = 10.0

    def validate(self) -> None:
        one_of(self, "encoding", variants.CODECS)
        try:
            make_plan(self.schedule, "source", ["receiver"])
        except ScheduleError as exc:
            raise ConfigError(f"echo.schedule: {exc}") from exc
        positive(self, "publish_every", "chunk_bytes", "keep_versions", "heartbeat_s", "snapshot_every")
        non_negative(self, "cost_per_hour", "max_delta_norm")


@dataclass(frozen=True)
class StatusConfig:
    section: ClassVar[str] = "status"

    host: str = "127.0.0.1"
    port: int = 8470  # 0: ephemeral; -1: no status server
    token: str = ""

    def validate(self) -> None:
        if not -1 <= self.port <= 65535:
            raise ConfigError(f"status.port must be -1 (off), 0 (ephemeral) or a port number, got {self.port}")
