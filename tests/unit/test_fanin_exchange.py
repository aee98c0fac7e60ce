"""FaninExchange over MemoryTransport: 8 in-process nodes in 2 shards of 4 (seeds chosen so, asserted below);
each node gets its J groups, one per shard neighbour, hears only its shard, and scores lying servers and greedy
requesters."""

from __future__ import annotations

import asyncio
import dataclasses
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

from protocol.codec import decode, encode, encode_group, group_content_hash
from protocol.limits import Limits
from protocol.messages import (
    CompletionWire,
    DigestBatch,
    DigestWire,
    PullRequest,
    RolloutGroup,
    TaskRefWire,
    digest_topic,
)
from swarm_node import tasks
from swarm_node.model.tokenizer import build_char_tokenizer, tokenizer_hash
from swarm_node.sharing.exchange import Received, RoundStats, accept_policy_for
from swarm_node.sharing.fanin import FanInParams, epoch_shards
from swarm_node.sharing.fanin_exchange import FaninExchange, claimed_rewards, reward_stats, task_label
from swarm_node.sharing.pull_stream import request_pull
from swarm_node.transport.memory import MemoryHub, MemoryTransport, memory_addr

TOK = build_char_tokenizer()
SOURCE = tasks.TaskSource()
LIMITS = Limits(vocab_size=len(TOK))
PARAMS = FanInParams(shard_size=4, pull_target=3, max_pulls_per_sender=1)
# n0..n3 draw shard 1 and n4..n7 shard 0 in epoch 0 (2 shards for 8 nodes of shard size 4).
SEEDS = [b"seed0", b"seed1", b"seed5", b"seed8", b"seed2", b"seed3", b"seed4", b"seed6"]
NAMES = [f"n{i}" for i in range(8)]
SHARD_OF = {name: (1 if i < 4 else 0) for i, name in enumerate(NAMES)}


def _group(node: int, k: int, created_at: float) -> RolloutGroup:
    ids = (5, TOK.eos_token_id)
    completions = (CompletionWire(ids, "x", (-0.5, -0.5), 0.0), CompletionWire(ids, "y", (-0.5, -0.5), 1.0))
    return RolloutGroup(bytes([node, k]) * 8, NAMES[node], 0,
                        TaskRefWire(SOURCE.name, SOURCE.config, SOURCE.seed, 2 * node + k), completions,
                        tokenizer_hash(TOK), "qwen2", created_at)


@dataclass
class Outcome:
    received: dict[str, list[Received]]
    stats: dict[str, RoundStats]
    shards: dict[str, tuple[int, ...]]
    extra: object = None


Hook = Callable[[dict[str, FaninExchange]], object]


def _swarm(rescore_for: Callable[[str], Callable[[RolloutGroup], list[float]]] | None = None,
           after_flush: Hook | None = None, after_pull: Callable[[dict[str, FaninExchange]], object] | None = None,
           params: FanInParams = PARAMS) -> Outcome:
    async def main() -> Outcome:
        hub = MemoryHub()
        transports = {name: MemoryTransport(hub, name) for name in NAMES}
        exchanges = {name: FaninExchange(transports[name], LIMITS, accept_policy_for(SOURCE), params, SEEDS[i], 8,
                                         rescore=rescore_for(name) if rescore_for else claimed_rewards)
                     for i, name in enumerate(NAMES)}
        for name in NAMES:
            await transports[name].start()
            await exchanges[name].start()
        for i, a in enumerate(NAMES):  # a full mesh: gossip reaches a shard's members directly
            for b in NAMES[i + 1:]:
                await transports[a].connect(memory_addr(b))
        now = time.time()
        for i, name in enumerate(NAMES):
            exchanges[name].publish([_group(i, 0, now), _group(i, 1, now)])
        for name in NAMES:
            assert await exchanges[name].flush() == 1
        await hub.settle()
        if after_flush:
            done = after_flush(exchanges)
            if asyncio.iscoroutine(done):
                await done
        await asyncio.gather(*(exchanges[name].pull() for name in NAMES))
        await hub.settle()
        extra = await after_pull(exchanges) if after_pull else None  # type: ignore[misc]
        out = Outcome({n: exchanges[n].drain() for n in NAMES}, {n: exchanges[n].round_stats for n in NAMES},
                      {n: exchanges[n].shards for n in NAMES}, extra)
        for t in transports.values():
            await t.stop()
        return out

    return asyncio.run(main())


