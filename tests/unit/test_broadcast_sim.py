"""simulations.broadcast_sim: exact virtual times for small hand-computed cases (1 MiB chunks, B = 1 MiB/s)."""

from __future__ import annotations

import pytest

from simulations.broadcast_sim import simulate

MIB = 1 << 20


@pytest.mark.parametrize(("spec", "n", "expected"), [
    ("chain", 1, {"r0": 4.0}),  # 4 chunks at 1 s each
    ("chain", 2, {"r0": 4.0, "r1": 5.0}),  # r1 trails r0 by one chunk
    ("star", 2, {"r0": 8.0, "r1": 8.0}),  # the source's uplink split in two
    ("tree:2", 2, {"r0": 8.0, "r1": 8.0}),  # a binary tree over two receivers is the star
    # Two stripes: the source sends chunks 0 and 1 at half rate each (2 s), then 2 and 3 while r0 and r1 swap
    # 0 and 1 (each downlink then carries two flows at half rate: 4 s), then they swap 2 and 3 (5 s).
    ("stripe:2", 2, {"r0": 5.0, "r1": 5.0}),
])
def test_hand_computed_times(spec: str, n: int, expected: dict[str, float]) -> None:
    result = simulate(spec, n, 4 * MIB, MIB)
    assert result.done_at == pytest.approx(expected) and result.failed == {}
    assert result.finish_s == pytest.approx(max(expected.values()))


def test_latency_adds_once_for_the_request_and_once_for_the_last_chunk() -> None:
    assert simulate("chain", 1, 4 * MIB, MIB, latency_s=0.1).done_at == {"r0": pytest.approx(4.2)}


def test_killed_relay_its_child_falls_back_to_the_source() -> None:
    # chain s -> r0 -> r1 -> r2; r0 dies at 1.5 s while sending chunk 0 to r1. r1 pulls all 4 chunks from the
    # source alone (1.5 -> 5.5 s); r2, one chunk behind r1, finishes at 6.5 s.
    result = simulate("chain", 3, 4 * MIB, MIB, kill={"r0": 1.5})
    assert result.done_at == pytest.approx({"r1": 5.5, "r2": 6.5})
    assert result.finish_s == float("inf")  # r0 never finishes
    assert result.sent == {"s": 5 * MIB, "r0": 0, "r1": 4 * MIB, "r2": 0}


def test_corrupting_relay_is_detected_and_its_chunks_pulled_from_the_source() -> None:
    # r0 serves chunk 0 corrupted at 2 s; r1 drops r0 and pulls all 4 from the source, which shares its uplink
    # with r0's chunks 2-3 until 6 s, then sends r1's last two alone: r1 done at 8 s.
    result = simulate("chain", 2, 4 * MIB, MIB, corrupt={"r0"})
    assert result.done_at == pytest.approx({"r0": 6.0, "r1": 8.0})
    assert result.sent == {"s": 8 * MIB, "r0": MIB, "r1": 0}


def test_stripes_keep_32_receivers_near_the_bound_where_a_star_is_32_times_it() -> None:
    bound = 64 / 8  # 64 MiB at 8 MiB/s
    striped = simulate("stripe:2", 32, 64 * MIB, 8 * MIB, latency_s=0.02).finish_s
    star = simulate("star", 32, 64 * MIB, 8 * MIB, latency_s=0.02).finish_s
    assert bound < striped < 1.2 * bound
    assert star == pytest.approx(32 * bound, rel=1e-3)
