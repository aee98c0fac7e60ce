"""Bounded fan-in (sharing/fanin.py, sharing/fanin_ledger.py): shard choice, pull selection, caps and scoring."""

from __future__ import annotations

import pytest

from swarm_node.sharing.fanin import (
    Digest,
    FanInParams,
    choose_pulls,
    epoch_of,
    epoch_shards,
    pull_asks,
    shard_count,
    tiebreak,
    unpulled,
)
from swarm_node.sharing.fanin_ledger import (
    BUSY,
    FANIN_WEIGHTS,
    HASH_MISMATCH,
    OVER_PULL,
    REWARD_MISMATCH,
    SERVE,
    UNOFFERED,
    UNSOLICITED,
    PushBook,
    ServeBook,
    check_pulled,
)
from swarm_node.sharing.reputation import Reputation, ReputationParams

HASH = b"h" * 32


def digest(group: str, sender: str, task: str = "t0", variance: float = 0.25, signal: bool = True) -> Digest:
    return Digest(group, sender, task, variance, signal, HASH)


def test_shard_count_keeps_about_shard_size_nodes_per_shard() -> None:
    params = FanInParams()  # 24 per shard, k = 1
    assert [shard_count(n, params) for n in (1, 10, 47, 48, 100, 1000, 10000)] == [1, 1, 1, 2, 4, 41, 416]
    assert shard_count(100, FanInParams(shards_per_node=2)) == 8
    with pytest.raises(ValueError, match="n_peers >= 1"):
        shard_count(0, params)


def test_epoch_shards_are_fixed_by_the_seed_and_change_with_the_epoch() -> None:
    assert [epoch_shards(b"seed-a", e, 40, 1) for e in range(4)] == [(1,), (29,), (17,), (32,)]
    assert epoch_shards(b"seed-a", 0, 40, 3) == (1, 3, 12)  # k distinct shards, sorted; the first draw is kept
    assert epoch_shards(b"seed-b", 0, 40, 3) == (1, 7, 23)
    assert epoch_shards(b"x", 0, 1, 3) == (0,)  # never more shards than exist
    assert [epoch_of(r, FanInParams()) for r in (0, 9, 10, 25)] == [0, 0, 1, 2]


def test_choose_pulls_takes_signal_only_new_senders_and_new_tasks_first() -> None:
    params = FanInParams(pull_target=3)
    seed = b"r"
    candidates = [
        digest("g-quiet", "a", signal=False, variance=0.0),  # no signal: never pulled
        digest("g-a1", "a", task="t0", variance=0.20),
        digest("g-a2", "a", task="t1", variance=0.24),  # same sender as g-a1: one per sender per round
        digest("g-b1", "b", task="t0", variance=0.25),
        digest("g-c1", "c", task="t2", variance=0.10),  # c was heard lately: ranks after the others
        digest("g-d1", "d", task="t0", variance=0.05),
    ]
    chosen = choose_pulls(candidates, set(), {}, set(), {"c"}, params, seed)
    # First pass (new tasks): b (t0, 0.25), a's g-a2 (t1, 0.24); d's t0 taken; c is recent but t2 is new.
    assert [d.group_id for d in chosen] == ["g-b1", "g-a2", "g-c1"]
    chosen = choose_pulls(candidates, set(), {}, set(), set(), params, seed)
    assert [d.group_id for d in chosen] == ["g-b1", "g-a2", "g-c1"]
    # Slots already used, senders and tasks already taken this round.
    chosen = choose_pulls(candidates, {"g-b1"}, {"b": 1}, {"t0"}, {"c"}, params, seed)
    assert [d.group_id for d in chosen] == ["g-a2", "g-c1"]
    assert choose_pulls(candidates, {"x", "y", "z"}, {}, set(), set(), params, seed) == ()


def test_choose_pulls_breaks_ties_by_the_receivers_own_order() -> None:
    params = FanInParams(pull_target=1)
    a, b = digest("g1", "a"), digest("g2", "b")
    first = min((a, b), key=lambda d: tiebreak(b"seed-1", d.group_id))
    assert choose_pulls([a, b], set(), {}, set(), set(), params, b"seed-1") == (first,)
    assert tiebreak(b"seed-1", "g1") != tiebreak(b"seed-2", "g1")


