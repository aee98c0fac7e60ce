"""Experience pool: de-duplication, per-peer caps against flooding, age in our own steps, selection functions."""

from __future__ import annotations

import random

import pytest

from swarm_node import tasks
from swarm_node.sampler.base import Completion
from swarm_node.sharing.pool import ExperiencePool
from swarm_node.sharing.selection import SELECTIONS
from swarm_node.types import Origin, PoolEntry, ScoredGroup


def entry(sender: str, key: str, step: int = 0, rewards: tuple[float, ...] = (1.0, 0.0)) -> PoolEntry:
    ref = tasks.TaskRef("chain_sum", "{}", 0, 0)
    inst = tasks.TaskInstance(ref, "q", "a", "q\nAnswer: ", {})
    group = ScoredGroup(inst, [5], [Completion([7], "x", [-0.1], 0) for _ in rewards], list(rewards),
                        [1.0, -1.0], Origin.peer(sender))
    return PoolEntry(group, sender, key.encode(), step)


def keys(pool: ExperiencePool) -> list[str]:
    return [e.key.decode() for e in pool.entries()]


def test_duplicate_content_is_refused_even_after_it_left_the_pool() -> None:
    pool = ExperiencePool(capacity=8, per_peer_cap=8, max_age=10)
    assert pool.add(entry("a", "k1")) == []
    assert pool.add(entry("b", "k1")) == [("b", "copied")]  # another peer sent it first
    assert pool.take(1, "uniform", random.Random(0)) and len(pool) == 0
    assert pool.add(entry("a", "k1")) == [("a", "duplicate")]
    assert len(pool) == 0


def test_flooding_peer_only_churns_its_own_share() -> None:
    pool = ExperiencePool(capacity=10, per_peer_cap=3, max_age=10)
    pool.add(entry("honest", "h1"))
    pool.add(entry("honest", "h2"))
    drops = [d for i in range(100) for d in pool.add(entry("flood", f"f{i}"))]
    assert drops == [("flood", "peer_cap")] * 97
    assert pool.per_peer() == {"honest": 2, "flood": 3}
    assert keys(pool) == ["h1", "h2", "f97", "f98", "f99"]  # the flooder keeps only its newest 3


def test_full_pool_drops_the_oldest() -> None:
    pool = ExperiencePool(capacity=3, per_peer_cap=3, max_age=10)
    for sender, key in (("a", "1"), ("b", "2"), ("c", "3")):
        assert pool.add(entry(sender, key)) == []
    assert pool.add(entry("d", "4")) == [("a", "pool_full")]
    assert keys(pool) == ["2", "3", "4"]


def test_age_counts_our_own_steps_since_receipt() -> None:
    pool = ExperiencePool(capacity=8, per_peer_cap=8, max_age=2)
    pool.add(entry("a", "old", step=0))
    pool.add(entry("b", "edge", step=1))
    pool.add(entry("c", "new", step=3))
    assert pool.expire(3) == [("a", "too_old")]  # 3 - 0 > 2; 3 - 1 == 2 stays
    assert keys(pool) == ["edge", "new"]
    assert pool.expire(4) == [("b", "too_old")]


def test_per_peer_batch_cap_and_take_removes() -> None:
    pool = ExperiencePool(capacity=8, per_peer_cap=8, max_age=10)
    for i in range(4):
        pool.add(entry("a", f"a{i}"))
    pool.add(entry("b", "b0"))
    picked = pool.take(4, "uniform", random.Random(3), per_peer_batch_cap=2)
    assert sorted(e.sender for e in picked) == ["a", "a", "b"]
    assert len(pool) == 2 and {e.sender for e in pool.entries()} == {"a"}
    assert pool.take(0, "uniform", random.Random(0)) == []


def test_uniform_is_seeded_and_covers_the_pool() -> None:
    entries = [entry(s, f"{s}{i}") for s in "abc" for i in range(3)]
    first = SELECTIONS["uniform"](entries, 9, random.Random(7), 0)
    assert first == SELECTIONS["uniform"](entries, 9, random.Random(7), 0)
    assert sorted(first) == list(range(9))
    assert first != list(range(9))


