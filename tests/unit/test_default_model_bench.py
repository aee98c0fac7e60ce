"""bench.default_model's sweep input: variants by name, settings cast to each field's type, unknown settings and
repeated names refused before anything is built, and the prepared sweep holds the default recipe itself."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.default_model import load_variants, parse_settings, with_settings
from swarm_node.model.recipes import MODEL_RECIPES

PREPARED = Path(__file__).parents[2] / "bench" / "recipe_variants.json"


def test_command_line_settings_are_cast_to_the_fields_types() -> None:
    recipe = with_settings("bpe-think-answer-v2", parse_settings(["warmup_steps=400", "warmup_lr=0.005",
                                                                  "trace_style=per-operation"]))
    assert (recipe.warmup_steps, recipe.warmup_lr, recipe.trace_style) == (400, 0.005, "per-operation")
    assert with_settings("bpe-think-answer-v2", {"rope_theta": 10000}).rope_theta == 10000.0


def test_an_unknown_setting_is_refused_with_the_fields() -> None:
    with pytest.raises(SystemExit, match="^error: recipe 'bpe-think-answer-v2' has no setting 'depth'; it has "):
        with_settings("bpe-think-answer-v2", {"depth": 3})


def test_repeated_variant_names_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "v.json"
    path.write_text(json.dumps([{"name": "a", "set": {}}, {"name": "a", "set": {"layers": 3}}]))
    with pytest.raises(SystemExit, match="variant names repeat"):
        load_variants(path)


def test_the_prepared_sweep_is_valid_and_holds_the_default() -> None:
    variants = dict(load_variants(PREPARED))
    keys = {name: with_settings("bpe-think-answer-v2", changes).key() for name, changes in variants.items()}
    assert keys["h64-l2-steps1800-batch16-default"] == MODEL_RECIPES["bpe-think-answer-v2"].key()
    assert len(set(keys.values())) == len(keys)  # no two variants build the same model
    first = with_settings("bpe-think-answer-v2", variants["first-recipe"])
    assert (first.hidden_size, first.layers, first.warmup_steps, first.trace_style) == (128, 4, 300, "per-operation")
