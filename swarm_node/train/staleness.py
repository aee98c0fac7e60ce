"""Version lag within one policy lineage, and the buffer that keeps rollouts older than the bound out of the loss.

Contract (pure, no I/O, no torch):
- A lineage is a learner and the workers that follow it, or a peer and its own sampler: every rollout carries the
  version of the lineage's policy that generated it, and `lag = current_version - rollout_version`.
- `--max-staleness S`: a rollout with lag > S never reaches the loss (dropped, counted as "stale"); a rollout that
  claims a version newer than the current one cannot be from this lineage and is dropped as "future_version".
  Within S, lag > 0 marks the rollout off-policy: the trainer weighs it by a truncated importance ratio.
- A completion resumed under newer policies (APRIL) has one version per token span: the bound reads its oldest
  span (`span_drop_reason`), and the correction applies to the stale spans' tokens alone (train/scoring.py).
- `RolloutBuffer` holds (item, version) pairs first in, first out, bounded: when full, the oldest entry goes first
  (counted as "overflow"), since it is the one closest to the bound.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


def lag(current_version: int, rollout_version: int) -> int:
    return current_version - rollout_version


def drop_reason(current_version: int, rollout_version: int, max_staleness: int) -> str | None:
    """Why a rollout of `rollout_version` may not be trained on at `current_version`, or None if it may."""
    d = lag(current_version, rollout_version)
    if d < 0:
        return "future_version"
    if d > max_staleness:
        return "stale"
    return None


def span_drop_reason(current_version: int, span_versions: Iterable[int], max_staleness: int) -> str | None:
    """`drop_reason` per token span of a completion resumed under several policies (APRIL): stale when its oldest
    span is, a future version when any span claims one."""
    versions = list(span_versions)
    if any(v > current_version for v in versions):
        return "future_version"
    return drop_reason(current_version, min(versions, default=current_version), max_staleness)


@dataclass(frozen=True)
class Versioned(Generic[T]):
    item: T
    version: int


class RolloutBuffer(Generic[T]):
    def __init__(self, max_staleness: int, capacity: int = 1024) -> None:
        if max_staleness < 0:
            raise ValueError("max_staleness must be >= 0")
        self.max_staleness = max_staleness
        self.capacity = capacity
        self._items: deque[Versioned[T]] = deque()
        self.dropped: Counter[str] = Counter()

    def __len__(self) -> int:
        return len(self._items)

    def add(self, item: T, version: int) -> None:
        if len(self._items) >= self.capacity:
            self._items.popleft()
            self.dropped["overflow"] += 1
        self._items.append(Versioned(item, version))

    def expire(self, current_version: int) -> int:
        """Drop every entry that can no longer be trained on at `current_version`; returns how many."""
        kept: deque[Versioned[T]] = deque()
        dropped = 0
        for entry in self._items:
            reason = drop_reason(current_version, entry.version, self.max_staleness)
            if reason is None:
                kept.append(entry)
            else:
                self.dropped[reason] += 1
                dropped += 1
        self._items = kept
        return dropped

    def available(self, current_version: int) -> int:
        return sum(drop_reason(current_version, e.version, self.max_staleness) is None for e in self._items)

    def take(self, count: int, current_version: int) -> list[Versioned[T]]:
        """Up to `count` admissible entries, oldest first; inadmissible ones met on the way are dropped."""
        self.expire(current_version)
        taken = [self._items.popleft() for _ in range(min(count, len(self._items)))]
        return taken


def may_generate(batches_done: int, held_version: int, known_version: int, max_staleness: int) -> bool:
    """Whether a worker's next batch can still be trained on within the bound (flow control without messages).

    The learner trains on one batch per worker per step, so a worker's k-th batch (k = batches_done) is trained
    on at learner version >= k, and never before the newest version the worker has heard of: it is worth
    generating only if the version it holds is within S of that. S = 0: wait for each new version (synchronous);
    S >= 1: generate the next batch while the learner trains on the previous one.
    """
    return held_version >= max(batches_done, known_version) - max_staleness
