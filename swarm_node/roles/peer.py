"""`swarm-node join`: a SAPO peer on a real libp2p network.

Wiring only: a persistent identity, the libp2p transport on its own loop thread (`BackgroundTransport`, the host
itself in a supervised child process), the rollout exchange over it (validation, replay protection), and the
node's step loop (sample, share, mix, train). The network starts before the model loads so the address to join
us is printed at once; if no bootstrap peer answers, the node says so and trains solo until one does. A network
failure never stops training: groups that cannot be published are counted and logged.
"""

from __future__ import annotations

import logging
from pathlib import Path

from protocol.limits import Limits
from protocol.messages import RolloutGroup
from swarm_node.config import NodeConfig
from swarm_node.identity import IDENTITY_FILENAME, Identity, load_or_create
from swarm_node.node.core import Node, NodeEvents, RunSummary, prepare_run_dir
from swarm_node.sharing.exchange import Received, TransportExchange, accept_policy_for
from swarm_node.status.stats import NodeStats
from swarm_node.transport.background import BackgroundTransport
from swarm_node.transport.base import TransportError

log = logging.getLogger(__name__)


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
    from swarm_node.transport.libp2p_ipc import HostSettings
    from swarm_node.transport.libp2p_transport import LibP2PConfig, LibP2PTransport

    run_dir = Path(cfg.run.run_dir)
    prepare_run_dir(run_dir)
    identity = load_or_create(Path(cfg.network.identity) if cfg.network.identity else run_dir / IDENTITY_FILENAME)
    stats.update(peer_id=identity.peer_id, role=cfg.network.role)
    stats.set_phase("connecting")
    settings = HostSettings(listen=(cfg.network.listen,), announce=tuple(cfg.network.announce_addr))
    net = BackgroundTransport(lambda: LibP2PTransport(identity, LibP2PConfig(host=settings)))
    net.start()
    try:
        addrs = net.listen_addrs()
        stats.update(listen_addrs=addrs)
        events.log(f"peer id {identity.peer_id}")
        for addr in addrs:
            events.log(f"join this node with: --bootstrap {addr}")
        net.start_network(list(cfg.network.bootstrap))
    except BaseException:
        net.stop()
        raise
    return identity, net


def run_peer(cfg: NodeConfig, stats: NodeStats, events: NodeEvents) -> RunSummary:
    if cfg.network.role != "peer":
        from swarm_node.roles.echo import run_echo_role

        return run_echo_role(cfg, stats, events)
    _identity, net = start_libp2p(cfg, stats, events)
    node: Node | None = None
    try:
        node = Node(cfg, stats, events)
        node.setup()
        exchange = TransportExchange(net.transport, Limits(), accept_policy_for(node.task_source))
        net.call(lambda _transport: exchange.start())
        node.exchange = BackgroundExchange(exchange, net, events, stats)
        return node.run()
    finally:
        if node is not None:
            node.close()
        net.stop()
