"""protocol.relay: chunk layout, relay plans (hand-built trees), and the receiver state machine's actions."""

from __future__ import annotations

import hashlib

import pytest

from protocol.relay import (
    SCHEDULES,
    Cancel,
    Complete,
    Failed,
    Receiver,
    Request,
    ScheduleError,
    Stored,
    chunk_count_for,
    chunk_digests,
    chunk_span,
    make_plan,
    parse_schedule,
    split,
)

R7 = ("a", "b", "c", "d", "e", "f", "g")


def parents(spec: str, receivers: tuple[str, ...] = R7) -> list[dict[str, str]]:
    return [dict(p) for p in make_plan(spec, "S", receivers).parents]


# ------------------------------------------------------------------------------------------------------ layout
def test_even_split_layout() -> None:
    assert [chunk_span(10, 3, k) for k in range(3)] == [(0, 3), (3, 6), (6, 10)]
    assert [chunk_span(8, 8, k) for k in range(8)] == [(k, k + 1) for k in range(8)]
    assert chunk_count_for(64 << 20, 1 << 20) == 64
    assert chunk_count_for(1, 1 << 20) == 1
    assert chunk_count_for((1 << 20) + 1, 1 << 20) == 2
    payload = bytes(range(256)) * 4 + b"xyz"  # 1027 bytes in 4 chunks: 256, 257, 257, 257
    chunks = split(payload, 4)
    assert [len(c) for c in chunks] == [256, 257, 257, 257] and b"".join(chunks) == payload
    with pytest.raises(ValueError):
        chunk_span(3, 4, 0)  # more chunks than bytes
    with pytest.raises(ValueError):
        chunk_span(10, 3, 3)
    with pytest.raises(ValueError):
        chunk_count_for(0, 1 << 20)


# ---------------------------------------------------------------------------------------------------- schedules
def test_chain_tree_star_parents() -> None:
    assert parents("chain") == [{"a": "S", "b": "a", "c": "b", "d": "c", "e": "d", "f": "e", "g": "f"}]
    assert parents("tree:2") == [{"a": "S", "b": "S", "c": "a", "d": "a", "e": "b", "f": "b", "g": "c"}]
    assert parents("tree") == parents("tree:2")
    assert parents("tree:3") == [{"a": "S", "b": "S", "c": "S", "d": "a", "e": "a", "f": "a", "g": "b"}]
    assert parents("star") == [dict.fromkeys(R7, "S")]


def test_stripe_trees_make_each_node_interior_in_one_stripe() -> None:
    # stripe 0 orders a c e g | b d f, stripe 1 orders b d f | a c e g; each a binary heap under one source child.
    assert parents("stripe:2") == [
        {"a": "S", "c": "a", "e": "a", "g": "c", "b": "c", "d": "e", "f": "e"},
        {"b": "S", "d": "b", "f": "b", "a": "d", "c": "d", "e": "f", "g": "f"},
    ]
    plan = make_plan("stripe:2", "S", R7)
    assert plan.stripes == 2 and [plan.stripe(k) for k in range(5)] == [0, 1, 0, 1, 0]
    assert plan.ancestors("g", 0) == ("c", "a", "S") and plan.ancestors("g", 1) == ("f", "b", "S")
    assert plan.children("c", 0) == ("b", "g") and plan.children("c", 1) == ()
    assert plan.children("S", 0) == ("a",) and plan.children("S", 1) == ("b",)


@pytest.mark.parametrize("spec", ["chain", "tree:2", "tree:4", "star", "stripe:2", "stripe:3", "stripe:4"])
@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 13, 32])
def test_every_plan_is_a_forest_rooted_at_the_source(spec: str, n: int) -> None:
    receivers = tuple(f"r{i}" for i in range(n))
    plan = make_plan(spec, "S", receivers)
    for s in range(plan.stripes):
        assert set(plan.parents[s]) == set(receivers)
        for r in receivers:
            up = plan.ancestors(r, s)
            assert up[-1] == "S" and r not in up and len(set(up)) == len(up)


@pytest.mark.parametrize(("spec", "upload"), [("chain", 1.0), ("tree:2", 2.0), ("stripe:2", 1.0), ("stripe:4", 1.0)])
def test_upload_per_node_in_payloads(spec: str, upload: float) -> None:
    """What a receiver uploads, in payload sizes: stripe:f keeps every node at one payload (f children of one
    stripe of 1/f), a plain binary tree doubles it. N = 32, divisible by the fan-outs, so the shares are exact."""
    receivers = tuple(f"r{i}" for i in range(32))
    plan = make_plan(spec, "S", receivers)
    loads = {r: sum(len(plan.children(r, s)) for s in range(plan.stripes)) / plan.stripes for r in receivers}
    assert max(loads.values()) == upload
    assert sum(len(plan.children("S", s)) for s in range(plan.stripes)) / plan.stripes == (2.0 if spec == "tree:2"
                                                                                          else 1.0)