def test_freshest_and_variance_orders() -> None:
    entries = [entry("a", "x", step=1), entry("b", "y", step=5), entry("c", "z", step=3)]
    assert SELECTIONS["freshest"](entries, 2, random.Random(0), 0) == [1, 2]
    by_var = [entry("a", "p", rewards=(1.0, 1.0, 1.0, 0.0)), entry("b", "q", rewards=(1.0, 0.0, 1.0, 0.0)),
              entry("c", "r", rewards=(0.0, 0.0, 0.0, 1.0))]
    # variances 0.1875, 0.25, 0.1875: the even split first, then the two ties in seeded order
    order = SELECTIONS["variance"](by_var, 3, random.Random(0), 0)
    assert order[0] == 1 and sorted(order[1:]) == [0, 2]


def test_bad_pool_settings() -> None:
    with pytest.raises(ValueError):
        ExperiencePool(capacity=0, per_peer_cap=1, max_age=0)


def test_a_copycat_is_told_from_a_coincidence() -> None:
    """Honest peers can coincide (a duplicate of ours, or of another peer's, now and then: free); a sender whose
    groups are mostly other peers' content is a copycat once it has copied COPY_MIN times (sharing/copying.py)."""
    pool = ExperiencePool(capacity=1000, per_peer_cap=1000, max_age=10)
    pool.mark_seen([b"ours"])
    assert pool.add(entry("twin", "ours")) == [("twin", "duplicate")]  # our own content: never a copy
    reasons = []
    for i in range(12):
        assert pool.add(entry("honest", f"h{i}")) == []
        if i % 4 == 0:  # an honest peer that happens to send what another sent: a quarter of its groups
            assert pool.add(entry("other", f"h{i}")) == [("other", "copied")]
        assert pool.add(entry("other", f"o{i}")) == []
        reasons += [r for _, r in pool.add(entry("copycat", f"h{i}"))]
    assert reasons == ["copied"] * 7 + ["copycat"] * 5  # the 8th copy marks it: 8 of its 8 groups were copies
    assert pool.copies.observe("other", copied=True) is False  # 4 copies among 16: a coincidence


def test_copy_watch_needs_min_copies_and_the_fraction() -> None:
    from swarm_node.sharing.copying import CopyWatch

    watch = CopyWatch(window=4, min_copies=2, fraction=0.5, max_senders=2)
    assert [watch.observe("x", c) for c in (True, False, False, False)] == [False, False, False, False]
    assert watch.observe("x", True) is False  # window [F, F, F, T]: 1 copy
    assert watch.observe("x", True) is True  # [F, F, T, T]: 2 copies, half the window
    assert watch.observe("x", False) is False  # a fresh group never marks it
    watch.observe("y", True)
    watch.observe("z", True)  # two senders at most: x is forgotten
    assert watch.observe("x", True) is False


def flat(sender: str, key: str) -> PoolEntry:
    """A group without signal: every completion scored alike, every advantage 0."""
    ref = tasks.TaskRef("chain_sum", "{}", 0, 0)
    inst = tasks.TaskInstance(ref, "q", "a", "q\nAnswer: ", {})
    group = ScoredGroup(inst, [5], [Completion([7], "x", [-0.1], 0) for _ in range(2)], [0.0, 0.0], [0.0, 0.0],
                        Origin.peer(sender))
    return PoolEntry(group, sender, key.encode(), 0)


@pytest.mark.parametrize(("keep_no_signal", "accepted", "refused"), [(False, 3, 3), (True, 6, 0)])
def test_the_zero_advantage_filter_is_switchable(keep_no_signal: bool, accepted: int, refused: int) -> None:
    """[share] filter_no_signal (default on) refuses peers' groups without signal; off (the 4/4-nofilter ablation)
    they are pooled and taken like any other, counting toward J."""
    from swarm_node.types import ShareReport

    pool = ExperiencePool(capacity=16, per_peer_cap=16, max_age=10, keep_no_signal=keep_no_signal)
    drops = []
    for i in range(3):
        drops += pool.add(entry("a", f"s{i}"))
        drops += pool.add(flat("b", f"z{i}"))
    assert len(pool) == accepted and drops == [("b", "zero_advantage")] * refused
    assert pool.add(flat("c", "z0")) == [("c", "copied")]  # a group without signal is remembered either way
    taken = pool.take(4, "uniform", random.Random(0))
    assert len(taken) == (4 if keep_no_signal else 3)  # J = 4: the filtered pool holds only 3
    with_signal = sum(e.group.has_signal for e in taken)
    assert with_signal == sum(e.sender == "a" for e in taken) and (keep_no_signal or with_signal == 3)
    metrics = ShareReport(0, {}, len(pool)).metrics(tuple(taken))
    assert (metrics["external_used"], metrics["external_signal"]) == (len(taken), with_signal)
