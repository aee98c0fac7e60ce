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
"""

from __future__ import annotations

import math

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


class ShardCount:
    def __init__(self, params: FanInParams, shards: int = 1) -> None:
        if shards < 1:
            raise ValueError(f"ShardCount needs shards >= 1, got {shards}")
        self.params, self.shards = params, shards
        self.estimate = 0  # the last epoch's swarm estimate (0: none yet)

    def next_epoch(self, heard: int, connected: int, joined: int) -> int:
        p = self.params
        self.estimate = estimate_swarm(heard, connected, self.shards, joined, p)
        low = threshold(self.shards, p) * (1 - p.shard_hysteresis) if self.shards > 1 else 0.0
        high = threshold(self.shards + 1, p) * (1 + p.shard_hysteresis)
        if low <= self.estimate < high:
            return self.shards
        target = shard_count(self.estimate, p)
        step = p.max_shard_step
        self.shards = max(min(target, self.shards * step), math.ceil(self.shards / step), 1)
        return self.shards
