"""The shard count from the swarm a node sees: the estimate, its bounds, the hysteresis band and the step cap."""

from __future__ import annotations

import dataclasses

import pytest

from swarm_node.sharing.fanin import FanInParams
from swarm_node.sharing.swarm_size import ShardCount, announced_shard_count, estimate_swarm, threshold

P = FanInParams()  # shard_size 24, one shard per node, hysteresis 0.25, step 4


def test_the_estimate_counts_our_shard_times_the_shards_never_below_the_connected_peers_and_capped() -> None:
    assert estimate_swarm(23, 5, 1, 1, P) == 24  # one shard: everyone else's digests reach us
    assert estimate_swarm(23, 5, 4, 1, P) == 96  # our shard is a quarter of the swarm
    assert estimate_swarm(0, 30, 4, 1, P) == 31  # the connected peers are a floor
    two = dataclasses.replace(P, shards_per_node=2)
    assert estimate_swarm(11, 0, 8, 2, two) == 24  # 2 of 8 shards: another node shares one with p = 4/8
    assert estimate_swarm(10**7, 0, 1, 1, P) == 1_000_000  # max_swarm_estimate
    with pytest.raises(ValueError):
        estimate_swarm(-1, 0, 1, 1, P)


def test_the_shard_count_moves_only_outside_its_band() -> None:
    assert (threshold(1, P), threshold(2, P), threshold(3, P)) == (24.0, 48.0, 72.0)
    count = ShardCount(P)
    # At 1 shard the band is [0, 48 * 1.25 = 60): 59 nodes stay on one shard, 60 make two (60 // 24).
    assert [count.next_epoch(heard, 0, 1) for heard in (40, 58)] == [1, 1]
    assert (count.next_epoch(59, 0, 1), count.estimate) == (2, 60)
    # At 2 shards the band is [48 * 0.75 = 36, 72 * 1.25 = 90): a swarm of 36..89 stays on 2 shards.
    assert [count.next_epoch(heard, 0, 1) for heard in (23, 17, 43)] == [2, 2, 2]
    assert count.estimate == 88
    assert (count.next_epoch(44, 0, 1), count.estimate) == (3, 90)
    # At 3 shards the band is [54, 120): 51 is below it (51 // 24 = 2), and at 2 shards 34 is below 36.
    assert (count.next_epoch(16, 0, 1), count.estimate) == (2, 51)
    assert (count.next_epoch(16, 0, 1), count.estimate) == (1, 34)


def test_a_swarm_on_a_boundary_does_not_flap() -> None:
    """48 nodes: on 1 shard each hears 47 (estimate 48 < 60); on 2 shards each hears 23 (48, inside [36, 90))."""
    one, two = ShardCount(P, 1), ShardCount(P, 2)
    assert [one.next_epoch(47, 8, 1) for _ in range(5)] == [1] * 5
    assert [two.next_epoch(23, 8, 1) for _ in range(5)] == [2] * 5


def test_the_shard_count_grows_and_shrinks_by_at_most_the_step_per_epoch() -> None:
    count = ShardCount(P)
    grown = []
    for _ in range(6):  # 10,000 nodes: each shard holds 10,000 / M of them
        grown.append(count.next_epoch(10_000 // count.shards - 1, 8, 1))
    assert grown == [4, 16, 64, 256, 416, 416]  # 10,000 // 24 = 416
    shrunk = [count.next_epoch(0, 0, 1) for _ in range(3)]  # alone: our shard is empty
    assert shrunk == [104, 26, 7]
    with pytest.raises(ValueError):
        ShardCount(P, 0)


def test_a_joining_node_takes_the_lower_median_of_the_shard_counts_announced() -> None:
    assert announced_shard_count([41, 29, 52], P) == 41
    assert announced_shard_count([41, 29, 52, 58], P) == 41  # the lower median: a value somebody announced
    assert announced_shard_count([41, 0, 0, 29, 0, 52], P) == 41  # 0: a sender still learning, left out
    assert announced_shard_count([41, 29], P) is None  # fewer than learn_from_peers (3)
    assert announced_shard_count([0, 0, 0, 41], P) is None
    # Fewer than half the senders cannot move the median outside the honest ones' values: 4 honest, 3 liars.
    assert announced_shard_count([41, 41, 40, 42, 65536, 65536, 65536], P) == 42
    assert announced_shard_count([41, 41, 40, 42, 1, 1, 1], P) == 40
    # Half or more can (then it is bounded by the largest M that max_swarm_estimate allows: 1,000,000 // 24).
    assert announced_shard_count([41, 65536, 65536], P) == 41_666
    three = dataclasses.replace(P, learn_from_peers=1)
    assert announced_shard_count([7], three) == 7


def test_a_learning_node_announces_zero_and_takes_its_peers_m_once_then_follows_its_own_estimate() -> None:
    count = ShardCount(P, 1, learning=True)
    assert (count.announced, count.learning) == (0, True)
    assert not count.learn([41, 29])  # too few
    assert (count.shards, count.announced) == (1, 0)
    assert count.learn([41, 29, 52, 0])  # no step cap: 1 -> 41 at once
    assert (count.shards, count.announced, count.learning) == (41, 41, False)
    assert not count.learn([100, 100, 100])  # learnt once: from now on only its own estimate moves M
    assert count.shards == 41
    # 24 heard in a shard of 41: an estimate of 25 * 41 = 1,025, inside 41's band [984 * 0.75, 1,008 * 1.25).
    assert (count.next_epoch(24, 12, 1), count.estimate) == (41, 1025)
    # A node that reaches an epoch's end still learning (a swarm that started together) follows its estimate.
    alone = ShardCount(P, 1, learning=True)
    assert (alone.next_epoch(59, 0, 1), alone.learning, alone.announced) == (2, False, 2)
    assert not alone.learn([41, 41, 41])
    assert ShardCount(P, 3).announced == 3  # not learning (the default): it announces its M


def test_an_m_taken_from_peers_that_the_next_round_does_not_confirm_is_dropped_for_learning_again() -> None:
    count = ShardCount(P, 1, learning=True)
    assert not count.confirm(0)  # nothing taken yet: nothing to confirm
    assert count.learn([41, 41, 41]) and count.probation
    assert not count.confirm(3)  # 3 distinct senders on the new shard (learn_from_peers): kept
    assert (count.shards, count.learning, count.probation) == (41, False, False)
    assert not count.confirm(0)  # confirmed once: no longer on probation
    lied_to = ShardCount(P, 1, learning=True)
    assert lied_to.learn([65536, 65536, 41])  # the liars are the majority: a shard nobody else is in
    assert lied_to.confirm(2)  # 2 senders there: back to the starting M, learning
    assert (lied_to.shards, lied_to.learning, lied_to.announced, lied_to.probation) == (1, True, 0, False)
    assert lied_to.learn([41, 41, 41, 65536, 65536]) and lied_to.shards == 41
    # An epoch change ends the probation (the node's own estimate rules from then on).
    assert lied_to.next_epoch(0, 0, 1) == 11 and not lied_to.probation  # 41 / 4, rounded up