def test_schedule_specs_are_checked() -> None:
    assert parse_schedule("stripe:4") == ("stripe", 4) and parse_schedule("chain") == ("chain", None)
    assert sorted(SCHEDULES) == ["chain", "star", "stripe", "tree"]
    for bad in ("ring", "chain:2", "tree:0", "tree:x", "stripe:65", "stripe:-1", "stripe:２", ""):
        with pytest.raises(ScheduleError):
            parse_schedule(bad)
    for receivers in (("a", "a"), ("a", "S"), ()):
        with pytest.raises(ScheduleError):
            make_plan("chain", "S", receivers)


# ------------------------------------------------------------------------------------------ receiver machine
CHUNKS = [b"zero", b"one", b"two", b"three"]
HASHES = chunk_digests(CHUNKS)
DIGEST = hashlib.sha256(b"".join(CHUNKS)).digest()


def test_receiver_pulls_stripes_from_parents_and_recovers_from_bad_chunks_and_failures() -> None:
    rx = Receiver.in_plan(make_plan("stripe:2", "S", R7), "g", HASHES, DIGEST)
    # g's parents: c in stripe 0 (chunks 0, 2), f in stripe 1 (chunks 1, 3).
    assert rx.start() == [Request("c", (0, 2)), Request("f", (1, 3))]
    assert rx.on_chunk("c", 0, b"zero") == [Stored(0)]
    # f sends a corrupted chunk: dropped, and both chunks it owed move to f's parent b.
    assert rx.on_chunk("f", 1, b"oNe") == [Cancel("f"), Request("b", (1, 3))]
    assert rx.on_chunk("f", 3, b"three") == [Stored(3)]  # a verified chunk is good whoever sends it
    # c's stream breaks: chunk 2 moves to c's parent a.
    assert rx.on_peer_failed("c") == [Cancel("c"), Request("a", (2,))]
    assert rx.on_peer_failed("c") == []  # already dropped
    assert rx.on_chunk("a", 2, b"two") == [Stored(2)]
    assert rx.on_chunk("b", 1, b"one") == [Stored(1), Complete()]
    assert rx.on_chunk("b", 3, b"three") == []  # duplicate after completion
    assert rx.payload() == b"zeroonetwothree"
    assert (rx.stats.bad_chunks, rx.stats.failed_peers, rx.stats.reassigned, rx.stats.duplicates) == (1, 2, 3, 1)


def test_receiver_fails_without_a_live_holder_or_on_an_inconsistent_announce() -> None:
    rx = Receiver.in_plan(make_plan("chain", "S", ("a", "b")), "b", HASHES, DIGEST)
    assert rx.start() == [Request("a", (0, 1, 2, 3))]
    assert rx.on_peer_failed("a") == [Cancel("a"), Request("S", (0, 1, 2, 3))]
    assert rx.on_peer_failed("S") == [Cancel("S"), Failed("no live holder left for chunk 0")]
    assert rx.state == "failed" and rx.on_chunk("S", 0, b"zero") == []
    with pytest.raises(RuntimeError):
        rx.payload()
    # Chunk digests that do not add up to the payload digest: every chunk verifies, the whole does not.
    rx = Receiver.from_holders(["x"], HASHES, hashlib.sha256(b"other").digest())
    rx.start()
    actions = [a for k, c in enumerate(CHUNKS) for a in rx.on_chunk("x", k, c)]
    assert actions[-1] == Failed("payload_sha256_mismatch") and rx.state == "failed"


def test_late_joiner_spreads_chunks_over_holders_round_robin() -> None:
    rx = Receiver.from_holders(["x", "y", "z"], HASHES, DIGEST)
    assert rx.start() == [Request("x", (0, 3)), Request("y", (1,)), Request("z", (2,))]
    # y fails: chunk 1's candidates are y, z, x, so it moves to z.
    assert rx.on_peer_failed("y") == [Cancel("y"), Request("z", (1,))]
    assert rx.expected_from("z") == (1, 2) and rx.missing == 4
    assert rx.on_chunk("x", 7, b"junk") == [] and rx.on_chunk("x", -1, b"junk") == []  # out of range: ignored
    with pytest.raises(ValueError):
        Receiver.in_plan(make_plan("chain", "S", ("a",)), "zz", HASHES, DIGEST)
