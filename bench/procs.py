"""Drive helper programs as OS processes that speak JSON lines: commands on their stdin, events on their stdout.

Contract:
- `JsonProc.start(module, *args, name=...)` runs `python -m module args` from the repository root (this checkout
  first on PYTHONPATH) in its own session, so that `kill_group` reaches the helper's own children too (a
  LibP2PTransport's network host). `JsonProc(proc, name)` wraps a process started otherwise (e.g. inside a
  network namespace) that has stdin and stdout pipes.
- Every event line is kept in `events`, in arrival order; a line that is not JSON is skipped.
- `expect(match)`: the first matching event, old or new. `take(match)`: the first matching event after the one
  the previous `take` returned, like reading a queue (what it passes over is never taken). `request(event, ...)`:
  sends a command with a fresh "rid" and expects the `event` carrying it. All raise TimeoutError after `timeout`
  seconds and RuntimeError once the helper has closed its stdout.
- `close(quit_grace_s)`: optionally asks the helper to quit and waits up to that long, then kills its group.
- `wait_for(check, timeout)`: poll an async predicate once a second until it holds (True) or `timeout` passes.
The helper side of this protocol is bench/child.py.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

Match = Callable[[dict[str, Any]], bool]


def event_is(name: str, **fields: Any) -> Match:
    """A match for events named `name` whose `fields` have exactly these values."""
    return lambda e: e.get("event") == name and all(e.get(k) == v for k, v in fields.items())


# One event is one line: a stats event carries every group's latency (12,000+ in a capacity round of bench.gossip),
# far past asyncio's 64 KiB default.
EVENT_LINE_LIMIT = 64 << 20


class JsonProc:
    def __init__(self, proc: asyncio.subprocess.Process, name: str) -> None:
        self.proc, self.name = proc, name
        self.events: list[dict[str, Any]] = []
        self._new = asyncio.Event()
        self._rids = itertools.count(1)
        self._taken = 0  # `take` looks at events from this index on
        self._reader = asyncio.ensure_future(self._read())

    @classmethod
    async def start(cls, module: str, *args: str, name: str) -> JsonProc:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", module, *args, cwd=REPO, env=env, stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, start_new_session=True,  # own group: killpg reaches its host child
            limit=EVENT_LINE_LIMIT)
        return cls(proc, name)

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        while line := await self.proc.stdout.readline():
            try:
                self.events.append(json.loads(line))
            except json.JSONDecodeError:
                continue
            self._new.set()
        self._new.set()

    def send(self, **cmd: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(cmd) + "\n").encode())

    async def _index_of(self, match: Match, start: int, timeout: float) -> int:
        """The index of the first event from `start` on that matches, waiting for new ones."""
        async def wait() -> int:
            seen = start
            while True:
                for index in range(seen, len(self.events)):
                    if match(self.events[index]):
                        return index
                seen = max(seen, len(self.events))
                if self._reader.done():
                    raise RuntimeError(f"{self.name} exited ({self.proc.returncode}); events: {self.events[-5:]}")
                self._new.clear()
                await self._new.wait()
        try:
            return await asyncio.wait_for(wait(), timeout)
        except asyncio.TimeoutError:
            raise TimeoutError(f"{self.name}: no matching event in {timeout} s; last: {self.events[-5:]}") from None

    async def expect(self, match: Match, timeout: float = 20.0) -> dict[str, Any]:
        """The first event (old or new) that matches; TimeoutError with the events seen if none arrives."""
        return self.events[await self._index_of(match, 0, timeout)]

    async def take(self, match: Match, timeout: float = 20.0) -> dict[str, Any]:
        """The first matching event after the last one taken: for an event the helper sends again and again."""
        index = await self._index_of(match, self._taken, timeout)
        self._taken = index + 1
        return self.events[index]

    async def request(self, event: str, timeout: float = 20.0, **cmd: Any) -> dict[str, Any]:
        """Send a command carrying a fresh request id and wait for the `event` answering it."""
        rid = next(self._rids)
        self.send(rid=rid, **cmd)
        return await self.expect(lambda e: e.get("event") == event and e.get("rid") == rid, timeout)

    def kill_group(self) -> None:
        """SIGKILL the helper and everything it started (its network host child)."""
        if self.proc.returncode is None:
            self._kill_whole_group()

    def _kill_whole_group(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    async def close(self, quit_grace_s: float = 0.0) -> None:
        """With `quit_grace_s`, send "quit" and give the helper that long to stop cleanly; then kill its group."""
        if quit_grace_s > 0 and self.proc.returncode is None:
            self.send(cmd="quit")
            try:
                await asyncio.wait_for(self.proc.wait(), quit_grace_s)
            except asyncio.TimeoutError:
                pass
            else:  # a child it left behind would hold our end of its stdout open
                self._kill_whole_group()
        self.kill_group()
        await self.proc.wait()
        await self._reader


async def wait_for(check: Callable[[], Awaitable[bool]], timeout: float) -> bool:
    """Poll the async predicate `check` once a second until true (True) or `timeout` passes (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await check():
            return True
        await asyncio.sleep(1.0)
    return False
