"""Bounded fan-in over real libp2p hosts in a line, a - b - c: a hears c's digests only through b, and pulls from c.

py-libp2p keeps no address of a message's origin: the signed peer record in a gossip RPC is the forwarder's (b's),
so a cannot open a stream to c by itself ("No known addresses"). c's digest batch carries c's addresses, and a
dials c before it pulls (`sharing.sender_reach`), within its first round.
"""

from __future__ import annotations

import time

import pytest

from protocol.messages import PULL_PROTOCOL
from swarm_node.sharing.exchange import accept_policy_for
from swarm_node.sharing.fanin_exchange import FaninExchange
from swarm_node.transport.base import TransportError
from tests.integration.test_fanin_libp2p import LIMITS, PARAMS, SHARD, SOURCE, _group, transports, until

pytestmark = [pytest.mark.libp2p, pytest.mark.timeout(120)]


async def test_a_pulls_from_a_sender_it_hears_only_through_the_mesh() -> None:
    async with transports(3) as (ta, tb, tc):
        ex = {name: FaninExchange(t, LIMITS, accept_policy_for(SOURCE), PARAMS, f"seed-{name}".encode(), 3)
              for name, t in zip("abc", (ta, tb, tc), strict=True)}
        for name in "abc":
            await ex[name].start()
        await ta.connect(tb.listen_addrs()[0])
        await tb.connect(tc.listen_addrs()[0])

        async def line_subscribed() -> bool:
            seen = {t.peer_id: {p.peer_id for p in await t.peers() if SHARD in p.topics} for t in (ta, tb, tc)}
            return seen == {ta.peer_id: {tb.peer_id}, tb.peer_id: {ta.peer_id, tc.peer_id}, tc.peer_id: {tb.peer_id}}

        await until(line_subscribed, "the line a - b - c on the shard topic")
        # Without an address a cannot reach c: the library has none for it.
        with pytest.raises(TransportError, match="No known addresses"):
            await ta.open_stream(tc.peer_id, PULL_PROTOCOL)

        ex["c"].publish([_group(tc.peer_id, 2, 0, time.time(), signal=True)])
        assert await ex["c"].flush() == 1
        assert ex["c"].reach.own_addrs() == (tc.listen_addrs()[0].split("/p2p/")[0],)

        async def a_heard_c() -> bool:
            return ex["a"].shard_neighbours == [tc.peer_id]

        await until(a_heard_c, "a to hear c's digest batch through b")
        assert ex["a"].round == 0  # a's first round: its first flush has not come yet
        assert await ex["a"].pull() == 1
        got = ex["a"].drain()
        assert [(r.sender, r.group.group_id if r.group else None) for r in got] == [(tc.peer_id, bytes([2, 0]) * 8)]
        assert (ex["a"].reach.dials, ex["a"].reach.dials_failed) == (1, 0)
        assert tc.peer_id in {p.peer_id for p in await ta.peers()}
        assert (ex["a"].round_stats.pulls_sent, ex["c"].round_stats.pulls_served) == (1, 1)
