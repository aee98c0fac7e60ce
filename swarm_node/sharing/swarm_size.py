"""The shard count a bounded fan-in node uses, learnt from what it sees of the swarm (issue 32).

Contract (pure: no I/O). A node cannot count the swarm; it sees its connected peers and the distinct senders whose
digests reached it on its shards during an epoch. `estimate_swarm(heard, connected, shards, joined)`: with M
`shards` in use and j of them `joined`, another node shares one of our shards with probability about min(1, j*j/M)
(each node is in j of M), so N ~ (heard + 1) * M / min(M, j*j) (we count ourselves); never below `connected + 1`
and never above `max_swarm_estimate` (a sybil flood of digest senders cannot push it further).
`ShardCount(params, shards)` holds M between epochs: `next_epoch(heard, connected)` returns the M of the next epoch.
It changes only when the estimate leaves the band [threshold(M) * (1 - h), threshold(M + 1) * (1 + h)) where
threshold(m) = m * shard_size / shards_per_node is the smallest swarm `fanin.shard_count` gives m shards (h =
`shard_hysteresis`): a swarm near a boundary does not flap. It then moves to `shard_count(estimate)`, by at most a
factor `max_shard_step` per epoch either way (a burst of fake senders grows M only step by step).

A node that joins a running swarm cannot estimate N from its first shard: at M = 1 it would listen on shard 0,
where every newcomer of the epoch would pile up while the shards of the nodes that left shrink. So it starts
`learning`: it announces M = 0 ("not learnt"), and `learn(announced)` takes `announced_shard_count`, the lower
median of the M that distinct digest senders announce (at least `learn_from_peers` of them; at most
`shard_count(max_swarm_estimate)`), at once, without the step cap. Fewer than half of the senders it heard cannot
move the median beyond the honest ones' range. Learning ends there, or at its first epoch change (its own estimate
then rules, as for every node: a swarm whose nodes all start together has nobody to learn from). The M taken is on
probation for one round: `confirm(heard)` with fewer than `learn_from_peers` distinct senders heard on the new
shards (a lie that put us on a shard nobody is in, or a swarm that shrank) goes back to the starting M, learning.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from swarm_node.sharing.fanin import FanInParams, shard_count


def estimate_swarm(heard: int, connected: int, shards: int, joined: int, params: FanInParams) -> int:
    """N as the node sees it (see the module contract)."""
    if heard < 0 or connected < 0 or shards < 1 or joined < 1:
        counts = (heard, connected, shards, joined)
        raise ValueError(f"estimate_swarm needs counts >= 0 and shards, joined >= 1; got {counts}")
    from_digests = math.ceil((heard + 1) * shards / min(shards, joined * joined))
    return min(max(from_digests, connected + 1), params.max_swarm_estimate)


def threshold(shards: int, params: FanInParams) -> float:
    """The smallest swarm for which `shard_count` gives `shards` shards."""
    return shards * params.shard_size / params.shards_per_node


def announced_shard_count(announced: Iterable[int], params: FanInParams) -> int | None:
    """The M a joining node takes from the M its peers announce (one per distinct sender; 0: not learnt, left out):
    their lower median, at most `shard_count(max_swarm_estimate)`; None with fewer than `learn_from_peers`."""
    known = sorted(m for m in announced if m > 0)
    if len(known) < params.learn_from_peers:
        return None
    return min(known[(len(known) - 1) // 2], shard_count(params.max_swarm_estimate, params))


class ShardCount:
    def __init__(self, params: FanInParams, shards: int = 1, learning: bool = False) -> None:
        if shards < 1:
            raise ValueError(f"ShardCount needs shards >= 1, got {shards}")
        self.params, self.shards, self._start = params, shards, shards
        self.learning = learning  # a node that has just joined: M is to be taken from its peers' announcements
        self.probation = False  # M was just taken from peers: the next round's senders must confirm it
        self.estimate = 0  # the last epoch's swarm estimate (0: none yet)

    @property
    def announced(self) -> int:
        """The M this node announces in its digest batches: 0 while it is learning (not a view of the swarm)."""
        return 0 if self.learning else self.shards

    def learn(self, announced: Iterable[int]) -> bool:
        """While learning, take `announced_shard_count` of the M that distinct senders announced, if enough did;
        True when M was taken (learning is then over)."""
        if not self.learning:
            return False
        shards = announced_shard_count(announced, self.params)
        if shards is None:
            return False
        self.shards, self.learning, self.probation = shards, False, True
        return True

    def confirm(self, heard: int) -> bool:
        """The round after `learn`: with fewer than `learn_from_peers` distinct senders heard on the new shards, go
        back to the starting M, learning again; True then (the node moves back)."""
        if not self.probation:
            return False
        self.probation = False
        if heard >= self.params.learn_from_peers:
            return False
        self.shards, self.learning = self._start, True
        return True

    def next_epoch(self, heard: int, connected: int, joined: int) -> int:
        p = self.params
        self.learning = self.probation = False  # an epoch of its own view: from now on the node's estimate rules
        self.estimate = estimate_swarm(heard, connected, self.shards, joined, p)
        low = threshold(self.shards, p) * (1 - p.shard_hysteresis) if self.shards > 1 else 0.0
        high = threshold(self.shards + 1, p) * (1 + p.shard_hysteresis)
        if low <= self.estimate < high:
            return self.shards
        target = shard_count(self.estimate, p)
        step = p.max_shard_step
        self.shards = max(min(target, self.shards * step), math.ceil(self.shards / step), 1)
        return self.shards
