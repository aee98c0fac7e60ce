"""The helper side of the JSON-lines protocol that bench/procs.py drives: events out on stdout, commands in on stdin.

Contract:
- `emit(**event)` writes one event as a JSON line and flushes it.
- `commands()` yields the JSON commands written to our stdin, one per line, until stdin closes.
- `serve(handlers)` answers commands until "quit" or the end of stdin: the handler registered under a command's
  "cmd" returns the answer event's fields ("event" included), emitted with the command's "rid" when it has one.
  An unregistered command is a KeyError: the helper stops, and the driver sees it exit.
- `mesh_commands(transport, topic)`: the handlers every bench node answers to form a mesh, "connect" {addrs} ->
  "connected" and "wait_subscribed" {n} -> "subscribed" once n peers are on `topic`.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from swarm_node.transport.base import Transport

QUIT = "quit"

Handler = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


def emit(**event: Any) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


async def commands() -> AsyncIterator[dict[str, Any]]:
    """The JSON commands the driver writes to our stdin, one per line, until it closes it."""
    reader = asyncio.StreamReader()
    await asyncio.get_running_loop().connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := await reader.readline():
        yield json.loads(line)


async def serve(handlers: Mapping[str, Handler]) -> None:
    async for cmd in commands():
        if cmd["cmd"] == QUIT:
            return
        answer = await handlers[cmd["cmd"]](cmd)
        emit(**answer, **({"rid": cmd["rid"]} if "rid" in cmd else {}))


def mesh_commands(transport: Transport, topic: str) -> dict[str, Handler]:
    async def connect(cmd: dict[str, Any]) -> dict[str, Any]:
        for addr in cmd["addrs"]:
            await transport.connect(addr)
        return {"event": "connected"}

    async def wait_subscribed(cmd: dict[str, Any]) -> dict[str, Any]:
        while sum(topic in p.topics for p in await transport.peers()) < cmd["n"]:
            await asyncio.sleep(0.1)
        return {"event": "subscribed"}

    return {"connect": connect, "wait_subscribed": wait_subscribed}
