"""Peer reputation (sharing/reputation.py) with hand-computed scores, the ban file, and the peer guard around the
one ingest path (sharing/ingest.py): refused before any work, bans across restarts, unban from the file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from swarm_node.config import PeersConfig
from swarm_node.sharing import ingest as ingest_module
from swarm_node.sharing.budget import BudgetParams, PeerBudget
from swarm_node.sharing.exchange import Received
from swarm_node.sharing.ingest import Ingest, PeerGuard
from swarm_node.sharing.reputation import (
    ALLOWED,
    BANNED,
    BLOCKED_APP_SCORE,
    DENIED,
    GRAYLISTED,
    OK,
    PEERS_FILE,
    Reputation,
    ReputationParams,
    read_bans,
    write_bans,
)
from swarm_node.status.stats import NodeStats
from tests.unit.test_sharing import CTX, NOW, completion, wire

PARAMS = ReputationParams(half_life_s=600.0, graylist_score=-20.0, ban_score=-50.0, ban_s=3600.0, max_score=5.0)


def test_scores_decay_with_the_half_life() -> None:
    rep = Reputation(PARAMS)
    assert rep.record("p", "forged_reward", 0.0) == OK  # -5
    assert rep.score("p", 600.0) == pytest.approx(-2.5)
    assert rep.score("p", 1200.0) == pytest.approx(-1.25)
    rep.record("p", "bad_schema", 1200.0)  # unlisted reasons cost 1: -1.25 - 1
    assert rep.score("p", 1200.0) == pytest.approx(-2.25)


def test_graylisted_at_the_threshold_then_recovers_by_decay() -> None:
    rep = Reputation(PARAMS)
    assert rep.record("p", "forged_reward", 0.0, n=3) == OK  # -15
    assert rep.record("p", "forged_reward", 0.0, n=2) == GRAYLISTED  # -25
    # -25 * 0.5 ** (t / 600) crosses -20 at t = 600 * log2(1.25) = 193.2 s
    assert rep.state("p", 190.0) == GRAYLISTED
    assert rep.state("p", 200.0) == OK  # its messages were ignored meanwhile: nothing new counted against it


def test_banned_at_the_second_threshold_for_the_ban_duration() -> None:
    rep = Reputation(PARAMS)
    assert rep.record("p", "forged_attribution", 0.0, n=5) == BANNED  # -50
    assert rep.bans == {"p": 3600.0}
    assert rep.state("p", 3599.0) == BANNED
    assert rep.score("p", 3600.0) == pytest.approx(-50 / 64)  # six half-lives
    assert rep.state("p", 3600.0) == OK  # the ban lapsed, the score decayed
    assert rep.expire(3600.0) == ["p"] and rep.bans == {}


def test_good_behaviour_cannot_be_banked() -> None:
    rep = Reputation(PARAMS)
    rep.record("p", "accepted", 0.0, n=10_000)
    assert rep.score("p", 0.0) == 5.0  # capped at max_score
    assert rep.record("p", "forged_reward", 0.0, n=5) == GRAYLISTED  # 5 - 25 = -20


def test_benign_reasons_cost_nothing_and_weights_override() -> None:
    rep = Reputation(PARAMS)
    for reason in ("stale", "zero_advantage", "pool_full", "tokenizer_mismatch", "heldout", "node_budget"):
        rep.record("p", reason, 0.0, n=1000)
    assert rep.score("p", 0.0) == 0.0 and rep.scores == {}
    rep.record("p", "peer_budget", 0.0, n=10)
    assert rep.score("p", 0.0) == pytest.approx(-1.0)
    custom = Reputation(ReputationParams(weights={"stale": -2.0, "bad_schema": 0.0}))
    custom.record("q", "stale", 0.0)
    custom.record("q", "bad_schema", 0.0)
    assert custom.score("q", 0.0) == -2.0


def test_allow_and_deny_lists() -> None:
    rep = Reputation(ReputationParams(allow=frozenset({"friend"}), deny=frozenset({"foe"})))
    assert rep.record("friend", "forged_attribution", 0.0, n=100) == ALLOWED
    assert rep.bans == {}
    rep.ban("friend", 1e12)
    assert rep.state("friend", 0.0) == ALLOWED and rep.bans == {}
    assert rep.state("foe", 0.0) == DENIED
    assert rep.app_scores(0.0, 10) == {"foe": BLOCKED_APP_SCORE, "friend": 0.0}  # allowed peers never below 0
    with pytest.raises(ValueError, match="both"):
        ReputationParams(allow=frozenset({"x"}), deny=frozenset({"x"}))


def test_app_scores_are_bounded_blocked_first() -> None:
    rep = Reputation(PARAMS)
    rep.record("liar", "forged_attribution", 0.0, n=5)
    rep.record("good", "accepted", 0.0, n=20)
    rep.record("meh", "over_length", 0.0)
    assert rep.app_scores(0.0, 2) == {"liar": BLOCKED_APP_SCORE, "good": 1.0}


def test_tracked_peers_are_bounded() -> None:
    rep = Reputation(ReputationParams(max_peers=3))
    rep.record("banned", "forged_attribution", 0.0, n=5)
    for i in range(10):
        rep.record(f"p{i}", "over_length", 0.0, n=i + 1)
    assert len(rep.scores) == 3 and "banned" in rep.scores  # the mildest go first, never a banned one
    assert set(rep.scores) == {"banned", "p8", "p9"}


def test_ban_file_round_trip_is_atomic_and_drops_expired(tmp_path: Path) -> None:
    path = tmp_path / PEERS_FILE
    write_bans(path, {"a": 100.0, "b": 50.0})
    assert json.loads(path.read_text()) == {"version": 1, "bans": {"a": 100.0, "b": 50.0}}
    assert read_bans(path, 60.0) == {"a": 100.0}
    assert [p.name for p in tmp_path.iterdir()] == [PEERS_FILE]  # no temporary file left behind
    assert read_bans(tmp_path / "missing.json", 0.0) == {}
    path.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        read_bans(path, 0.0)
    path.write_text('{"bans": {"a": "soon"}}')
    with pytest.raises(ValueError, match="finite end time"):
        read_bans(path, 0.0)


def _guard(tmp_path: Path, now: float, **cfg: object) -> PeerGuard:
    return PeerGuard.from_config(PeersConfig(**cfg), tmp_path, NodeStats(), now)  # type: ignore[arg-type]


def test_bans_persist_across_restarts_and_unban_reaches_a_running_node(tmp_path: Path) -> None:
    guard = _guard(tmp_path, NOW)
    assert not (tmp_path / PEERS_FILE).exists()  # no file until there is a ban
    guard.record("liar", "forged_attribution", NOW, n=5)
    guard.settle(NOW)
    assert read_bans(tmp_path / PEERS_FILE, NOW) == {"liar": NOW + 3600.0}
    assert guard.blocked("liar") and not guard.blocked("honest")
    assert guard.stats.dropped["banned"] == 1  # an ignored message is counted
    assert guard.stats.peers["liar"].state == BANNED

    restarted = _guard(tmp_path, NOW + 10)  # a new process: the ban is loaded at start
    assert restarted.admit("liar", NOW + 10) == BANNED and restarted.blocked("liar")

    write_bans(tmp_path / PEERS_FILE, {})  # what `swarm-node peers unban liar` does
    restarted.settle(NOW + 20)
    assert restarted.admit("liar", NOW + 20) == "" and not restarted.blocked("liar")
    assert restarted.reputation.score("liar", NOW + 20) == 0.0  # starts again at 0
    assert restarted.stats.peers["liar"].state == OK

    assert _guard(tmp_path, NOW + 30).admit("liar", NOW + 30) == ""  # and stays unbanned after a restart


def test_expired_bans_lapse_at_start_and_a_corrupt_file_is_one_line(tmp_path: Path) -> None:
    write_bans(tmp_path / PEERS_FILE, {"old": NOW - 1.0})
    assert _guard(tmp_path, NOW).admit("old", NOW) == ""
    (tmp_path / PEERS_FILE).write_text("[]")
    from swarm_node.errors import UserError
    with pytest.raises(UserError, match="not a ban file"):
        _guard(tmp_path, NOW)


def test_deny_list_and_score_push(tmp_path: Path) -> None:
    guard = _guard(tmp_path, NOW, deny=["foe"])
    pushed: list[dict[str, float]] = []
    guard.push = pushed.append
    guard.settle(NOW)
    assert pushed == [{"foe": BLOCKED_APP_SCORE}]
    guard.settle(NOW + 1)
    assert len(pushed) == 1  # nothing changed and push_every_s not reached
    guard.record("liar", "forged_reward", NOW + 1, n=4)  # -20: graylisted, pushed at once
    guard.settle(NOW + 1)
    assert pushed[-1] == {"foe": BLOCKED_APP_SCORE, "liar": BLOCKED_APP_SCORE}
    assert guard.blocked("foe") and guard.blocked("liar")


def test_ingest_refuses_a_flood_before_any_work(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    calls: list[str] = []
    real = ingest_module.accept_external

    def counting(*args: object, **kwargs: object) -> object:
        calls.append(str(args[1]))
        return real(*args, **kwargs)  # type: ignore[arg-type]
    monkeypatch.setattr(ingest_module, "accept_external", counting)
    budget = PeerBudget(BudgetParams(share=0.2, burst_s=1.0, window_s=60.0))
    guard = PeerGuard(Reputation(PARAMS), budget, NodeStats())
    clock = iter(x * 0.25 for x in range(10_000))  # every re-score "costs" 250 ms
    stats = NodeStats()
    ingest = Ingest(CTX, stats, guard=guard, cost_clock=lambda: next(clock))
    group = wire(completion("6", 1.0), completion("7", 0.0), sender="flood")
    honest = wire(completion("6", 1.0), completion("7", 0.0), sender="honest")
    kept: list[str] = []
    sink = lambda ext, sender: kept.append(sender) or []  # noqa: E731
    flood = [Received("flood", NOW, group)] * 100 + [Received("honest", NOW, honest)]
    dropped = ingest(flood, NOW, sink)
    assert calls.count("flood") == 5  # a 1 s burst: 4 groups down to 0, the 5th (admitted at 0) into debt
    assert dropped["peer_budget"] == 95 and stats.dropped["peer_budget"] == 95
    assert ingest.peer_drops[("flood", "peer_budget")] == 95
    assert kept.count("honest") == 1  # the honest peer keeps its share
    assert guard.reputation.score("flood", NOW) == pytest.approx(5 * 0.05 - 95 * 0.1)
    assert guard.reputation.score("honest", NOW) == pytest.approx(0.05)


def test_ingest_counts_forged_rewards_against_the_sender(tmp_path: Path) -> None:
    guard = PeerGuard(Reputation(PARAMS), None, NodeStats())
    ingest = Ingest(CTX, NodeStats(), guard=guard)
    forged = wire(completion("6", 0.0), completion("7", 1.0), sender="liar")  # rewards swapped
    for _ in range(4):
        ingest([Received("liar", NOW, forged)], NOW, lambda ext, sender: [])
    assert guard.reputation.state("liar", NOW) == GRAYLISTED  # 4 x -5
    assert guard.blocked("liar")
    before = ingest.stats.groups["received"]
    ingest([Received("liar", NOW, forged)], NOW, lambda ext, sender: [])
    assert ingest.stats.dropped["graylisted"] == 1 and ingest.stats.groups["received"] == before + 1
