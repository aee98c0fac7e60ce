"""The embedded model's recipes by name: the old one keeps its key (earlier results reproduce), the new default builds
a Qwen2.5-shaped directory that a node prompts in think-answer, with its own generation budget."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

import pytest

from swarm_node import tasks, variants
from swarm_node.config import load_config
from swarm_node.errors import ConfigError
from swarm_node.model.char_recipe import CharRecipe
from swarm_node.model.default_model import ensure_default_model, load_model, model_dir, own_budget
from swarm_node.model.prompting import build_prompter, default_format
from swarm_node.model.recipe_mixes import REASONING_MIX, SMALL_MIX
from swarm_node.model.recipes import DEFAULT_RECIPE, MODEL_RECIPES
from swarm_node.model.think_recipe import ThinkRecipe, in_validation, training_draw, training_instances
from swarm_node.node.build import FALLBACK_MAX_NEW_TOKENS, model_sampling, with_model_defaults
from swarm_node.tasks.traces import think_answer_completion

# The key of the embedded model before recipes had names (commit a34050c): its cache directory must not move.
CHAR_ANSWER_LINE_V1_KEY = "84642fd35f52"
# A tiny variant of the default recipe: the same code path, built in seconds.
TINY_THINK = ThinkRecipe(hidden_size=32, layers=1, heads=2, kv_heads=1, intermediate_size=64, warmup_steps=2,
                         warmup_batch=4)


def test_both_recipes_resolve_by_name_and_the_new_one_is_the_default() -> None:
    assert sorted(MODEL_RECIPES) == sorted(variants.MODEL_RECIPES)
    assert DEFAULT_RECIPE == "bpe-think-answer-v2" == load_config().model.recipe
    assert isinstance(MODEL_RECIPES["bpe-think-answer-v2"], ThinkRecipe)
    assert isinstance(MODEL_RECIPES["char-answer-line-v1"], CharRecipe)
    assert MODEL_RECIPES["char-answer-line-v1"].task_mix() is SMALL_MIX
    assert MODEL_RECIPES["bpe-think-answer-v2"].task_mix() is REASONING_MIX


def test_the_old_recipe_keeps_its_key_and_the_keys_differ() -> None:
    old, new = MODEL_RECIPES["char-answer-line-v1"].key(), MODEL_RECIPES["bpe-think-answer-v2"].key()
    assert old == CHAR_ANSWER_LINE_V1_KEY
    assert new != old
    assert model_dir("char-answer-line-v1").name == f"default-{CHAR_ANSWER_LINE_V1_KEY}"
    assert replace(ThinkRecipe(), warmup_steps=1).key() != new  # any setting is part of the key


def test_the_old_mix_is_the_small_one_and_the_new_mix_the_reasoning_one() -> None:
    assert [(m["name"], m["options"]) for m in SMALL_MIX][2:] == [
        ("gcd", {"min_value": 1, "max_value": 30}), ("count_bits", {"min_n": 1, "max_n": 255})]
    assert [m["options"] for m in REASONING_MIX] == [
        {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 2},
        {"min_terms": 2, "max_terms": 2, "min_digits": 2, "max_digits": 2, "operators": ["+", "-", "*"],
         "allow_parentheses": False, "allow_negation": False},
        {"min_value": 1, "max_value": 1000}, {"min_n": 1, "max_n": 65535}]


def test_an_unknown_recipe_is_one_config_line() -> None:
    with pytest.raises(ConfigError, match="^model.recipe 'nope' unknown; choose one of bpe-think-answer-v2, "
                                          "char-answer-line-v1$"):
        load_config(overrides={"model.recipe": "nope"})
    assert load_config(overrides={"model.recipe": "char-answer-line-v1"}).model.recipe == "char-answer-line-v1"


def test_the_warm_up_draws_neither_test_nor_validation_problems() -> None:
    source = tasks.TaskSource(seed=3, selection="balanced", mix=REASONING_MIX)
    insts = training_instances(source, random.Random(0), 200)
    assert len(insts) == 200
    assert all(tasks.bucket(i.ref.dataset, i.question) >= tasks.SPLITS["validation"].stop for i in insts)
    assert tasks.SPLITS["validation"] == range(tasks.EVAL_PERCENT, 20)
    assert not any(in_validation(i) for i in insts)


def test_the_trace_style_and_rope_theta_reach_the_tokenizer_the_warm_up_and_the_config() -> None:
    assert ThinkRecipe().trace_style == "digit-columns" and ThinkRecipe().rope_theta == 10_000.0
    first = replace(TINY_THINK, trace_style="per-operation", rope_theta=1_000_000.0)  # the first recipe's settings
    assert first.key() != TINY_THINK.key()
    model, tokenizer = TINY_THINK.untrained()
    assert model.config.rope_parameters["rope_theta"] == 10_000.0
    assert first.untrained()[0].config.rope_parameters["rope_theta"] == 1_000_000.0
    assert tokenizer.get_vocab() != first.tokenizer().get_vocab()  # its corpus has the column traces
    prompter = build_prompter("think-answer", tokenizer)
    source = tasks.TaskSource(seed=3, selection="balanced", mix=REASONING_MIX)
    example = training_draw(tokenizer, source, prompter, "digit-columns")(random.Random(0), 1)[0]
    inst = training_instances(tasks.TaskSource(seed=3, selection="balanced", mix=REASONING_MIX), random.Random(0), 1)[0]
    assert tokenizer.decode(list(example.completion_ids[:-1])) == think_answer_completion(inst, "digit-columns")
    assert TINY_THINK.facts()["trace_style"] == "digit-columns"


@pytest.fixture(scope="module")
def tiny_think_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cache = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SWARM_NODE_CACHE", str(cache))
        path = ensure_default_model(recipe=TINY_THINK)
        assert path == cache / "models" / f"default-{TINY_THINK.key()}"
        assert ensure_default_model(recipe=TINY_THINK) == path  # built once, then reused
    return path


def test_the_new_model_directory_is_shaped_like_qwen2_5_instruct(tiny_think_dir: Path) -> None:
    names = {p.name for p in tiny_think_dir.iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "swarm_node_recipe.json"} <= names
    model, tokenizer = load_model(tiny_think_dir)
    im_end, endoftext = tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    generation = json.loads((tiny_think_dir / "generation_config.json").read_text())
    assert generation["eos_token_id"] == [im_end, endoftext]
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    assert json.loads((tiny_think_dir / "config.json").read_text())["architectures"] == ["Qwen2ForCausalLM"]
    assert tokenizer.chat_template and "<|im_start|>" in tokenizer.chat_template
    ids = tokenizer.encode("gcd of 987 and 610 = 1", add_special_tokens=False)
    digits = [tokenizer.decode([i]) for i in ids if any(c.isdigit() for c in tokenizer.decode([i]))]
    assert [d.strip() for d in digits] == list("9876101")
    facts = json.loads((tiny_think_dir / "swarm_node_recipe.json").read_text())
    assert facts["recipe"] == "bpe-think-answer-v2" and facts["prompt_format"] == "think-answer"
    assert own_budget(tiny_think_dir) == TINY_THINK.max_new_tokens == facts["max_new_tokens"]


def test_a_node_prompts_the_new_model_in_think_answer_as_its_warm_up_did(tiny_think_dir: Path) -> None:
    _, loaded = load_model(tiny_think_dir)
    assert default_format(loaded) == "think-answer"
    built = TINY_THINK.tokenizer()
    inst = tasks.instance(tasks.TaskSource(seed=1, mix=REASONING_MIX).draw(random.Random(1), 1)[0])
    ids = build_prompter("", loaded).ids(inst)
    assert ids == build_prompter("think-answer", built).ids(inst)
    assert loaded.decode(ids).endswith("<|im_start|>assistant\n")


def test_a_node_takes_the_models_own_budget_unless_given_one(tiny_think_dir: Path, tmp_path: Path) -> None:
    cfg = load_config()
    assert cfg.sampler.max_new_tokens == 0  # the model's own
    assert with_model_defaults(cfg, tiny_think_dir).sampler.max_new_tokens == TINY_THINK.max_new_tokens
    assert with_model_defaults(cfg, tmp_path).sampler.max_new_tokens == FALLBACK_MAX_NEW_TOKENS == 8  # declares none
    given = load_config(overrides={"sampler.max_new_tokens": 32})
    assert with_model_defaults(given, tiny_think_dir).sampler.max_new_tokens == 32
    (tmp_path / "swarm_node_recipe.json").write_text(json.dumps(CharRecipe().facts()))
    assert own_budget(tmp_path) == 8


def test_a_node_samples_at_the_models_own_temperature_and_top_p_unless_given(tiny_think_dir: Path,
                                                                          tmp_path: Path) -> None:
    """As transformers and vLLM do by default: the generation config's values (the embedded model is shaped like
    Qwen2.5-Instruct: 0.7 and 0.8); a model that sets none, or sets one [sampler] cannot take, samples at 1.0."""
    cfg = load_config()
    assert (cfg.sampler.temperature, cfg.sampler.top_p) == (None, None)
    assert json.loads((tiny_think_dir / "generation_config.json").read_text())["temperature"] == 0.7
    filled = with_model_defaults(cfg, tiny_think_dir).sampler
    assert (filled.temperature, filled.top_p) == (0.7, 0.8)
    given = with_model_defaults(load_config(overrides={"sampler.temperature": 1.0}), tiny_think_dir).sampler
    assert (given.temperature, given.top_p) == (1.0, 0.8)
    assert with_model_defaults(cfg, tmp_path).sampler.temperature_top_p() == (1.0, 1.0)  # no generation config
    (tmp_path / "generation_config.json").write_text(json.dumps({"temperature": 0.0, "top_p": 0.95}))
    assert model_sampling(tmp_path) == {"top_p": 0.95}  # temperature 0 means greedy there: not a sampling setting
    assert with_model_defaults(cfg, tmp_path).sampler.temperature_top_p() == (1.0, 0.95)
    assert cfg.sampler.temperature_top_p() == (1.0, 1.0)  # a config not resolved against a model (tests, tools)