def test_pull_asks_send_one_request_per_sender_and_round_of_at_most_max_ids() -> None:
    chosen = [digest(f"a{i}", "a") for i in range(5)] + [digest("b0", "b"), digest("a-old", "a")]
    round_of = {**{f"a{i}": 7 for i in range(5)}, "b0": 3, "a-old": 6}
    asks = pull_asks(chosen, round_of, 2)
    assert [(sender, r, [d.group_id for d in ds]) for sender, r, ds in asks] == [
        ("a", 7, ["a0", "a1"]), ("a", 7, ["a2", "a3"]), ("a", 7, ["a4"]), ("b", 3, ["b0"]), ("a", 6, ["a-old"])]
    assert [len(ds) for _, _, ds in pull_asks(chosen, round_of, 16)] == [5, 1, 1]
    assert pull_asks([], {}, 16) == []
    with pytest.raises(ValueError, match="max_ids >= 1"):
        pull_asks(chosen, round_of, 0)


def test_unpulled_lists_groups_due_for_the_push_fallback() -> None:
    params = FanInParams(push_after_s=6.0)
    assert FanInParams().push_after_s == 4.0  # a digest published 5 s into a 10 s round is still pushed in it
    published = {"g1": 0.0, "g2": 1.0, "g3": 0.5}
    assert unpulled(published, {"g3"}, 6.5, params) == ("g1",)
    assert unpulled(published, set(), 7.0, params) == ("g1", "g2", "g3")
    assert unpulled(published, set(), 5.9, params) == ()


def test_serve_book_caps_per_requester_and_per_round() -> None:
    book = ServeBook(FanInParams(serve_per_round=2, serve_per_requester=1))
    book.new_round({"g1", "g2", "g3"})
    assert book.request("r1", "g9") == UNOFFERED
    assert book.request("r1", "g1") == SERVE
    assert book.request("r1", "g2") == OVER_PULL
    assert book.request("r2", "g2") == SERVE
    assert book.request("r3", "g3") == BUSY
    book.new_round({"g4"})
    assert book.request("r3", "g4") == SERVE and book.request("r3", "g1") == UNOFFERED


def test_push_book_takes_only_announced_groups_within_its_caps() -> None:
    book = PushBook(FanInParams(pushes_accepted_per_round=3, pushes_accepted_per_sender=2))
    assert book.accept("a", digest_known=False) == UNSOLICITED
    assert [book.accept("a", True) for _ in range(3)] == ["", "", UNSOLICITED]
    assert [book.accept("b", True) for _ in range(2)] == ["", UNSOLICITED]  # the round's cap of 3
    book.new_round()
    assert book.accept("b", True) == ""


def test_check_pulled_drops_wrong_content_and_scores_inflated_statistics() -> None:
    d = digest("g1", "a", variance=0.25, signal=True)
    assert check_pulled(d, HASH, True, 0.25) == ""
    assert check_pulled(d, b"x" * 32, True, 0.25) == HASH_MISMATCH
    assert check_pulled(d, HASH, False, 0.0) == REWARD_MISMATCH
    assert check_pulled(d, HASH, True, 0.09) == REWARD_MISMATCH


def test_fanin_kinds_score_through_reputation() -> None:
    rep = Reputation(ReputationParams(weights=FANIN_WEIGHTS))
    assert rep.record("liar", REWARD_MISMATCH, 0.0, n=4) == "graylisted"  # 4 x -5 = -20: the graylist score
    assert rep.record("busy-asker", BUSY, 0.0, n=100) == "ok"
    assert rep.record("prober", UNOFFERED, 0.0, n=3) == "ok" and rep.score("prober", 0.0) == -3.0


def test_params_are_validated() -> None:
    with pytest.raises(ValueError, match="FanInParams.pull_target must be a positive int"):
        FanInParams(pull_target=0)
    with pytest.raises(ValueError, match="FanInParams.push_after_s must be a finite number > 0"):
        FanInParams(push_after_s=float("nan"))
