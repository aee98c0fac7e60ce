"""App-level bandwidth shaping: a node's uplink and downlink as reservation-based rate limiters.

Contract: `RateLimiter(rate, burst)`: `await acquire(n)` returns once n more bytes fit under `rate` bytes/s, allowing
bursts of `burst` bytes after idle time. Concurrent callers are served in call order (each reserves the next slot),
so streams sharing one limiter share its rate about evenly when they move data in equal pieces. `Shaper` pairs an
uplink and a downlink limiter (None: unlimited). Time comes from an injectable monotonic clock; asyncio only.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


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
