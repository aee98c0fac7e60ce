"""Pulls over one long-lived stream per peer (`sharing.pull_session`) on MemoryTransport: requests share one stream
and are answered in order, a peer without the protocol is pulled one stream per request, idle streams are dropped
by both sides, malformed requests and wrong answers fail as one-shot pulls do, and the gate's caps hold."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from protocol.codec import encode
from protocol.limits import Limits
from protocol.messages import (
    PULL_PROTOCOL,
    PULL_STREAM_PROTOCOL,
    PulledGroup,
    PullRefusal,
    PullRequest,
    PullResponse,
)
from swarm_node.sharing.fanin_ledger import OVER_PULL
from swarm_node.sharing.pull_session import ONE_SHOT_RETRY_S, PullSessions, serve_pull_sessions
from swarm_node.sharing.pull_stream import PullFailed, frame, serve_pulls
from swarm_node.sharing.stream_gate import StreamGate
from swarm_node.transport.base import Stream, StreamReset
from swarm_node.transport.memory import MemoryHub, MemoryTransport, memory_addr

LIMITS = Limits()


def _id(i: int) -> bytes:
    return bytes([i]) * 16


def _request(*ids: int) -> PullRequest:
    return PullRequest(1, tuple(_id(i) for i in ids), time.time())


def _serve_even(requester: str, request: PullRequest) -> PullResponse:
    """Serves even ids (their bytes: the id again), refuses odd ones."""
    return PullResponse(tuple(PulledGroup(g, g) for g in request.group_ids if g[0] % 2 == 0),
                        tuple(PullRefusal(g, "busy") for g in request.group_ids if g[0] % 2), time.time())


async def _pair() -> tuple[MemoryTransport, MemoryTransport, list[str]]:
    """(server, client, the protocols the client opened streams of, in order)."""
    hub = MemoryHub()
    server, client = MemoryTransport(hub, "server"), MemoryTransport(hub, "client")
    for node in (server, client):
        await node.start()
    await client.connect(memory_addr("server"))
    opened: list[str] = []
    open_stream = client.open_stream

    async def counted(peer: str, protocol: str) -> Stream:
        opened.append(protocol)
        return await open_stream(peer, protocol)

    client.open_stream = counted  # type: ignore[method-assign]
    return server, client, opened


def _served(response: PullResponse) -> tuple[list[int], list[int]]:
    return [g.group_id[0] for g in response.groups], [r.group_id[0] for r in response.refused]


def test_requests_to_one_peer_share_one_stream_and_each_gets_its_own_answer() -> None:
    async def main() -> tuple[list[Any], list[str], int]:
        server, client, opened = await _pair()
        gate = StreamGate(4, 2, OVER_PULL)
        await serve_pull_sessions(server, _serve_even, LIMITS, 2.0, lambda p, r: None, gate)
        sessions = PullSessions(client, LIMITS, 2.0)
        first = await sessions.request("server", _request(1, 2))
        together = await asyncio.gather(*(sessions.request("server", _request(i)) for i in (3, 4, 5, 6)))
        held = gate.in_flight
        await sessions.close()
        return [_served(r) for r in (first, *together)], opened, held

    answers, opened, held = asyncio.run(main())
    assert answers == [([2], [1]), ([], [3]), ([4], []), ([], [5]), ([6], [])]
    assert opened == [PULL_STREAM_PROTOCOL]
    assert held == 1


def test_a_peer_that_serves_only_one_shot_pulls_is_pulled_one_stream_per_request() -> None:
    """After a failed stream opening the peer is pulled one-shot, a stream tried again only ONE_SHOT_RETRY_S later."""
    async def main() -> tuple[list[Any], list[str]]:
        server, client, opened = await _pair()
        await serve_pulls(server, _serve_even, LIMITS, 2.0, lambda p, r: None, StreamGate(4, 2, OVER_PULL))
        sessions = PullSessions(client, LIMITS, 2.0)
        now = [100.0]
        sessions.clock = lambda: now[0]
        answers = [_served(await sessions.request("server", _request(i))) for i in (1, 2)]
        now[0] += ONE_SHOT_RETRY_S - 0.1
        answers.append(_served(await sessions.request("server", _request(3))))
        now[0] += 0.2
        answers.append(_served(await sessions.request("server", _request(4))))
        return answers, opened

    answers, opened = asyncio.run(main())
    assert answers == [([], [1]), ([2], []), ([], [3]), ([4], [])]
    assert opened == [PULL_STREAM_PROTOCOL, PULL_PROTOCOL, PULL_PROTOCOL, PULL_PROTOCOL,
                      PULL_STREAM_PROTOCOL, PULL_PROTOCOL]


def test_an_idle_stream_is_dropped_by_the_server_and_half_closed_by_the_client_freeing_its_slot() -> None:
    async def main() -> tuple[list[str], list[int], list[Any]]:
        server, client, opened = await _pair()
        gate = StreamGate(4, 2, OVER_PULL)
        await serve_pull_sessions(server, _serve_even, LIMITS, 0.2, lambda p, r: None, gate)
        held = []
        idle_client = PullSessions(client, LIMITS, 10.0)  # half-closes after 2.5 s: the server's deadline is first
        await idle_client.request("server", _request(2))
        held.append(gate.in_flight)
        await asyncio.sleep(0.3)
        held.append(gate.in_flight)
        sessions = PullSessions(client, LIMITS, 0.4)  # half-closes after 0.1 s, before the server's 0.2 s
        answers = [_served(await sessions.request("server", _request(2)))]
        answers.append(_served(await sessions.request("server", _request(4))))  # at once: the same stream
        held.append(gate.in_flight)
        await asyncio.sleep(0.15)
        held.append(gate.in_flight)
        answers.append(_served(await sessions.request("server", _request(6))))  # a fresh stream
        await sessions.close()
        await idle_client.close()
        return opened, held, answers

    opened, held, answers = asyncio.run(main())
    assert opened == [PULL_STREAM_PROTOCOL] * 3
    assert held == [1, 0, 1, 0]
    assert answers == [([2], []), ([4], []), ([6], [])]


async def _reset_seen(stream: Stream) -> bool:
    try:
        await stream.read()
    except StreamReset:
        return True
    return False


def test_a_malformed_request_is_reported_and_reset_and_the_gate_caps_streams_per_peer() -> None:
    async def main() -> tuple[list[tuple[str, str]], list[bool], int]:
        server, client, _ = await _pair()
        errors: list[tuple[str, str]] = []
        gate = StreamGate(4, 1, OVER_PULL)
        await serve_pull_sessions(server, _serve_even, LIMITS, 2.0, lambda p, r: errors.append((p, r)), gate)
        held = await client.open_stream("server", PULL_STREAM_PROTOCOL)  # the one stream the peer may hold
        await held.write(frame(encode(_request(2))))
        await held.read_exactly(4)
        second = await client.open_stream("server", PULL_STREAM_PROTOCOL)
        resets = [await _reset_seen(second)]
        await held.reset()
        await asyncio.sleep(0.05)  # the server sees the reset and frees the slot
        bad = await client.open_stream("server", PULL_STREAM_PROTOCOL)
        await bad.write(frame(encode(PullResponse((), (), time.time()))))  # not a request
        resets.append(await _reset_seen(bad))
        return errors, resets, gate.in_flight

    errors, resets, in_flight = asyncio.run(main())
    assert errors == [("client", OVER_PULL), ("client", "bad_schema")]
    assert resets == [True, True]
    assert in_flight == 0


def test_a_wrong_answer_or_none_fails_the_pulls_waiting_on_the_stream_and_the_next_opens_a_fresh_one() -> None:
    async def main() -> tuple[list[str], list[str]]:
        server, client, opened = await _pair()
        calls: list[int] = []

        async def mute(stream: Stream) -> None:  # reads requests, answers the third with another id, else nothing
            while True:
                await stream.read_exactly(4 + len(encode(_request(0))))
                calls.append(1)
                if len(calls) == 3:
                    await stream.write(frame(encode(_serve_even("client", _request(8)))))

        await server.serve_stream(PULL_STREAM_PROTOCOL, mute)
        sessions = PullSessions(client, LIMITS, 0.2)
        reasons = []
        for outcome in await asyncio.gather(*(sessions.request("server", _request(i)) for i in (1, 2)),
                                            return_exceptions=True):
            assert isinstance(outcome, PullFailed)
            reasons.append(outcome.reason)
        with pytest.raises(PullFailed) as wrong:
            await sessions.request("server", _request(4))
        reasons.append(wrong.value.reason)
        return reasons, opened

    reasons, opened = asyncio.run(main())
    assert reasons == ["timeout", "timeout", "bad_schema"]
    assert opened == [PULL_STREAM_PROTOCOL] * 2