async def _started(params: FanInParams, n_peers: int = 8, clock: Callable[[], float] = time.time
                   ) -> tuple[MemoryHub, dict[str, MemoryTransport], dict[str, FaninExchange]]:
    """The 8 nodes' transports and exchanges, started, not yet connected."""
    hub = MemoryHub()
    transports = {name: MemoryTransport(hub, name) for name in NAMES}
    exchanges = {name: FaninExchange(transports[name], LIMITS, accept_policy_for(SOURCE), params, SEEDS[i], n_peers,
                                     clock=clock) for i, name in enumerate(NAMES)}
    for name in NAMES:
        await transports[name].start()
        await exchanges[name].start()
    return hub, transports, exchanges


def _digest_batch_bytes(node: int) -> int:
    digests = [DigestWire(g.group_id, task_label(g), *reversed(reward_stats(claimed_rewards(g))),
                          group_content_hash(g)) for g in (_group(node, 0, 1.0), _group(node, 1, 1.0))]
    return len(encode(DigestBatch(SHARD_OF[NAMES[node]], 1, digests, 1.0)))


def _senders(got: list[Received]) -> list[str]:
    return sorted(r.sender for r in got if r.group is not None)


def _drops(got: list[Received]) -> list[tuple[str, str]]:
    return sorted((r.sender, r.reason) for r in got if r.group is None)


def _neighbours(name: str) -> list[str]:
    return sorted(n for n in NAMES if n != name and SHARD_OF[n] == SHARD_OF[name])


def test_reward_stats_give_the_signal_and_the_population_variance() -> None:
    assert reward_stats([0.0, 1.0]) == (True, 0.25)
    assert reward_stats([1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]) == (True, 0.234375)
    assert reward_stats([0.5, 0.5, 0.5]) == (False, 0.0)
    assert reward_stats([]) == (False, 0.0)
    assert abs(reward_stats([0.1, 0.7, 0.3])[1] - statistics.pvariance([0.1, 0.7, 0.3])) < 1e-15


def test_each_node_gets_its_j_groups_one_per_shard_neighbour_and_hears_only_its_shard() -> None:
    out = _swarm()
    assert out.shards == {name: (SHARD_OF[name],) for name in NAMES}
    for name in NAMES:
        got = out.received[name]
        assert _senders(got) == _neighbours(name), name  # J = 3 groups, at most 1 per sender
        assert _drops(got) == []
        # Every group is one its sender published, intact.
        for r in got:
            assert r.group is not None and r.group.policy_id == r.sender
        # 3 digest batches (its shard's other members; the other shard's 4 never reach it) + 3 pull responses.
        stats = out.stats[name]
        assert (stats.inbound_messages, stats.pulls_sent, stats.pulls_served) == (6, 3, 3), name


def test_an_unreachable_sender_frees_its_slot_for_another_at_once_and_ranks_as_heard_next_round() -> None:
    async def n1_leaves(exchanges: dict[str, FaninExchange]) -> None:
        await exchanges["n1"].transport.stop()  # its digests were heard: n0 picks it, and its pull fails

    async def next_round(exchanges: dict[str, FaninExchange]) -> tuple[set[str], int, set[str]]:
        n0 = exchanges["n0"]
        unreachable, pulls_sent = set(n0._unreachable), n0.round_stats.pulls_sent
        await n0.flush()
        return unreachable, pulls_sent, n0._recent[0]

    # 2 pulls per sender: n0 first takes one group of each of n1, n2, n3; n1's slot goes to n2's or n3's other
    params = dataclasses.replace(PARAMS, max_pulls_per_sender=2, serve_per_requester=2)
    out = _swarm(after_flush=n1_leaves, after_pull=next_round, params=params)
    got = out.received["n0"]
    assert len(got) == 3 and set(_senders(got)) == {"n2", "n3"} and _drops(got) == []
    unreachable, pulls_sent, recent = out.extra
    assert pulls_sent == 4  # 1 lost to n1, then 3 served
    assert unreachable == {"n1"} and "n1" in recent  # not tried first again next round


