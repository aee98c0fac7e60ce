"""When to send queued rollout groups as one RolloutBatch: a sans-I/O batcher on a clock the caller passes in.

Contract:
- `BatchPolicy(max_groups, max_delay_s)`: a batch holds at most `max_groups` groups, and no group waits longer than
  `max_delay_s` after it was queued. `checked(limits)` refuses (ValueError naming both numbers) a policy whose
  batches the receivers' `Limits` would reject (`too_many_groups`).
- `flush_due(policy, pending, oldest_queued_at, now)`: the decision alone, a pure function.
- `GroupBatcher(policy)`: `add(group, now)` queues one group and returns the batches due now (full ones, or the
  rest once the oldest waited `max_delay_s`); `take_due(now)` the same without adding; `take_all()` everything
  queued (a caller that has nothing more to add, e.g. the end of a sampling step); `deadline()` the time at which
  the queued rest falls due (None when empty), for the caller's timer. Batches keep the order groups were added.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

from protocol.limits import Limits

Item = TypeVar("Item")

MAX_GROUPS_PER_BATCH = 16
MAX_BATCH_DELAY_S = 0.05


@dataclass(frozen=True)
class BatchPolicy:
    max_groups: int = MAX_GROUPS_PER_BATCH
    max_delay_s: float = MAX_BATCH_DELAY_S

    def __post_init__(self) -> None:
        if type(self.max_groups) is not int or self.max_groups < 1:
            raise ValueError(f"BatchPolicy.max_groups must be a positive int, got {self.max_groups!r}")
        if not 0.0 <= self.max_delay_s < float("inf"):
            raise ValueError(f"BatchPolicy.max_delay_s must be finite and >= 0, got {self.max_delay_s!r}")

    def checked(self, limits: Limits) -> BatchPolicy:
        """This policy, if receivers with `limits` accept its fullest batch; ValueError otherwise."""
        if self.max_groups > limits.max_groups_per_message:
            raise ValueError(f"a batch of {self.max_groups} groups is over the receivers' limit of "
                             f"{limits.max_groups_per_message} groups per message (too_many_groups)")
        return self


def flush_due(policy: BatchPolicy, pending: int, oldest_queued_at: float, now: float) -> bool:
    """True when `pending` queued groups should go now: a full batch, or the oldest has waited `max_delay_s`."""
    if pending <= 0:
        return False
    # Compared as a deadline (not as a waited time) so that `GroupBatcher.deadline()` is exactly when it falls due.
    return pending >= policy.max_groups or now >= oldest_queued_at + policy.max_delay_s


class GroupBatcher(Generic[Item]):
    def __init__(self, policy: BatchPolicy) -> None:
        self.policy = policy
        self._pending: list[Item] = []
        self._queued_at: list[float] = []  # when each of `_pending` was queued

    def __len__(self) -> int:
        return len(self._pending)

    def add(self, item: Item, now: float) -> list[tuple[Item, ...]]:
        self._pending.append(item)
        self._queued_at.append(now)
        return self.take_due(now)

    def take_due(self, now: float) -> list[tuple[Item, ...]]:
        out: list[tuple[Item, ...]] = []
        while self._pending and flush_due(self.policy, len(self._pending), self._queued_at[0], now):
            out.append(self._pop(min(len(self._pending), self.policy.max_groups)))
        return out

    def take_all(self) -> list[tuple[Item, ...]]:
        out: list[tuple[Item, ...]] = []
        while self._pending:
            out.append(self._pop(min(len(self._pending), self.policy.max_groups)))
        return out

    def deadline(self) -> float | None:
        return self._queued_at[0] + self.policy.max_delay_s if self._pending else None

    def _pop(self, size: int) -> tuple[Item, ...]:
        batch = tuple(self._pending[:size])
        del self._pending[:size], self._queued_at[:size]
        return batch
