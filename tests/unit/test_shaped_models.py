"""Model directories shaped like Qwen2.5-Instruct and Llama-3-Instruct: they load with `load_model`, and their
tokenizers, templates, EOS lists, embeddings and pad tokens are what the real families ship."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from swarm_node.model.bpe import build_bpe_tokenizer, trained_core
from swarm_node.model.default_model import load_model, load_tokenizer
from swarm_node.model.shapes import SHAPES, SIZES, build_shaped_model_dir, shaped_config, shaped_tokenizer


@pytest.fixture(scope="module")
def shaped_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("shaped")
    return {name: build_shaped_model_dir(name, root / name) for name in SHAPES}


def loaded(shaped_dirs: dict[str, Path], name: str) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    return load_model(shaped_dirs[name])


def test_directories_are_whole(shaped_dirs: dict[str, Path]) -> None:
    for name, path in shaped_dirs.items():
        assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                "tokenizer_config.json"} <= {p.name for p in path.iterdir()}, name
    assert json.loads((shaped_dirs["qwen2.5-instruct"] / "config.json").read_text())["architectures"] == [
        "Qwen2ForCausalLM"]
    assert json.loads((shaped_dirs["llama-3-instruct"] / "config.json").read_text())["architectures"] == [
        "LlamaForCausalLM"]


def test_digits_are_single_tokens(shaped_dirs: dict[str, Path]) -> None:
    for name in SHAPES:
        tokenizer = load_tokenizer(shaped_dirs[name])
        ids = tokenizer.encode("Calculate 1234 + 56.", add_special_tokens=False)
        pieces = [tokenizer.decode([i]) for i in ids]
        assert [p.strip() for p in pieces if p.strip().isdigit()] == ["1", "2", "3", "4", "5", "6"], name
        assert all(len(p.strip()) == 1 for p in pieces if any(c.isdigit() for c in p)), name
        assert tokenizer.decode(ids) == "Calculate 1234 + 56."


def test_qwen_shape(shaped_dirs: dict[str, Path]) -> None:
    path = shaped_dirs["qwen2.5-instruct"]
    model, tokenizer = load_model(path)
    im_end, endoftext = tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    generation = json.loads((path / "generation_config.json").read_text())
    assert generation["eos_token_id"] == [im_end, endoftext]
    assert generation["repetition_penalty"] == 1.1
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    assert tokenizer.bos_token is None
    assert tokenizer.encode("hi", add_special_tokens=True) == tokenizer.encode("hi", add_special_tokens=False)
    rows = model.get_input_embeddings().weight.shape[0]
    assert rows > len(tokenizer) and rows % 64 == 0  # padded embedding: rows no token uses
    assert model.config.tie_word_embeddings
    assert model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "Calculate 4 - 1."}], tokenize=False,
                                             add_generation_prompt=True)
    assert rendered == ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
                        "<|im_start|>user\nCalculate 4 - 1.<|im_end|>\n<|im_start|>assistant\n")


def test_llama_shape(shaped_dirs: dict[str, Path]) -> None:
    path = shaped_dirs["llama-3-instruct"]
    tokenizer = load_tokenizer(path)
    assert tokenizer.pad_token is None  # as Llama 3 ships (load_model then pads with EOS)
    bos, end_of_text, eom, eot = tokenizer.convert_tokens_to_ids(
        ["<|begin_of_text|>", "<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"])
    generation = json.loads((path / "generation_config.json").read_text())
    assert generation["eos_token_id"] == [end_of_text, eom, eot]
    assert "pad_token_id" not in generation
    assert tokenizer.eos_token == "<|eot_id|>" and tokenizer.bos_token_id == bos
    plain = tokenizer.encode("Calculate 4 - 1.", add_special_tokens=False)
    assert tokenizer.encode("Calculate 4 - 1.") == [bos, *plain]  # the post-processor adds BOS
    assert bos not in plain
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "Calculate 4 - 1."}], tokenize=False,
                                             add_generation_prompt=True, date_string="01 Jan 2026")
    assert rendered == ("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
                        "Cutting Knowledge Date: December 2023\nToday Date: 01 Jan 2026\n\n<|eot_id|>"
                        "<|start_header_id|>user<|end_header_id|>\n\nCalculate 4 - 1.<|eot_id|>"
                        "<|start_header_id|>assistant<|end_header_id|>\n\n")
    model, loaded_tokenizer = load_model(path)
    assert loaded_tokenizer.pad_token_id == eot
    assert not model.config.tie_word_embeddings
    assert model.get_output_embeddings().weight.data_ptr() != model.get_input_embeddings().weight.data_ptr()
    assert model.get_input_embeddings().weight.shape[0] == len(tokenizer)
    assert model.config.eos_token_id == [end_of_text, eom, eot]


def test_tokenizer_build_is_deterministic() -> None:
    spec = SHAPES["qwen2.5-instruct"].tokenizer
    first = build_bpe_tokenizer(spec)
    trained_core.cache_clear()  # train again, not from the cache
    assert build_bpe_tokenizer(spec).backend_tokenizer.to_str() == first.backend_tokenizer.to_str()
    assert len(first) == spec.learned_vocab + len(spec.special_tokens)
    assert first.convert_tokens_to_ids("<|endoftext|>") == spec.learned_vocab  # specials follow the learned vocab


def test_real_size_config_has_qwen_dimensions() -> None:
    tokenizer = shaped_tokenizer("qwen2.5-instruct")
    config = shaped_config("qwen2.5-instruct", SIZES["qwen2.5-0.5b"], tokenizer)
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads,
            config.intermediate_size, config.vocab_size) == (896, 24, 14, 2, 4864, 151936)
    assert config.tie_word_embeddings
