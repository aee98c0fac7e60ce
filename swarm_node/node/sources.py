"""Rollout sources: what drives the node loop `for item in source: train_on(item)`.

Contract: a `RolloutSource` is an iterable of `Draft` (groups to train on) or `SkippedStep` (a step that produced
nothing, with its reason); it never ends by itself (the node stops at `run.steps`). Besides iterating:
- `direct_weights`: True when the node loads each new policy straight into its sampler (sequential generation);
  False when it leaves it in `LatestWeights` (the sampler is in use on another thread, or idle until an eval).
- `paused()`: a context in which nobody else uses the sampler (the node evaluates inside it).
- `trained(metrics)`: told after each step trained on one of its drafts, before the step is recorded (an
  ECHO-2 learner publishes its update here and adds the fields it wants in the metrics).
- `close()`: stop whatever runs in the background; the sampler is then the node's again. It returns within its
  timeout even when a background batch never ends (the node must still checkpoint and exit; it logs why).
- `overlapped`: True when drafts are made on another thread while the node trains (a step then costs the time
  since the previous step ended, not since its draft started).
Sources here: `SequentialSource` (sample, then train, in turn), `OverlappedSource` (a generator thread bounded by
S, train/overlap.py; it starts on the first draft asked for), and `SharingSource` (a SAPO peer around either: each
draft goes out when made, and takes its external groups from the peer's pool on the training thread, immediately
before the update: sharing/peer.py). The ECHO-2 learner's and worker's are in roles/. No node import.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any, Protocol

from swarm_node.sharing.peer import SapoPeer
from swarm_node.train.overlap import OverlappedGenerator
from swarm_node.train.staleness import drop_reason
from swarm_node.types import Draft, SkippedStep

Item = Draft | SkippedStep
log = logging.getLogger(__name__)


class RolloutSource(Protocol):
    direct_weights: bool
    overlapped: bool

    def __iter__(self) -> Iterator[Item]: ...

    def paused(self) -> AbstractContextManager[object]: ...

    def trained(self, metrics: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


class BaseSource:
    """Defaults for a source whose drafts need nothing after training and that holds no thread."""

    direct_weights = False
    overlapped = False

    def __iter__(self) -> Iterator[Item]:
        raise NotImplementedError

    def paused(self) -> AbstractContextManager[object]:
        return contextlib.nullcontext()

    def trained(self, metrics: dict[str, Any]) -> None:
        return None

    def close(self) -> None:
        return None


class SequentialSource(BaseSource):
    """Each step drafts on the calling thread; the sampler gets each new policy at once."""

    direct_weights = True

    def __init__(self, draft: Callable[[], Item]) -> None:
        self.draft = draft

    def __iter__(self) -> Iterator[Item]:
        while True:
            yield self.draft()


class OverlappedSource(BaseSource):
    """Drafts come from an `OverlappedGenerator` thread; a draft's permit returns when the loop asks for the next
    one (it has been trained on) or the source closes. A draft beyond the bound S at the current version (cannot
    happen with the generator's permits; the bound is enforced anyway) is counted as dropped, never yielded."""

    overlapped = True

    def __init__(self, generator: OverlappedGenerator[Item], max_staleness: int, version: Callable[[], int],
                 count: Callable[[str, str, int], None], sync: Callable[[], None] = lambda: None) -> None:
        self.generator = generator
        self.max_staleness = max_staleness
        self.version = version
        self.count = count
        self.sync = sync  # after stopping: the newest policy into the sampler

    @classmethod
    def deferred(cls, produce: Callable[[], Item], max_staleness: int, version: Callable[[], int],
                 count: Callable[[str, str, int], None], sync: Callable[[], None]) -> OverlappedSource:
        """A source whose generator thread starts when the first draft is asked for."""
        return cls(OverlappedGenerator(produce, max_staleness), max_staleness, version, count, sync)

    @classmethod
    def start(cls, produce: Callable[[], Item], max_staleness: int, version: Callable[[], int],
              count: Callable[[str, str, int], None], sync: Callable[[], None]) -> OverlappedSource:
        generator: OverlappedGenerator[Item] = OverlappedGenerator(produce, max_staleness)
        generator.start()
        return cls(generator, max_staleness, version, count, sync)

    def __iter__(self) -> Iterator[Item]:
        if not self.generator.started:
            self.generator.start()
        while True:
            item = self.generator.get()
            try:
                if isinstance(item, Draft):
                    reason = drop_reason(self.version(), item.version, self.max_staleness)
                    if reason is not None:
                        self.count("dropped", reason, len(item.groups))
                        continue
                yield item
            finally:
                self.generator.done()

    def paused(self) -> AbstractContextManager[object]:
        return self.generator.lock

    def close(self, timeout_s: float = 120.0) -> None:
        self.generator.stop(timeout_s)  # a batch still being generated finishes first
        if self.generator.running:  # stuck in a batch that never ends: it must not keep the node from exiting
            log.warning("the generator thread is still busy after %g s; stopping without it (the sampler keeps "
                        "its last policy)", timeout_s)
            return
        with self.generator.lock:
            self.sync()


class SharingSource:
    """A SAPO peer around another source (the node's own generation): drafts pass through `peer.mix_in` on the
    training thread, immediately before the update; everything else is the inner source's."""

    def __init__(self, inner: RolloutSource, peer: SapoPeer) -> None:
        self.inner = inner
        self.peer = peer

    @property
    def direct_weights(self) -> bool:
        return self.inner.direct_weights

    @property
    def overlapped(self) -> bool:
        return self.inner.overlapped

    def __iter__(self) -> Iterator[Item]:
        for item in self.inner:
            yield self.peer.mix_in(item)

    def paused(self) -> AbstractContextManager[object]:
        return self.inner.paused()

    def trained(self, metrics: dict[str, Any]) -> None:
        self.inner.trained(metrics)

    def close(self) -> None:
        self.inner.close()
