"""Run helper programs as OS processes that speak JSON lines: commands on stdin, events on stdout."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


class JsonProc:
    def __init__(self, proc: asyncio.subprocess.Process, name: str) -> None:
        self.proc, self.name = proc, name
        self.events: list[dict[str, Any]] = []
        self._new = asyncio.Event()
        self._rids = itertools.count(1)
        self._reader = asyncio.ensure_future(self._read())

    @classmethod
    async def start(cls, module: str, *args: str, name: str) -> JsonProc:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", module, *args, cwd=REPO, env=env, stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, start_new_session=True)  # own group: killpg reaches its host child
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

    async def expect(self, match: Callable[[dict[str, Any]], bool], timeout: float = 20.0) -> dict[str, Any]:
        """The first event (old or new) that matches; TimeoutError with the events seen if none arrives."""
        async def wait() -> dict[str, Any]:
            seen = 0
            while True:
                for event in self.events[seen:]:
                    if match(event):
                        return event
                seen = len(self.events)
                if self._reader.done():
                    raise RuntimeError(f"{self.name} exited ({self.proc.returncode}); events: {self.events[-5:]}")
                self._new.clear()
                await self._new.wait()
        try:
            return await asyncio.wait_for(wait(), timeout)
        except asyncio.TimeoutError:
            raise TimeoutError(f"{self.name}: no matching event in {timeout} s; last: {self.events[-5:]}") from None

    async def request(self, event: str, timeout: float = 20.0, **cmd: Any) -> dict[str, Any]:
        """Send a command carrying a fresh request id and wait for the `event` answering it."""
        rid = next(self._rids)
        self.send(rid=rid, **cmd)
        return await self.expect(lambda e: e.get("event") == event and e.get("rid") == rid, timeout)

    def kill_group(self) -> None:
        """SIGKILL the helper and everything it started (its network host child)."""
        if self.proc.returncode is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    async def close(self) -> None:
        self.kill_group()
        await self.proc.wait()
        await self._reader
