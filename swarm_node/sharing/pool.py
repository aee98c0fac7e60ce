"""Experience pool: bounded store of re-scored external rollout groups.

Contract: pure logic, no I/O, no clock. Entries arrive already re-scored by `sharing`, with or without signal: a
group without signal is remembered (a later copy of it is still a copy) and refused ("zero_advantage"), unless the
pool was built with `keep_no_signal` (`[share] filter_no_signal = false`, an ablation): then it is pooled and taken
like any other entry.
- `add` refuses content it has seen, also of a group seen earlier and since evicted or used: "duplicate" when the
  content was ours (`mark_seen` records our published groups: a peer replaying them back to us must not make us
  train on them twice; `mark_seen` may run on another thread, each of its steps is one dict call) or the same
  sender's; "copied" when another peer sent it first; "copycat" instead when the sender copies others at a rate
  that marks a copycat (sharing/copying.py). Honest peers can coincide: only "copycat" is meant to cost reputation;
  a sender over `per_peer_cap` loses its own oldest entry ("peer_cap"), so a flooding peer only ever churns its
  own share of the pool; a full pool loses its oldest entry ("pool_full").
- `expire(step)` drops entries older than `max_age` of OUR training steps since they were received ("too_old"):
  other peers' versions and clocks are not comparable to ours.
- `take(count, ...)` removes and returns up to `count` entries chosen by a selection function from
  `selection.SELECTIONS`,
  with at most `per_peer_batch_cap` entries (0: no cap) from any one sender. A group is trained on at most once.
Every drop is returned as (sender, reason) so the node can count it per peer.
"""

from __future__ import annotations

import random
from collections import Counter, OrderedDict
from collections.abc import Iterable

from swarm_node.sharing.copying import CopyWatch
from swarm_node.sharing.selection import SELECTIONS
from swarm_node.types import PoolEntry

SEEN_KEYS = 65_536  # content hashes remembered for de-duplication beyond the pool's own entries
OURS = ""  # the first sender of our own published content


class ExperiencePool:
    def __init__(self, capacity: int, per_peer_cap: int, max_age: int, keep_no_signal: bool = False) -> None:
        if capacity < 1 or per_peer_cap < 1 or max_age < 0:
            raise ValueError("pool capacity and per-peer cap must be >= 1, max_age >= 0")
        self.capacity = capacity
        self.per_peer_cap = per_peer_cap
        self.max_age = max_age
        self.keep_no_signal = keep_no_signal
        self._entries: OrderedDict[bytes, PoolEntry] = OrderedDict()  # arrival order, oldest first
        self._seen: OrderedDict[bytes, str] = OrderedDict()  # content key -> its first sender ("": ours)
        self.copies = CopyWatch()

    def __len__(self) -> int:
        return len(self._entries)

    def entries(self) -> list[PoolEntry]:
        return list(self._entries.values())

    def per_peer(self) -> Counter[str]:
        return Counter(e.sender for e in self._entries.values())

    def add(self, entry: PoolEntry) -> list[tuple[str, str]]:
        """Insert one entry; returns the drops it caused, as (sender, reason), the entry itself included."""
        first = self._seen.get(entry.key)
        if first is not None and first in (OURS, entry.sender):
            return [(entry.sender, "duplicate")]
        if self.copies.observe(entry.sender, copied=first is not None):
            return [(entry.sender, "copycat")]
        if first is not None:
            return [(entry.sender, "copied")]
        self._remember(entry.key, entry.sender)
        if not entry.group.has_signal and not self.keep_no_signal:
            return [(entry.sender, "zero_advantage")]
        drops: list[tuple[str, str]] = []
        own = [k for k, e in self._entries.items() if e.sender == entry.sender]
        if len(own) >= self.per_peer_cap:
            del self._entries[own[0]]
            drops.append((entry.sender, "peer_cap"))
        if len(self._entries) >= self.capacity:
            _, oldest = self._entries.popitem(last=False)
            drops.append((oldest.sender, "pool_full"))
        self._entries[entry.key] = entry
        return drops

    def mark_seen(self, keys: Iterable[bytes]) -> None:
        """Remember content keys as seen without pooling them (our own published groups)."""
        for key in keys:
            self._remember(key, OURS)

    def expire(self, step: int) -> list[tuple[str, str]]:
        """Drop entries received more than `max_age` of our steps before `step`."""
        old = [k for k, e in self._entries.items() if step - e.received_step > self.max_age]
        return [(self._entries.pop(k).sender, "too_old") for k in old]

    def take(self, count: int, selection: str, rng: random.Random, per_peer_batch_cap: int = 0) -> list[PoolEntry]:
        """Remove and return up to `count` entries picked by SELECTIONS[selection]."""
        if count <= 0 or not self._entries:
            return []
        entries = self.entries()
        picked = [entries[i] for i in SELECTIONS[selection](entries, count, rng, per_peer_batch_cap)]
        for e in picked:
            del self._entries[e.key]
        return picked

    def _remember(self, key: bytes, sender: str) -> None:
        self._seen[key] = sender
        while len(self._seen) > SEEN_KEYS:
            self._seen.popitem(last=False)
