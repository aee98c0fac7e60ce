"""Shared fixtures: small seeded models built once per test session (no hub, no warm-up)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from swarm_node.model.char_recipe import CharRecipe, random_qwen2, warm_up
from swarm_node.model.tokenizer import build_char_tokenizer

TINY_RECIPE = CharRecipe(hidden_size=64, layers=2, heads=4, kv_heads=2, intermediate_size=128, max_positions=256)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ~0.1M-parameter Qwen2 with the char tokenizer and seeded random weights, as an HF directory."""
    path = tmp_path_factory.mktemp("tiny-model")
    tokenizer = build_char_tokenizer()
    random_qwen2(tokenizer, TINY_RECIPE, seed=0).save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return path


WARM_TINY_RECIPE = CharRecipe(hidden_size=64, layers=2, heads=2, kv_heads=1, intermediate_size=128,
                              max_positions=256, warmup_steps=150, warmup_batch=32, warmup_lr=1e-2)


@pytest.fixture(scope="session")
def warm_tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen2 warmed up for ~10 s on the default task: a few percent right, so GRPO groups have signal."""
    path = tmp_path_factory.mktemp("warm-tiny-model")
    tokenizer = build_char_tokenizer()
    model = random_qwen2(tokenizer, WARM_TINY_RECIPE, seed=0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # deterministic and quick on a busy machine
    try:
        warm_up(model, tokenizer, WARM_TINY_RECIPE, None)
    finally:
        torch.set_num_threads(threads)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return path
