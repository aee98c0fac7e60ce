"""Retry timing for the network layer: exponential backoff with jitter and a reset after a stable period.

Contract (pure; time and randomness are arguments):
- `Backoff.delay(attempt, u)` = min(max_s, initial_s * factor**attempt) * (1 - jitter * u) for attempt >= 0 and
  u in [0, 1): attempt 0 waits about initial_s, each further failure multiplies the wait, capped at max_s; jitter
  spreads peers that lost the same bootstrap so they do not redial in lockstep.
- `RestartTracker` counts consecutive failures of a supervised thing: `failed(now)` returns the attempt number
  to pass to `delay` (0 after a run that stayed up `stable_s` or longer, else one more than last time), so a
  host that crashes once a day restarts at once, while one in a crash loop backs off.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Backoff:
    initial_s: float = 0.5
    factor: float = 2.0
    max_s: float = 30.0
    jitter: float = 0.2

    def __post_init__(self) -> None:
        if self.initial_s <= 0 or self.factor < 1 or self.max_s < self.initial_s or not 0 <= self.jitter < 1:
            raise ValueError(f"invalid backoff {self}")

    def delay(self, attempt: int, u: float = 0.0) -> float:
        if attempt < 0 or not 0 <= u < 1:
            raise ValueError(f"attempt must be >= 0 and u in [0, 1), got {attempt}, {u}")
        # Cap the exponent before the power: factor**attempt overflows a float long before a real retry count.
        base = self.initial_s * self.factor ** min(attempt, 64)
        return min(self.max_s, base) * (1.0 - self.jitter * u)


@dataclass
class RestartTracker:
    stable_s: float = 60.0
    attempt: int = -1
    started_at: float | None = None

    def started(self, now: float) -> None:
        self.started_at = now

    def failed(self, now: float) -> int:
        if self.started_at is not None and now - self.started_at >= self.stable_s:
            self.attempt = 0
        else:
            self.attempt += 1
        self.started_at = None
        return self.attempt
