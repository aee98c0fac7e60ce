"""Overlap generation with training under a version-lag bound S (a peer and its own sampler, ECHO-2 style).

Contract:
- `LatestWeights` is a one-slot mailbox: the trainer `put`s a copy of each new policy (state dict, version); the
  generator takes the newest one before each batch and skips the versions it never got to.
- `OverlappedGenerator(produce, max_staleness)` runs `produce()` in one background thread. At most S + 1 batches
  are outstanding (being generated, queued, or being trained on): the generator starts a batch only when a permit
  is free, and the consumer returns the permit with `done()` once that batch is trained on or dropped. A batch
  generated on version v is therefore trained on at version <= v + S: generation of step t+1 overlaps training
  of step t for S >= 1, and S = 0 would be the sequential loop (the node does not use this class then).
- `get()` returns the next batch, re-raising in the consumer any exception the generator hit.
- `lock` is held while the generator uses the sampler; anyone else using the sampler (evaluation) takes it too.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

import torch

T = TypeVar("T")


class LatestWeights:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._state: dict[str, torch.Tensor] | None = None
        self._version = -1

    def put(self, state: dict[str, torch.Tensor], version: int) -> None:
        copy = {k: v.detach().clone() for k, v in state.items()}  # training mutates the live tensors in place
        with self._lock:
            self._state, self._version = copy, version

    def newer_than(self, version: int) -> tuple[dict[str, torch.Tensor], int] | None:
        with self._lock:
            if self._state is None or self._version <= version:
                return None
            return self._state, self._version


class _Failed:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class OverlappedGenerator(Generic[T]):
    def __init__(self, produce: Callable[[], T], max_staleness: int) -> None:
        if max_staleness < 1:
            raise ValueError("overlap needs max_staleness >= 1")
        self.produce = produce
        self.lock = threading.Lock()
        self._permits = threading.Semaphore(max_staleness + 1)
        self._ready: queue.Queue[T | _Failed] = queue.Queue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="overlapped-generator", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self._permits.acquire(timeout=0.1):
                continue
            if self._stop.is_set():
                return
            try:
                with self.lock:
                    item = self.produce()
            except BaseException as exc:  # handed to the consumer, which raises it in the node loop
                self._ready.put(_Failed(exc))
                return
            self._ready.put(item)

    def get(self) -> T:
        item = self._ready.get()
        if isinstance(item, _Failed):
            raise item.exc
        return item

    def done(self) -> None:
        self._permits.release()

    @property
    def started(self) -> bool:
        return self._thread.ident is not None

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def stop(self, timeout: float = 120.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
