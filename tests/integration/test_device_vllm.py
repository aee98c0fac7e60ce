"""vLLM's share of a GPU it shares with the trainer (sampler/vllm_sampler.py `gpu_memory_fraction`): pure arithmetic,
checked here on a CPU machine with hand-computed numbers."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")

from swarm_node.errors import UserError  # noqa: E402
from swarm_node.sampler.vllm_sampler import gpu_memory_fraction  # noqa: E402

GIB = 1 << 30


def test_fraction_is_weights_kv_and_reserve_over_the_card() -> None:
    # 1 GiB weights + 2 GiB KV + 1 GiB reserve = 4 GiB of an 80 GiB card: 0.05, not vLLM's default 0.9.
    assert gpu_memory_fraction(1 * GIB, 2 * GIB, 80 * GIB, 79 * GIB) == 0.05
    # 3 GiB + 1 GiB of a 24 GiB card: 4/24 = 0.1666.. rounded up to 0.167.
    assert gpu_memory_fraction(1 * GIB, 2 * GIB, 24 * GIB, 20 * GIB) == 0.167


def test_small_models_get_the_floor() -> None:
    # 6 MB + 128 MiB + 1 GiB = 1213959552 bytes of 80 GiB: 0.01413 -> 0.015, below the 0.02 floor.
    assert gpu_memory_fraction(6_000_000, 128 << 20, 80 * GIB, 80 * GIB) == 0.02


def test_more_than_is_free_is_one_line() -> None:
    with pytest.raises(UserError) as err:
        gpu_memory_fraction(1 * GIB, 2 * GIB, 24 * GIB, 2 * GIB)
    assert str(err.value) == ("vLLM needs 4096 MiB of the GPU (weights, KV cache, activations) but 2048 MiB are free; "
                              "lower --memory-budget or sampler kv_cache_gb")
