"""What `swarm-node join --role NAME` runs: `ROLES[name](cfg, stats, events) -> RunSummary`.

Map:
- peer.py     a SAPO peer: the node's own loop, sharing rollouts with the swarm
- learner.py  an ECHO-2 learner: its workers' rollouts (LearnerSource) drive the node loop; policy broadcast
- worker.py   an ECHO-2 worker: WorkerSource generates for one learner; each batch is published and recorded
- apply_pause.py  a test/bench hook (off unless SWARM_NODE_PAUSE_APPLY is set): a worker pausing mid-apply
- wiring.py   what they share: libp2p start, the joined node, the rollout exchange, inboxes, gossip validation
Only roles/, simulations/, cli/ and bench/ import the node; components (echo/, sharing/, train/, ...) never do.
Importing this package is light: each role's module (torch, libp2p) loads when its role runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from swarm_node import variants

if TYPE_CHECKING:
    from swarm_node.config import NodeConfig
    from swarm_node.node.run_files import NodeEvents, RunSummary
    from swarm_node.status.stats import NodeStats

RoleRun = Callable[["NodeConfig", "NodeStats", "NodeEvents"], "RunSummary"]
ROLES: variants.Registry[RoleRun] = variants.Registry("role", variants.ROLES)


@ROLES.register("peer")
def run_peer(cfg: NodeConfig, stats: NodeStats, events: NodeEvents) -> RunSummary:
    from swarm_node.roles import peer

    return peer.run(cfg, stats, events)


@ROLES.register("learner")
def run_learner(cfg: NodeConfig, stats: NodeStats, events: NodeEvents) -> RunSummary:
    from swarm_node.roles import learner

    return learner.run(cfg, stats, events)


@ROLES.register("worker")
def run_worker(cfg: NodeConfig, stats: NodeStats, events: NodeEvents) -> RunSummary:
    from swarm_node.roles import worker

    return worker.run(cfg, stats, events)