def test_a_server_whose_bytes_differ_from_its_digest_is_scored_and_nothing_of_it_is_taken() -> None:
    def swap_n1_content(exchanges: dict[str, FaninExchange]) -> None:
        liar = exchanges["n1"]  # serves other bytes than its digests announced (a group served is its encoding)
        lies = {gid: encode_group(_group(1, gid[1], g.created_at + 1.0)) for gid, g in liar.serving(liar.round).items()}
        liar.served.wire = lambda _round, gid: lies.get(gid)  # type: ignore[method-assign]

    out = _swarm(after_flush=swap_n1_content)
    for name in ("n0", "n2", "n3"):
        assert _senders(out.received[name]) == [n for n in _neighbours(name) if n != "n1"]
        assert _drops(out.received[name]) == [("n1", "hash_mismatch")]
    assert _senders(out.received["n4"]) == _neighbours("n4")  # the other shard is untouched


def test_a_digest_that_inflates_its_reward_statistics_is_scored() -> None:
    def rescore_for(_receiver: str) -> Callable[[RolloutGroup], list[float]]:
        # Our verifier finds n2's groups all wrong: no signal, although n2's digests claimed one.
        return lambda g: [0.0, 0.0] if g.policy_id == "n2" else claimed_rewards(g)

    out = _swarm(rescore_for=rescore_for)
    for name in ("n0", "n1", "n3"):
        assert _senders(out.received[name]) == [n for n in _neighbours(name) if n != "n2"]
        assert _drops(out.received[name]) == [("n2", "digest_reward_mismatch")]


def test_pulls_are_capped_per_requester_and_unoffered_pulls_are_scored() -> None:
    async def greedy_n4(exchanges: dict[str, FaninExchange]) -> object:
        n0 = exchanges["n0"]
        ours = sorted(n0.serving(n0.round))
        asked = PullRequest(n0.round, (ours[0], ours[1], b"\xee" * 16), time.time())
        response = await request_pull(exchanges["n4"].transport, "n0", asked, LIMITS, 2.0)
        return [g.group_id for g in response.groups], [(r.group_id, r.reason) for r in response.refused]

    out = _swarm(after_pull=greedy_n4)
    served, refused = out.extra  # type: ignore[misc]
    n0_groups = sorted([bytes([0, 0]) * 8, bytes([0, 1]) * 8])
    assert served == [n0_groups[0]]
    assert refused == [(n0_groups[1], "over_pull"), (b"\xee" * 16, "unoffered_pull")]
    assert _drops(out.received["n0"]) == [("n4", "over_pull"), ("n4", "unoffered_pull")]
    assert out.stats["n0"].pulls_served == 4


