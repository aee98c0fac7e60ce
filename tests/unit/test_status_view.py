"""The bounded JSON view of a snapshot: strict JSON, clipped strings, bounded lists, history and peers."""

from __future__ import annotations

import json

from swarm_node.status.view import (
    MAX_DEPTH,
    MAX_HISTORY,
    MAX_KEYS,
    MAX_LIST,
    MAX_PEERS,
    MAX_POINT_KEYS,
    MAX_STR,
    clean,
    clean_point,
    status_view,
)


def test_clean_makes_non_finite_floats_null_and_keeps_exact_values() -> None:
    assert clean({"a": float("nan"), "b": float("inf"), "c": -float("inf"), "d": 0.1, "e": 3, "f": True,
                  "g": None}) == {"a": None, "b": None, "c": None, "d": 0.1, "e": 3, "f": True, "g": None}


def test_clean_bounds_strings_lists_mappings_and_depth() -> None:
    assert clean("x" * (MAX_STR + 5)) == "x" * MAX_STR
    assert clean(list(range(MAX_LIST + 5))) == list(range(MAX_LIST))
    assert len(clean({f"k{i}": i for i in range(MAX_KEYS + 5)})) == MAX_KEYS
    nested: object = "leaf"
    for _ in range(MAX_DEPTH + 2):
        nested = [nested]
    out = clean(nested)
    for _ in range(MAX_DEPTH):
        out = out[0]
    assert out is None  # cut at MAX_DEPTH


def test_clean_converts_foreign_scalars() -> None:
    class Scalar:  # like a numpy or torch scalar
        def __float__(self) -> float:
            return 2.5

    class Opaque:
        def __str__(self) -> str:
            return "opaque"

    assert clean(Scalar()) == 2.5
    assert clean(Opaque()) == "opaque"
    assert clean((1, 2)) == [1, 2]


def test_clean_point_keeps_scalars_only() -> None:
    point = {"step": 3, "reward_mean": 0.5, "name": "x", "tensor": [1, 2], "nested": {"a": 1}, "nan": float("nan")}
    assert clean_point(point) == {"step": 3, "reward_mean": 0.5, "name": "x", "nan": None}
    assert len(clean_point({f"k{i}": i for i in range(MAX_POINT_KEYS + 10)})) == MAX_POINT_KEYS


def test_status_view_truncates_history_and_peers() -> None:
    snapshot = {
        "phase": "training",
        "history": [{"step": i} for i in range(MAX_HISTORY + 100)],
        "peers": [{"peer_id": f"p{i:03d}", "score": float("nan")} for i in reversed(range(MAX_PEERS + 3))],
    }
    view = status_view(snapshot)
    assert [p["step"] for p in view["history"]] == list(range(100, MAX_HISTORY + 100))  # the newest points
    assert [p["peer_id"] for p in view["peers"]] == [f"p{i:03d}" for i in range(MAX_PEERS)]
    assert view["peers"][0]["score"] is None
    assert view["peers_total"] == MAX_PEERS + 3
    assert view["phase"] == "training"
    json.dumps(view, allow_nan=False)  # strict JSON, or this raises
    assert status_view(snapshot, max_history=2)["history"] == [{"step": MAX_HISTORY + 98}, {"step": MAX_HISTORY + 99}]
    assert status_view(snapshot, max_history=0)["history"] == []


def test_flagged_peers_come_first_so_the_bound_never_hides_them() -> None:
    peers = [{"peer_id": f"p{i:03d}", "score": 0.0, "state": "ok"} for i in range(MAX_PEERS + 10)]
    peers += [{"peer_id": "zz-banned", "score": -60.0, "state": "banned"},
              {"peer_id": "zz-gray", "score": -25.0, "state": "graylisted"},
              {"peer_id": "zz-denied", "score": 0.0, "state": "denied"},
              {"peer_id": "zz-allowed", "score": -99.0, "state": "allowed"}]
    view = status_view({"peers": peers})
    assert [p["peer_id"] for p in view["peers"][:4]] == ["zz-banned", "zz-denied", "zz-gray", "p000"]
    assert [p["state"] for p in view["peers"][:3]] == ["banned", "denied", "graylisted"]
    assert len(view["peers"]) == MAX_PEERS and view["peers_total"] == MAX_PEERS + 14
