"""The SAPO peer: what a node that shares rollouts does around each of its steps (it never imports the node).

Contract: `SapoPeer(exchange, ingest, pool, settings, rng, signer, step)`:
- `publish(item)`, where a draft is made (the node's generation: the training thread, or the generator thread when
  generation overlaps): our groups go out through the exchange, tagged by `signer` (sharing/wire.GroupSigner) with
  the draft's version and batch number, signed as the exchange's peer id; their content keys are marked seen in the
  pool, so that a peer replaying our groups back to us is a duplicate, not an external group. Returns the item.
- `mix_in(item)`, on the training thread immediately before the update (`max_external_age` counts our steps from
  there): drains what peers sent, puts it through the one ingest path (sharing/ingest.py: peer guard, re-scoring)
  into the pool, expires old entries, takes `external_groups` (J) of them by the configured selection with the
  node's share stream `rng`, and returns the draft with them (`Draft.externals`) and this step's `ShareReport`.
  A `SkippedStep` passes through both untouched (nothing is drained: its groups wait for the next step).
- `step()` is the node's training step (a pooled group remembers the step it arrived at).
A node that does not share builds none of this: no pool, no peer guard, no share context.
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Callable

from swarm_node.config import ShareConfig
from swarm_node.sharing.exchange import Exchange
from swarm_node.sharing.ingest import Ingest
from swarm_node.sharing.pool import ExperiencePool
from swarm_node.sharing.rescore import External
from swarm_node.sharing.wire import GroupSigner, content_key
from swarm_node.types import Draft, PoolEntry, ShareReport, SkippedStep

Item = Draft | SkippedStep


class SapoPeer:
    def __init__(self, exchange: Exchange, ingest: Ingest, pool: ExperiencePool, settings: ShareConfig,
                 rng: random.Random, signer: GroupSigner, step: Callable[[], int],
                 clock: Callable[[], float] = time.time) -> None:
        self.exchange = exchange
        self.ingest = ingest
        self.pool = pool
        self.settings = settings
        self.rng = rng
        self.signer = signer
        self.step = step
        self.clock = clock

    @property
    def peer_drops(self) -> dict[tuple[str, str], int]:
        """Dropped external groups per (sender, reason), forged rewards included."""
        return dict(self.ingest.peer_drops)

    def publish(self, item: Item) -> Item:
        if isinstance(item, SkippedStep):
            return item
        me = self.exchange.peer_id
        self.exchange.publish(self.signer.wire(item.groups, me, item.version, me, item.draw))
        self.pool.mark_seen(content_key(g.inst.ref, [c.token_ids for c in g.completions]) for g in item.groups)
        return item

    def mix_in(self, item: Item) -> Item:
        if isinstance(item, SkippedStep):
            return item
        received = self.exchange.drain()
        step = self.step()

        def pool_sink(ext: External, sender: str) -> list[tuple[str, str]]:
            return self.pool.add(PoolEntry(ext.group, sender, ext.key, step, ext.retokenized))

        dropped = self.ingest(received, self.clock(), pool_sink)
        for sender, reason in self.pool.expire(step):
            self.ingest.drop(sender, reason, dropped)
        stats = self.ingest.stats
        stats.update(pool_size=len(self.pool))
        s = self.settings
        externals = self.pool.take(s.external_groups, s.selection, self.rng, s.per_peer_batch_cap)
        stats.update(pool_size=len(self.pool))
        return dataclasses.replace(item, externals=tuple(externals),
                                   share=ShareReport(len(received), dropped, len(self.pool)))