def test_recent_rounds_stay_served_and_an_expired_one_is_refused_unscored() -> None:
    async def pull_old_rounds(exchanges: dict[str, FaninExchange]) -> object:
        n0, n4 = exchanges["n0"], exchanges["n4"]
        first = sorted(n0.serving(1))
        n0.publish([_group(0, 2, time.time())])
        await n0.flush()  # round 2: round 1's groups stay served
        answers = []
        for round_index in (1, 2):
            asked = PullRequest(round_index, (first[0],), time.time())
            response = await request_pull(n4.transport, "n0", asked, LIMITS, 2.0)
            answers.append(([g.group_id for g in response.groups], [r.reason for r in response.refused]))
        await n0.flush()  # round 3, at once: round 1 is younger than serve_for_s, still held (a second group of
        # its batch is over n4's share of it: the cap counts per announcing round, not per current round)
        response = await request_pull(n4.transport, "n0", PullRequest(1, (first[1],), time.time()), LIMITS, 2.0)
        answers.append(([g.group_id for g in response.groups], [r.reason for r in response.refused]))
        n0.clock = lambda: time.time() + PARAMS.serve_for_s
        await n0.flush()  # round 4, serve_for_s later: round 3 (the previous) is kept, 1 and 2 are not
        for round_index in (1, 3, 5):
            response = await request_pull(n4.transport, "n0", PullRequest(round_index, (first[0],), time.time()),
                                          LIMITS, 2.0)
            answers.append(([g.group_id for g in response.groups], [r.reason for r in response.refused]))
        return answers, n0.served.held_rounds()

    out = _swarm(after_pull=pull_old_rounds)
    first = sorted([bytes([0, 0]) * 8, bytes([0, 1]) * 8])
    answers, held = out.extra  # type: ignore[misc]
    assert answers == [([first[0]], []), ([], ["unoffered_pull"]), ([], ["over_pull"]),
                       ([], ["not_held"]), ([], ["unoffered_pull"]), ([], ["unoffered_pull"])]
    assert held == [3, 4]
    # Scored: the second group of round 1's batch, the id round 2 never announced, the id round 3 never announced
    # and the round n0 has not reached.
    assert _drops(out.received["n0"]) == [("n4", "over_pull")] + [("n4", "unoffered_pull")] * 3


def test_many_groups_of_one_sender_round_are_pulled_in_requests_of_at_most_max_pulls_per_request() -> None:
    """With caps raised past the wire's ids per request (a bench taking every group offered), the 20 groups of one
    sender's round go out as 3 requests of 8, 8 and 4 ids (one request of 20 would be rejected whole)."""
    limits = dataclasses.replace(LIMITS, max_pulls_per_request=8)
    params = dataclasses.replace(PARAMS, pull_target=40, max_pulls_per_sender=40, serve_per_round=40,
                                 serve_per_requester=40, serve_streams_per_peer=3)

    async def main() -> tuple[int, list[Received], RoundStats, RoundStats]:
        hub = MemoryHub()
        transports = {name: MemoryTransport(hub, name) for name in ("n0", "n1")}
        n0, n1 = (FaninExchange(transports[name], limits, accept_policy_for(SOURCE), params, SEEDS[i], 8)
                  for i, name in enumerate(("n0", "n1")))
        for transport, exchange in zip(transports.values(), (n0, n1), strict=True):
            await transport.start()
            await exchange.start()
        await transports["n0"].connect(memory_addr("n1"))
        n0.publish([_group(0, k, time.time()) for k in range(20)])
        assert n0.queued == 20
        await n0.flush()
        assert n0.queued == 0
        await hub.settle()
        accepted = await n1.pull()
        out = accepted, n1.drain(), n1.round_stats, n0.round_stats
        for transport in transports.values():
            await transport.stop()
        return out

    accepted, got, pulled, served = asyncio.run(main())
    assert accepted == 20
    assert sorted(r.group.group_id for r in got if r.group is not None) == [bytes([0, k]) * 8 for k in range(20)]
    assert _drops(got) == []
    # One digest batch and 3 pull responses in; 20 groups pulled, all served.
    assert (pulled.inbound_messages, pulled.pulls_sent, served.pulls_served) == (4, 20, 20)


