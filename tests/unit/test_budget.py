"""Per-peer re-scoring budgets (sharing/budget.py): plain numbers, time passed in, hand-computed balances."""

from __future__ import annotations

import pytest

from swarm_node.sharing.budget import NODE_BUDGET, PEER_BUDGET, BudgetParams, PeerBudget


def test_debt_bucket_by_hand() -> None:
    budget = PeerBudget(BudgetParams(share=0.2, burst_s=1.0, window_s=60.0))
    assert budget.admit("a", 0.0) == ""  # a new peer starts with a full bucket: 1.0 s
    budget.charge("a", 0.4, 0.0)  # 0.6 left
    budget.charge("a", 1.1, 0.0)  # one group may take it into debt: -0.5
    assert budget.node_balance == pytest.approx(4.0 - 1.5)  # the node's bucket holds 4 bursts
    assert budget.balance("a", 1.0) == pytest.approx(-0.3)  # alone: earns the whole 0.2 s/s
    assert budget.admit("a", 1.0) == PEER_BUDGET  # in debt: refused before any work, nothing charged
    assert budget.admit("a", 2.6) == ""  # -0.5 + 2.6 * 0.2 = 0.02
    assert budget.balance("a", 100.0) == pytest.approx(1.0)  # saved work is capped at burst_s
    assert budget.spent == {"a": pytest.approx(1.5)}


def test_share_is_split_among_active_peers() -> None:
    budget = PeerBudget(BudgetParams(share=0.3, burst_s=1.0, window_s=10.0))
    for peer in ("a", "b", "c"):
        assert budget.admit(peer, 0.0) == ""
    assert budget.rate(0.0) == pytest.approx(0.1)
    assert budget.rate(10.0) == pytest.approx(0.1)  # last seen exactly a window ago: still active
    assert budget.rate(10.5) == pytest.approx(0.3)  # nobody active: a lone newcomer gets the whole share


def test_a_flooding_peer_gets_its_share_and_honest_peers_keep_theirs() -> None:
    share, burst, cost, seconds = 0.3, 1.0, 0.01, 200
    budget = PeerBudget(BudgetParams(share=share, burst_s=burst, window_s=30.0))
    refused: dict[str, int] = {"flood": 0, "h1": 0, "h2": 0}
    for t in range(seconds):
        for _ in range(100):  # the flood: 100 valid, distinct groups a second, each costing 10 ms to re-score
            if budget.admit("flood", float(t)):
                refused["flood"] += 1
            else:
                budget.charge("flood", cost, float(t))
        for peer in ("h1", "h2"):  # honest: 2 groups a second (20 ms/s, under their 100 ms/s share)
            for _ in range(2):
                if budget.admit(peer, float(t)):
                    refused[peer] += 1
                else:
                    budget.charge(peer, cost, float(t))
    per_peer = share / 3
    assert budget.spent["flood"] <= per_peer * seconds + burst + cost  # never more than its share
    assert budget.spent["flood"] >= per_peer * (seconds - 1) - cost  # and it does get its share
    assert refused["h1"] == refused["h2"] == 0  # honest peers lose nothing
    assert budget.spent["h1"] == pytest.approx(2 * cost * seconds)
    total = sum(budget.spent.values())
    assert total <= share * seconds + burst + 3 * cost  # the node's time is bounded


def test_many_identities_share_the_node_budget() -> None:
    budget = PeerBudget(BudgetParams(share=0.2, burst_s=1.0, window_s=60.0))
    admitted = 0
    for i in range(1000):  # a Sybil burst: 1000 fresh peer ids, one 10 ms group each, all at once
        reason = budget.admit(f"sybil{i}", 0.0)
        if not reason:
            budget.charge(f"sybil{i}", 0.01, 0.0)
            admitted += 1
        else:
            assert reason == NODE_BUDGET
    assert 400 <= admitted <= 401  # the node's own bucket (4 bursts of 1 s) ran dry: 4.0 / 0.01 (+ 1, rounding)
    assert sum(budget.spent.values()) <= 4.0 + 0.01
    assert budget.admit("honest", 0.0) == NODE_BUDGET
    assert budget.admit("honest", 1.0) == ""  # refilled at 0.2 s/s: positive again


def test_idle_peers_are_forgotten_and_the_table_is_bounded() -> None:
    budget = PeerBudget(BudgetParams(share=0.25, burst_s=1.0, window_s=10.0, max_peers=2))
    assert budget.admit("a", 0.0) == "" and budget.admit("b", 0.0) == ""
    budget.charge("b", 7.0, 0.0)  # b owes 6 s: kept while its bucket is not full again
    assert budget.admit("c", 1.0) == PEER_BUDGET  # table full of active peers
    assert budget.admit("c", 20.0) == ""  # a went idle for a window: forgotten, room for c
    assert set(budget.accounts) == {"b", "c"}


@pytest.mark.parametrize("kwargs", [{"share": 0.0}, {"burst_s": -1.0}, {"window_s": float("inf")},
                                    {"max_peers": 0}, {"node_bursts": 0}])
def test_params_are_validated(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="BudgetParams"):
        BudgetParams(**kwargs)  # type: ignore[arg-type]
