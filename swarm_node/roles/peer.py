"""`swarm-node join` (--role peer): a SAPO peer on a real libp2p network.

Wiring only: the network and the node (wiring.joined), the rollout exchange over it (validation, replay
protection, the node's wire limits), and the node's own loop (sample, share, mix, train). If no bootstrap peer
answers, the node says so and trains solo until one does. A network failure never stops training: groups that
cannot be published are counted and logged.
"""

from __future__ import annotations

from swarm_node.config import NodeConfig
from swarm_node.node.run_files import NodeEvents, RunSummary
from swarm_node.roles.wiring import BackgroundExchange, joined, open_exchange
from swarm_node.sharing.exchange import accept_policy_for
from swarm_node.status.stats import NodeStats


def run(cfg: NodeConfig, stats: NodeStats, events: NodeEvents) -> RunSummary:
    with joined(cfg, stats, events) as (node, net, _me):
        exchange = open_exchange(net, node, accept_policy_for(node.task_source))
        node.exchange = BackgroundExchange(exchange, net, events, stats)
        return node.run()
