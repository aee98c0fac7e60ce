"""Shared fixtures: small seeded models built once per test session (no hub, no warm-up)."""

from __future__ import annotations

from pathlib import Path

import pytest

from swarm_node.model import DefaultModelRecipe, random_qwen2
from swarm_node.tokenizer import build_char_tokenizer

TINY_RECIPE = DefaultModelRecipe(hidden_size=64, layers=2, heads=4, kv_heads=2, intermediate_size=128,
                                 max_positions=256)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ~0.1M-parameter Qwen2 with the char tokenizer and seeded random weights, as an HF directory."""
    path = tmp_path_factory.mktemp("tiny-model")
    tokenizer = build_char_tokenizer()
    random_qwen2(tokenizer, TINY_RECIPE, seed=0).save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return path