def test_digests_that_arrive_while_a_pull_is_under_way_are_candidates_of_the_next_round() -> None:
    """n2's digest reaches n1 after n1's pull chose (n0's group) and before it finished: n1's next round pulls it
    (a flush used to clear every candidate, so a group announced during a receiver's pull was never fetched)."""
    async def main() -> tuple[list[str], list[str]]:
        hub, transports, exchanges = await _started(PARAMS)
        for a, b in (("n0", "n1"), ("n0", "n2"), ("n1", "n2")):
            await transports[a].connect(memory_addr(b))
        n0, n1, n2 = exchanges["n0"], exchanges["n1"], exchanges["n2"]
        n0.publish([_group(0, 0, time.time())])
        await n0.flush()
        await hub.settle()
        reach = n1.reach.reach

        async def n2_announces_meanwhile(senders: list[str]) -> set[str]:
            n2.publish([_group(2, 0, time.time())])
            await n2.flush()
            await hub.settle()
            return await reach(senders)

        n1.reach.reach = n2_announces_meanwhile  # type: ignore[method-assign]
        await n1.flush()  # pulls n0's group; n2's digest arrives during the pull
        first = _senders(n1.drain())
        n1.reach.reach = reach  # type: ignore[method-assign]
        await n1.flush()
        out = first, _senders(n1.drain())
        for t in transports.values():
            await t.stop()
        return out

    assert asyncio.run(main()) == (["n0"], ["n2"])


def test_flush_publishes_our_digests_before_it_pulls() -> None:
    """n0's flush announces its new group first and then pulls n1's: n1 can fetch n0's group while n0's pull is
    still under way (peers need not wait for our pulls)."""
    async def main() -> tuple[list[str], list[str]]:
        hub, transports, exchanges = await _started(PARAMS)
        await transports["n0"].connect(memory_addr("n1"))
        n0, n1 = exchanges["n0"], exchanges["n1"]
        n1.publish([_group(1, 0, time.time())])
        await n1.flush()
        await hub.settle()
        reach = n0.reach.reach
        during: list[str] = []

        async def n1_pulls_meanwhile(senders: list[str]) -> set[str]:
            await hub.settle()
            await n1.pull()
            during.extend(_senders(n1.drain()))
            return await reach(senders)

        n0.reach.reach = n1_pulls_meanwhile  # type: ignore[method-assign]
        n0.publish([_group(0, 0, time.time())])
        await n0.flush()
        out = during, _senders(n0.drain())
        for t in transports.values():
            await t.stop()
        return out

    assert asyncio.run(main()) == (["n0"], ["n1"])


def test_flush_hands_the_finished_round_counters_to_on_round() -> None:
    async def next_round(exchanges: dict[str, FaninExchange]) -> object:
        finished: list[RoundStats] = []
        n0 = exchanges["n0"]
        n0.on_round = finished.append
        await n0.flush()
        return finished, n0.round_stats

    out = _swarm(after_pull=next_round)
    finished, current = out.extra  # type: ignore[misc]
    assert [s.as_status() for s in finished] == [{"round": 1, "inbound_messages": 6, "inbound_bytes":
                                                  finished[0].inbound_bytes, "pulls_sent": 3, "pulls_served": 3,
                                                  "pushes_sent": 0, "by_reason": {}}]
    # n0's 3 shard neighbours' digest batches and one pulled group of each: the bytes are exactly theirs.
    assert finished[0].inbound_bytes == sum(_digest_batch_bytes(j) + len(encode_group(_group(j, 0, 1.0)))
                                            for j in (1, 2, 3))
    assert current == RoundStats(2)


