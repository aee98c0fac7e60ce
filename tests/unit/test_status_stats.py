"""NodeStats peer bookkeeping (the methods the status API reads through snapshot())."""

from __future__ import annotations

import pytest

from swarm_node.status.stats import NodeStats


def test_peers_are_added_updated_counted_and_removed() -> None:
    stats = NodeStats()
    stats.upsert_peer("a", latency_ms=10.0)
    stats.upsert_peer("a", score=0.5)
    stats.count_peer_message("a", accepted=True, n=3)
    stats.count_peer_message("a", accepted=False)
    stats.count_peer_message("b", accepted=False, n=2)  # unseen peer: added
    assert stats.snapshot()["peers"] == [
        {"peer_id": "a", "latency_ms": 10.0, "accepted": 3, "rejected": 1, "score": 0.5, "state": "ok"},
        {"peer_id": "b", "latency_ms": None, "accepted": 0, "rejected": 2, "score": 0.0, "state": "ok"},
    ]
    stats.remove_peer("a")
    stats.remove_peer("never-seen")
    assert [p["peer_id"] for p in stats.snapshot()["peers"]] == ["b"]


def test_upsert_peer_rejects_unknown_fields_without_adding_the_peer() -> None:
    stats = NodeStats()
    with pytest.raises(AttributeError, match="nickname"):
        stats.upsert_peer("a", score=1.0, nickname="x")
    assert stats.snapshot()["peers"] == []
