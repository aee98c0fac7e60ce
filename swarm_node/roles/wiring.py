"""What every `swarm-node join` role shares: the libp2p start, the node it runs, and the channels over them.

- `start_libp2p(cfg, stats, events)`: identity, the libp2p host on its own loop thread (`BackgroundTransport`),
  our printed address, the bootstrap keeper; the network starts before the model loads. The host meets the swarm
  in the DHT at the rollout topic and reports reachability, relays and relayed bytes into `stats.network`, and the
  peers connected now (`stats.set_connected`, at each of the keeper's checks) for /status.
- `joined(cfg, stats, events, sharing)`: a context giving (the node's assembly, net, our peer id); it closes both.
  The node's peer guard pushes its reputation scores to the libp2p host (gossipsub's application-specific score,
  `push_scores`). A SAPO peer's exchange is started; `BackgroundExchange` adapts it for the node loop's thread
  (publish queues and flushes on the loop; a failure is counted, training goes on).
- `start_exchange(net, exchange)`: subscribes a role's rollout exchange (`Assembly.open_exchange`: the node's wire
  limits, its guard's hook) on the network's loop.
- `start_inbox(net, topic, limits, policy)`: a validated queue for a role's small messages (status, control).
- `gossip_validator(topic, limits, policy)`: `protocol.validation.validate_gossip` as a transport validator.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from protocol.limits import Limits
from protocol.messages import TOPIC_ROLLOUTS, RolloutGroup
from protocol.validation import AcceptPolicy, ReplayGuard, validate_gossip
from swarm_node.config import NodeConfig
from swarm_node.identity import IDENTITY_FILENAME, Identity, load_or_create
from swarm_node.node.assembly import Assembly, Sharing, assemble
from swarm_node.node.build import seeded
from swarm_node.node.run_files import NodeEvents, prepare_run_dir
from swarm_node.sharing.exchange import Received, TransportExchange
from swarm_node.status.stats import NodeStats
from swarm_node.transport.background import BackgroundTransport
from swarm_node.transport.base import TransportError, ValidationResult

PUSH_TIMEOUT_S = 5.0


class BackgroundExchange:
    """The node's `sharing.Exchange` for a transport running on a BackgroundTransport's loop thread."""

    def __init__(self, exchange: TransportExchange, net: BackgroundTransport, events: NodeEvents,
                 stats: NodeStats) -> None:
        self.exchange = exchange
        self.net = net
        self.events = events
        self.stats = stats

    @property
    def peer_id(self) -> str:
        return self.exchange.peer_id

    def publish(self, groups: list[RolloutGroup]) -> None:
        self.exchange.publish(groups)
        try:
            self.net.call(lambda _transport: self.exchange.flush())
        except (TransportError, TimeoutError) as exc:  # host restarting or overloaded: training goes on
            self.stats.count("errors", "publish_failed")
            self.events.log(f"warning: {len(groups)} group(s) not shared: {exc}")

    def drain(self) -> list[Received]:
        return self.exchange.drain()


def start_libp2p(cfg: NodeConfig, stats: NodeStats, events: NodeEvents) -> tuple[Identity, BackgroundTransport]:
    """Identity, the libp2p host on its own thread, our printed address, and the bootstrap keeper, started."""
    from swarm_node.transport.libp2p.ipc import HostSettings
    from swarm_node.transport.libp2p.transport import LibP2PConfig, LibP2PTransport

    run_dir = Path(cfg.run.run_dir)
    prepare_run_dir(run_dir)
    identity = load_or_create(Path(cfg.network.identity) if cfg.network.identity else run_dir / IDENTITY_FILENAME)
    stats.update(peer_id=identity.peer_id, role=cfg.network.role)
    stats.set_phase("connecting")
    settings = HostSettings(listen=(cfg.network.listen,), announce=tuple(cfg.network.announce_addr),
                            rendezvous=TOPIC_ROLLOUTS, relay_service=cfg.network.relay,
                            relay_circuit_bytes=cfg.network.relay_circuit_mb << 20,
                            relay_max_reservations=cfg.network.relay_max_reservations, upnp=cfg.network.upnp)
    net = BackgroundTransport(lambda: LibP2PTransport(identity, LibP2PConfig(host=settings)))
    net.start()
    try:
        addrs = net.listen_addrs()
        stats.update(listen_addrs=addrs)
        events.log(f"peer id {identity.peer_id}")
        for addr in addrs:
            events.log(f"join this node with: --bootstrap {addr}")
        net.start_network(list(cfg.network.bootstrap), on_nat=lambda summary: stats.update(network=summary),
                          on_peers=lambda peers: stats.set_connected({p.peer_id: p.latency_ms for p in peers}))
    except BaseException:
        net.stop()
        raise
    return identity, net


@contextlib.contextmanager
def joined(cfg: NodeConfig, stats: NodeStats, events: NodeEvents, sharing: Sharing,
           salt: Callable[[str], int] | None = None) -> Iterator[tuple[Assembly, BackgroundTransport, str]]:
    """The network first (our address is printed at once), then the node's assembly (`salt(peer_id)`: its task
    draws' salt), its peer guard pushing scores to the host; both closed on exit. A SAPO peer's exchange is started
    and publishes through `BackgroundExchange`."""
    identity, net = start_libp2p(cfg, stats, events)
    assembly: Assembly | None = None
    try:
        if cfg.run.seed is None:
            cfg = seeded(cfg, identity.peer_id)
            events.log(f"seed {cfg.run.seed}, derived from this node's identity (--seed N to choose one)")
        assembly = assemble(cfg, sharing, transport=net.transport, stats=stats, events=events,
                            salt=salt(identity.peer_id) if salt is not None else None, push=push_scores(net, stats),
                            outbox=lambda exchange: BackgroundExchange(exchange, net, events, stats))
        if assembly.exchange is not None:
            start_exchange(net, assembly.exchange)
        yield assembly, net, identity.peer_id
    finally:
        if assembly is not None:
            assembly.close()
        net.stop()


def start_exchange(net: BackgroundTransport, exchange: TransportExchange) -> TransportExchange:
    """Subscribe `exchange` on the network's loop."""
    net.call(lambda _transport: exchange.start())
    return exchange


def push_scores(net: BackgroundTransport, stats: NodeStats) -> Callable[[dict[str, float]], None]:
    """The peer guard's push: reputation scores to the libp2p host (a failure is counted; the host may restart)."""
    from swarm_node.transport.libp2p.transport import LibP2PTransport

    transport = net.transport
    if not isinstance(transport, LibP2PTransport):
        return lambda _scores: None

    def push(scores: dict[str, float]) -> None:
        try:
            net.call(lambda _t: transport.set_peer_scores(scores), timeout=PUSH_TIMEOUT_S)
        except (TransportError, TimeoutError, ValueError):
            stats.count("errors", "push_scores_failed")
    return push


def gossip_validator(topic: str, limits: Limits, policy: AcceptPolicy) -> Callable[[str, bytes], ValidationResult]:
    replay = ReplayGuard(limits.max_age_s)

    def validate(signer: str, data: bytes) -> ValidationResult:
        result = validate_gossip(topic, data, signer, limits=limits, policy=policy, now=time.time(), replay=replay)
        return ValidationResult.of(result.verdict)
    return validate


def start_inbox(net: BackgroundTransport, topic: str, limits: Limits, policy: AcceptPolicy) -> None:
    net.set_validator(topic, gossip_validator(topic, limits, policy))
    net.subscribe_queue(topic)