def test_groups_nobody_pulled_are_pushed_once_to_one_shard_neighbour() -> None:
    """n0's groups carry no signal, so nobody pulls them; once push_after_s has passed, n0's next flush pushes each
    to one neighbour of its shard (a peer whose digests it heard), which takes it (it holds the digest) and checks
    it like a pulled one."""
    clock = [1_000.0]

    async def main() -> tuple[dict[str, list[Received]], RoundStats]:
        hub, transports, exchanges = await _started(PARAMS, clock=lambda: clock[0])
        for i, a in enumerate(NAMES):
            for b in NAMES[i + 1:]:
                await transports[a].connect(memory_addr(b))
        exchanges["n0"].publish([_no_signal(_group(0, k, clock[0])) for k in (0, 1)])
        for i, name in enumerate(NAMES[1:], start=1):
            exchanges[name].publish([_group(i, 0, clock[0]), _group(i, 1, clock[0])])
        for name in NAMES:
            await exchanges[name].flush()
        await hub.settle()
        await asyncio.gather(*(exchanges[name].pull() for name in NAMES))  # nothing to pull: no signal
        finished: list[RoundStats] = []
        exchanges["n0"].on_round = finished.append
        clock[0] += PARAMS.push_after_s
        await exchanges["n0"].flush()
        await _loop_turns()
        got = {name: exchanges[name].drain() for name in NAMES}
        for t in transports.values():
            await t.stop()
        return got, finished[0]

    got, n0_round = asyncio.run(main())
    assert n0_round.pushes_sent == 2 and n0_round.pulls_served == 0
    pushed = sorted((r.group.group_id, name) for name in NAMES for r in got[name]
                    if r.group is not None and r.sender == "n0")
    assert [gid for gid, _ in pushed] == [bytes([0, 0]) * 8, bytes([0, 1]) * 8]  # each group exactly once
    assert {name for _, name in pushed} <= set(_neighbours("n0"))
    assert all(_drops(got[name]) == [] for name in NAMES)


def test_a_push_without_a_digest_or_past_the_caps_is_dropped_unread() -> None:
    async def pushes(exchanges: dict[str, FaninExchange]) -> object:
        from protocol.messages import PulledGroup, PullResponse
        from swarm_node.sharing.pull_stream import send_push

        n4 = exchanges["n4"].transport
        unknown = PullResponse((PulledGroup(b"\xee" * 16, b"junk"),), (), time.time())
        await send_push(n4, "n5", unknown, LIMITS, 2.0)  # n5 never heard a digest of it
        await _loop_turns()
        return None

    out = _swarm(after_pull=pushes)
    assert _drops(out.received["n5"]) == [("n4", "unsolicited_push")]


def test_the_push_goes_out_push_after_s_after_the_digest_while_peers_still_hold_it() -> None:
    """With the real clock: no flush after ours, yet push_after_s later n0's unpulled groups reach a neighbour,
    which takes them (it still holds n0's digest: it has not flushed either)."""
    params = dataclasses.replace(PARAMS, push_after_s=0.3)

    async def main() -> tuple[dict[str, list[Received]], int]:
        hub, transports, exchanges = await _started(params)
        for i, a in enumerate(NAMES):
            for b in NAMES[i + 1:]:
                await transports[a].connect(memory_addr(b))
        now = time.time()
        exchanges["n0"].publish([_no_signal(_group(0, k, now)) for k in (0, 1)])
        for i, name in enumerate(NAMES[1:], start=1):  # their digests make them n0's shard neighbours
            exchanges[name].publish([_group(i, 0, now), _group(i, 1, now)])
        for name in NAMES:
            await exchanges[name].flush()
        await hub.settle()
        await asyncio.gather(*(exchanges[name].pull() for name in NAMES))  # nobody pulls n0's: no signal
        await asyncio.sleep(0.6)  # past push_after_s, and no flush
        await _loop_turns()
        got = {name: exchanges[name].drain() for name in NAMES}
        pushes = exchanges["n0"].round_stats.pushes_sent
        await exchanges["n0"].flush()  # nothing is pushed twice
        pushes_after_flush = exchanges["n0"].round_stats.pushes_sent
        for t in transports.values():
            await t.stop()
        return got, pushes + pushes_after_flush

    got, pushes = asyncio.run(main())
    assert pushes == 2
    pushed = sorted(r.group.group_id for name in NAMES for r in got[name] if r.group is not None and r.sender == "n0")
    assert pushed == [bytes([0, 0]) * 8, bytes([0, 1]) * 8] and all(_drops(got[name]) == [] for name in NAMES)


