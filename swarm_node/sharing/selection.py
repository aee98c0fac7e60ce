"""Selection functions: which pooled external groups one update takes (SAPO's J), registered by name.

Contract: `fn(entries, count, rng, per_peer_cap) -> indices` into `entries`, in training order, at most `count`,
with at most `per_peer_cap` (0: no cap) from any one sender. Pure: no I/O, no clock.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable

from swarm_node import variants
from swarm_node.types import PoolEntry

# fn(entries, count, rng, per_peer_cap) -> indices into entries, in training order.
SelectFn = Callable[[list[PoolEntry], int, random.Random, int], list[int]]
SELECTIONS: variants.Registry[SelectFn] = variants.Registry("share.selection", variants.SELECTIONS)
register = SELECTIONS.register


def _take_in_order(entries: list[PoolEntry], order: list[int], count: int, per_peer_cap: int) -> list[int]:
    """The first `count` indices of `order`, skipping senders that already have `per_peer_cap` picks."""
    picked: list[int] = []
    per_peer: Counter[str] = Counter()
    for i in order:
        if len(picked) == count:
            break
        sender = entries[i].sender
        if per_peer_cap and per_peer[sender] >= per_peer_cap:
            continue
        per_peer[sender] += 1
        picked.append(i)
    return picked


@register("uniform")
def select_uniform(entries: list[PoolEntry], count: int, rng: random.Random, per_peer_cap: int) -> list[int]:
    """SAPO: a uniform random sample of the pool."""
    order = list(range(len(entries)))
    rng.shuffle(order)
    return _take_in_order(entries, order, count, per_peer_cap)


@register("freshest")
def select_freshest(entries: list[PoolEntry], count: int, rng: random.Random, per_peer_cap: int) -> list[int]:
    """Most recently received first (least stale relative to our policy); ties broken at random."""
    keys = [rng.random() for _ in entries]
    order = sorted(range(len(entries)), key=lambda i: (-entries[i].received_step, keys[i]))
    return _take_in_order(entries, order, count, per_peer_cap)


@register("variance")
def select_variance(entries: list[PoolEntry], count: int, rng: random.Random, per_peer_cap: int) -> list[int]:
    """Highest reward variance first (most learning signal per group, after our own re-scoring); ties random."""
    def variance(e: PoolEntry) -> float:
        r = e.group.rewards
        mean = sum(r) / len(r)
        return sum((x - mean) ** 2 for x in r) / len(r)
    keys = [rng.random() for _ in entries]
    order = sorted(range(len(entries)), key=lambda i: (-variance(entries[i]), keys[i]))
    return _take_in_order(entries, order, count, per_peer_cap)
