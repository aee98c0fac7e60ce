"""App-level bandwidth shaping (a node's uplink and downlink as reservation-based rate limiters), and request budgets.

Contract: `RateLimiter(rate, burst)`: `await acquire(n)` returns once n more bytes fit under `rate` bytes/s, allowing
bursts of `burst` bytes after idle time. Concurrent callers are served in call order (each reserves the next slot),
so streams sharing one limiter share its rate about evenly when they move data in equal pieces. `Shaper` pairs an
uplink and a downlink limiter (None: unlimited). Time comes from an injectable monotonic clock; asyncio only.
`RequestBudget(rate, burst, total_rate, total_burst, max_keys)` decides, without waiting, whether one more request
from a key (a peer, a signer) is served: a token bucket per key (at most `max_keys` of them, the least recently used
forgotten first) and, unless the total is None, one bucket for all keys together; `take(key)` answers "ok" (one
token taken from each), "peer" or "total" (refused, nothing taken); `peek(key)` answers the same without taking.
Pure: no event loop, no I/O. Used for DHT and relay requests, messages per forwarder and messages per signer.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Literal


class RateLimiter:
    def __init__(self, rate: float, burst: int = 64 << 10, clock: Callable[[], float] = time.monotonic) -> None:
        if not rate > 0 or burst < 1:
            raise ValueError(f"rate must be > 0 and burst >= 1, got {rate}, {burst}")
        self.rate = float(rate)
        self.burst = burst
        self._clock = clock
        self._next = clock()  # when the bytes reserved so far will have gone out at `rate`

    async def acquire(self, n: int) -> None:
        now = self._clock()
        # Idle time earns at most `burst` bytes of credit: start no earlier than burst/rate ago.
        self._next = max(self._next, now - self.burst / self.rate) + n / self.rate
        delay = self._next - now
        if delay > 0:
            await asyncio.sleep(delay)


class Shaper:
    """A node's link: every payload byte it sends passes `up`, every byte it receives passes `down`."""

    def __init__(self, up_bytes_s: float | None = None, down_bytes_s: float | None = None,
                 burst: int = 64 << 10) -> None:
        self._up = RateLimiter(up_bytes_s, burst) if up_bytes_s else None
        self._down = RateLimiter(down_bytes_s, burst) if down_bytes_s else None

    async def up(self, n: int) -> None:
        if self._up is not None:
            await self._up.acquire(n)

    async def down(self, n: int) -> None:
        if self._down is not None:
            await self._down.acquire(n)


Verdict = Literal["ok", "peer", "total"]


class RequestBudget:
    """Token buckets: `burst` requests at once per key, refilled at `rate` per second; and `total_burst` /
    `total_rate` for all keys together, so that many identities together are bounded too (None: no total, where
    another budget bounds the crowd). A rate of 0 never refills (tests count exact budgets that way)."""

    def __init__(self, rate: float, burst: float, total_rate: float | None = None, total_burst: float | None = None,
                 max_keys: int = 4096, clock: Callable[[], float] = time.monotonic) -> None:
        if total_rate is None and total_burst is None:
            total_rate, total_burst = 0.0, math.inf  # a bucket that never runs out
        if (total_rate is None or total_burst is None or not (math.isfinite(rate) and math.isfinite(burst))
                or rate < 0 or total_rate < 0 or burst < 1 or total_burst < 1 or max_keys < 1):
            raise ValueError(f"need finite rates >= 0, bursts >= 1 (the total's both given or both None) and "
                             f"max_keys >= 1, got {rate}, {burst}, {total_rate}, {total_burst}, {max_keys}")
        self.rate, self.burst = float(rate), float(burst)
        self.total_rate, self.total_burst = float(total_rate), float(total_burst)
        self.max_keys = max_keys
        self._clock = clock
        self._keys: OrderedDict[Hashable, tuple[float, float]] = OrderedDict()  # key -> (tokens, as of when)
        self._total = (self.total_burst, clock())

    @staticmethod
    def _refill(bucket: tuple[float, float], rate: float, burst: float, now: float) -> float:
        tokens, then = bucket
        return min(burst, tokens + max(0.0, now - then) * rate)

    def _peek(self, key: Hashable, now: float) -> tuple[float, float]:
        bucket = self._keys.get(key)
        mine = self.burst if bucket is None else self._refill(bucket, self.rate, self.burst, now)
        return mine, self._refill(self._total, self.total_rate, self.total_burst, now)

    def peek(self, key: Hashable) -> Verdict:
        """What `take(key)` would answer now; nothing is taken and no key is added."""
        mine, total = self._peek(key, self._clock())
        return "peer" if mine < 1 else "total" if total < 1 else "ok"

    def take(self, key: Hashable) -> Verdict:
        now = self._clock()
        mine, total = self._peek(key, now)
        if mine < 1:
            return "peer"
        if total < 1:  # nothing taken from the key either: a peer refused for the crowd keeps its own budget
            return "total"
        if key not in self._keys and len(self._keys) >= self.max_keys:
            # Bounded: forget the least recently used key. A peer forgotten comes back with a full bucket; what
            # cycling through more identities than max_keys could gain is bounded by the total bucket.
            self._keys.popitem(last=False)
        self._keys[key] = (mine - 1, now)
        self._keys.move_to_end(key)
        self._total = (total - 1, now)
        return "ok"

    def __len__(self) -> int:
        return len(self._keys)