async def _loop_turns() -> None:
    """Let the receivers' stream handlers run (in-process: loop turns, not time)."""
    for _ in range(50):
        await asyncio.sleep(0)


def _no_signal(group: RolloutGroup) -> RolloutGroup:
    return dataclasses.replace(group, completions=tuple(dataclasses.replace(c, claimed_reward=0.0)
                                                        for c in group.completions))


def test_a_lying_server_costs_reputation_by_the_ledger_weights() -> None:
    from swarm_node.sharing.reputation import DEFAULT_WEIGHTS, Reputation

    reputation = Reputation()
    assert [reputation.weight(kind) for kind in ("hash_mismatch", "digest_reward_mismatch", "unserved_digest",
                                                 "unoffered_pull", "over_pull", "unsolicited_push")] \
        == [-5.0, -5.0, -1.0, -1.0, -0.5, -0.5]
    assert DEFAULT_WEIGHTS["busy"] == 0.0


def test_a_new_epoch_moves_the_node_to_its_new_shard_and_leaves_the_old_one() -> None:
    """n4 (seed2) draws shard 0 in epoch 0 and shard 1 in epoch 1 (epoch_rounds 1 here): after its flush opens
    round 1 it has left shard 0 (a digest batch there never reaches it) and one on shard 1 is taken."""
    # A wide hysteresis band holds M at 2 although n4 sees only n5: the epoch's rotation alone moves it.
    params = dataclasses.replace(PARAMS, epoch_rounds=1, shard_hysteresis=0.9)

    async def main() -> tuple[tuple[int, ...], tuple[int, ...], RoundStats, int]:
        hub = MemoryHub()
        n4, n5 = MemoryTransport(hub, "n4"), MemoryTransport(hub, "n5")
        ex = FaninExchange(n4, LIMITS, accept_policy_for(SOURCE), params, SEEDS[4], 8)
        for t in (n4, n5):
            await t.start()
        await ex.start()
        before = ex.shards
        await n4.connect(memory_addr("n5"))
        await ex.flush()
        after = ex.shards
        now = time.time()
        for shard in (0, 1):
            digests = (DigestWire(bytes([5, shard]) * 8, "chain_sum:1", 0.25, True, b"\xaa" * 32),)
            await n5.publish(digest_topic(shard), encode(DigestBatch(shard, 1, digests, now)))
        await hub.settle()
        candidates = len(ex._candidates)
        n4_topics = [p.topics for p in await n5.peers()]
        for t in (n4, n5):
            await t.stop()
        return before, after, ex.round_stats, candidates, n4_topics

    before, after, stats, candidates, n4_topics = asyncio.run(main())
    assert (before, after) == ((0,), (1,))
    assert (stats.inbound_messages, candidates) == (1, 1)
    assert n4_topics == [(digest_topic(1),)]  # shard 0 left: its digests no longer reach n4 at all


def test_the_next_epoch_takes_its_shard_count_from_the_digest_senders_heard() -> None:
    """8 nodes in a ring (2 connected peers each), all started on one shard (n_peers 1). In epoch 0 each hears the
    digests of the 7 others, so epoch 1's estimate is 8 (the ring's 3 connected would say less), which with shards
    of 4 and no hysteresis is 2 shards; each node then holds its epoch-1 shard of 2 and only that topic."""
    params = dataclasses.replace(PARAMS, epoch_rounds=2, shard_hysteresis=0.0)

    async def main() -> tuple[dict[str, tuple[int, int]], dict[str, tuple[str, ...]]]:
        hub, transports, exchanges = await _started(params, n_peers=1)
        for i, name in enumerate(NAMES):
            await transports[name].connect(memory_addr(NAMES[(i + 1) % len(NAMES)]))
        now = time.time()
        for i, name in enumerate(NAMES):
            exchanges[name].publish([_group(i, 0, now)])
        for name in NAMES:
            await exchanges[name].flush()  # round 1, still epoch 0: digests on the one shard
        await hub.settle()
        for name in NAMES:
            await exchanges[name].flush()  # round 2, epoch 1
        await hub.settle()
        sizes = {n: (exchanges[n].shard_sizer.shards, exchanges[n].shard_sizer.estimate) for n in NAMES}
        topics = {}
        for i, name in enumerate(NAMES):  # as the ring's next node sees them
            seen = await transports[NAMES[(i + 1) % len(NAMES)]].peers()
            topics[name] = next(p.topics for p in seen if p.peer_id == name)
        for t in transports.values():
            await t.stop()
        return sizes, topics

    sizes, topics = asyncio.run(main())
    assert sizes == {name: (2, 8) for name in NAMES}
    assert topics == {name: (digest_topic(epoch_shards(SEEDS[i], 1, 2, 1)[0]),) for i, name in enumerate(NAMES)}


