"""`swarm-node join` (--role peer): a SAPO peer on a real libp2p network.

Wiring only: the network and the node's assembly as a SAPO peer (wiring.joined, node/assembly.py: the rollout
exchange with validation, replay protection and the node's wire limits, the pool, the one ingest path), and the
node's own loop over the peer's source (sample, share, mix, train). If no bootstrap peer
answers, the node says so and trains solo until one does. A network failure never stops training: groups that
cannot be published are counted and logged.
"""

from __future__ import annotations

from swarm_node.config import NodeConfig
from swarm_node.node.assembly import Sharing
from swarm_node.node.run_files import NodeEvents, RunSummary
from swarm_node.roles.wiring import joined
from swarm_node.status.stats import NodeStats


def run(cfg: NodeConfig, stats: NodeStats, events: NodeEvents) -> RunSummary:
    with joined(cfg, stats, events, Sharing.SAPO) as (assembly, _net, _me):
        return assembly.run()
