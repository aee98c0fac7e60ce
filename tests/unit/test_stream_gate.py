"""The pull and push protocols' serving caps: streams past the gate's caps are reset unread and reported (per peer:
the gate's reason, scored; in all: busy, not scored), a stalled stream is reset at its deadline, and a stream
that completes frees its slot."""

from __future__ import annotations

import asyncio
import time

import pytest

from protocol.limits import Limits
from protocol.messages import PULL_PROTOCOL, PullRefusal, PullRequest, PullResponse
from swarm_node.sharing.fanin_ledger import BUSY, OVER_PULL
from swarm_node.sharing.pull_stream import request_pull, serve_pulls
from swarm_node.sharing.stream_gate import StreamGate
from swarm_node.transport.base import Stream, StreamReset
from swarm_node.transport.memory import MemoryHub, MemoryTransport, memory_addr

LIMITS = Limits()


def test_the_gate_admits_per_peer_then_in_all_and_frees_slots_on_leave() -> None:
    gate = StreamGate(total=3, per_peer=2, over_reason=OVER_PULL)
    assert [gate.enter(p) for p in ("a", "a", "a", "b", "c")] == ["", "", OVER_PULL, "", BUSY]
    assert gate.in_flight == 3
    gate.leave("a")
    assert [gate.enter("c"), gate.in_flight] == ["", 3]
    gate.leave("a")
    gate.leave("b")
    gate.leave("c")
    assert (gate.in_flight, dict(gate.open)) == (0, {})
    with pytest.raises(ValueError):
        StreamGate(0, 1, OVER_PULL)


async def _pair(*names: str) -> tuple[MemoryHub, list[MemoryTransport]]:
    hub = MemoryHub()
    nodes = [MemoryTransport(hub, n) for n in names]
    for node in nodes:
        await node.start()
    for node in nodes[1:]:
        await node.connect(memory_addr(names[0]))
    return hub, nodes


async def _reset_seen(stream: Stream) -> bool:
    """True once the server resets the stream; False if it ends it cleanly or sends bytes."""
    try:
        await stream.read()
    except StreamReset:
        return True
    return False


def test_streams_past_the_caps_are_reset_unread_and_a_stalled_one_at_its_deadline() -> None:
    async def main() -> tuple[list[tuple[str, str]], list[bool], int, list[bytes]]:
        _, (server, greedy, other) = await _pair("server", "greedy", "other")
        errors: list[tuple[str, str]] = []
        answered: list[bytes] = []

        def answer(requester: str, request: PullRequest) -> PullResponse:
            answered.append(request.group_ids[0])
            return PullResponse((), (PullRefusal(request.group_ids[0], "unoffered_pull"),), time.time())

        gate = StreamGate(total=3, per_peer=2, over_reason=OVER_PULL)
        await serve_pulls(server, answer, LIMITS, 0.2, lambda p, r: errors.append((p, r)), gate)
        # greedy opens 3 streams and writes nothing: 2 are held (until their deadline), the 3rd is reset at once.
        stalled = [await greedy.open_stream("server", PULL_PROTOCOL) for _ in range(3)]
        await asyncio.sleep(0)
        # other's first stream takes the last slot; its second finds the gate full (busy).
        held = await other.open_stream("server", PULL_PROTOCOL)
        refused = await other.open_stream("server", PULL_PROTOCOL)
        await asyncio.sleep(0)
        resets = [await _reset_seen(s) for s in (stalled[2], refused)]
        in_flight = gate.in_flight
        await held.reset()
        resets += [await _reset_seen(s) for s in stalled[:2]]  # the deadline resets the stalled ones
        # Once they are gone a well-formed pull is answered.
        response = await request_pull(other, "server", PullRequest(1, (b"\x01" * 16,), time.time()), LIMITS, 2.0)
        return errors, resets, in_flight, answered + [r.group_id for r in response.refused]

    errors, resets, in_flight, answered = asyncio.run(main())
    assert errors == [("greedy", OVER_PULL), ("other", BUSY)]
    assert resets == [True, True, True, True]
    assert in_flight == 3
    assert answered == [b"\x01" * 16, b"\x01" * 16]