def test_a_node_that_joins_takes_the_median_shard_count_its_first_senders_announce() -> None:
    """n4 joins as `join` starts it (n_peers = shard size: M = 1, learning): its first batch, on shard 0, announces
    M = 0. n1, n2, n3 announce M = 5, 40 and 6 on shard 0 and n0 announces 0 (learning too: left out), so at its
    next flush n4 takes the lower median of (5, 6, 40), 6, mid-epoch: it leaves shard 0 for its epoch-0 shard of 6
    (seed2: shard 4) and announces 6 there. Nobody else is on shard 4 (a swarm of 6 shards would have members
    there): at the flush after, n4 goes back to shard 0, learning, and announces 0 again."""
    async def main() -> tuple[list[tuple[int, int]], tuple[int, ...], int, bool, list[tuple[str, ...]],
                              tuple[tuple[int, ...], int, bool]]:
        hub = MemoryHub()
        peers = {name: MemoryTransport(hub, name) for name in NAMES[:4]}
        n4 = MemoryTransport(hub, "n4")
        ex = FaninExchange(n4, LIMITS, accept_policy_for(SOURCE), PARAMS, SEEDS[4], PARAMS.shard_size)
        seen: list[tuple[int, int]] = []
        for t in (*peers.values(), n4):
            await t.start()
        await ex.start()
        for topic in (digest_topic(0), digest_topic(4)):
            await peers["n0"].subscribe(topic, lambda d: seen.append((_decoded(d.data).shard, _decoded(d.data).shards))
                                        if d.from_peer == "n4" else None)
        for name in peers:
            await n4.connect(memory_addr(name))
        now = time.time()
        ex.publish([_group(4, 0, now)])
        await ex.flush()
        for i, (name, shards) in enumerate((("n0", 0), ("n1", 5), ("n2", 40), ("n3", 6))):
            digests = (DigestWire(bytes([i, 9]) * 8, "chain_sum:1", 0.0, False, b"\xaa" * 32),)  # no signal: no pull
            await peers[name].publish(digest_topic(0), encode(DigestBatch(0, 1, digests, now, shards=shards)))
        await hub.settle()
        ex.publish([_group(4, 1, now)])
        await ex.flush()
        await hub.settle()
        topics = [p.topics for p in await peers["n1"].peers()]
        learnt = ex.shards, ex.shard_sizer.shards, ex.shard_sizer.learning
        ex.publish([_group(4, 2, now)])
        await ex.flush()
        await hub.settle()
        out = seen, *learnt, topics, (ex.shards, ex.shard_sizer.shards, ex.shard_sizer.learning)
        for t in (*peers.values(), n4):
            await t.stop()
        return out

    seen, shards, count, learning, topics, back = asyncio.run(main())
    assert seen == [(0, 0), (4, 6), (0, 0)]
    assert (shards, count, learning) == ((4,), 6, False)
    assert topics == [(digest_topic(4),)]  # shard 0 left
    assert back == ((0,), 1, True)


def _decoded(data: bytes) -> DigestBatch:
    msg = decode(data, LIMITS)
    assert isinstance(msg, DigestBatch)
    return msg
