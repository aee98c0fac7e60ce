"""bench/procs.py drives bench/child.py's command loop: answers carry the rid, `take` reads each event once."""

from __future__ import annotations

import asyncio
import os
import sys

import pytest

from bench.procs import REPO, JsonProc, event_is

COUNTER = """
import asyncio
from bench.child import emit, serve

async def main():
    count = 0

    async def tick(cmd):
        nonlocal count
        count += cmd.get("by", 1)
        return {"event": "tick", "count": count}

    emit(event="ready")
    await serve({"tick": tick})
    emit(event="bye")

asyncio.run(main())
"""


async def start_counter() -> JsonProc:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", COUNTER, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, start_new_session=True)
    return JsonProc(proc, "counter")


async def test_answers_carry_the_rid_of_their_command_and_take_reads_each_event_once() -> None:
    counter = await start_counter()
    try:
        assert await counter.expect(event_is("ready"), 60) == {"event": "ready"}
        assert await counter.request("tick", cmd="tick", by=2) == {"event": "tick", "count": 2, "rid": 1}
        counter.send(cmd="tick")  # no rid: the answer has none
        counter.send(cmd="tick")
        assert await counter.take(event_is("tick")) == {"event": "tick", "count": 2, "rid": 1}
        assert await counter.take(event_is("tick")) == {"event": "tick", "count": 3}
        assert await counter.take(event_is("tick")) == {"event": "tick", "count": 4}
        assert await counter.expect(event_is("tick")) == {"event": "tick", "count": 2, "rid": 1}  # old or new
        assert await counter.expect(event_is("tick", count=4)) == {"event": "tick", "count": 4}
    finally:
        await counter.close()


async def test_quit_ends_the_loop_and_close_waits_for_a_clean_exit() -> None:
    counter = await start_counter()
    await counter.expect(event_is("ready"), 60)
    await counter.close(quit_grace_s=30)
    assert counter.proc.returncode == 0
    assert counter.events == [{"event": "ready"}, {"event": "bye"}]


async def test_an_unknown_command_stops_the_helper_and_the_driver_says_so() -> None:
    counter = await start_counter()
    try:
        await counter.expect(event_is("ready"), 60)
        counter.send(cmd="no_such_command")
        with pytest.raises(RuntimeError, match="counter exited"):
            await counter.expect(event_is("tick"), 60)
        assert await counter.proc.wait() != 0  # the KeyError
    finally:
        await counter.close()
