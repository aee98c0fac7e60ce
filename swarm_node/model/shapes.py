"""Model directories shaped like real instruct models, built offline: `SHAPES` (by name) and `build_shaped_model_dir`.

A shape is what a real family's directory looks like around its weights: the architecture in config.json, the
tokenizer's special tokens, EOS and pad, its chat template, the EOS list and sampling defaults of
generation_config.json, tied or untied embeddings, embedding rows padded past the tokenizer's length. Sizes are
separate (`SIZES`): `tiny` for tests, `tiny-h32` the same with head size 32 (vLLM's CPU attention has no kernel
for `tiny`'s 16), `qwen2.5-0.5b` for real dimensions (random weights) in sizing runs.

- `qwen2.5-instruct`: Qwen2ForCausalLM, ChatML (<|im_start|>, <|im_end|>), EOS <|im_end|>, pad <|endoftext|>,
  generation EOS [<|im_end|>, <|endoftext|>], repetition_penalty 1.1, tied embeddings, padded embedding rows.
- `llama-3-instruct`: LlamaForCausalLM, BOS <|begin_of_text|> added on encode, header tokens, EOS <|eot_id|>,
  generation EOS [<|end_of_text|>, <|eom_id|>, <|eot_id|>], no pad token, untied embeddings, a template that prints
  `Today Date: {{ date_string }}` like Llama 3.1/3.2's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from transformers import (
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from swarm_node.model.bpe import BpeSpec, build_bpe_tokenizer

QWEN_CHAT_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if not (message['role'] == 'system' and loop.first) %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

LLAMA_CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- if not date_string is defined %}{%- set date_string = '26 Jul 2024' %}{%- endif %}"
    "{%- if messages[0]['role'] == 'system' %}"
    "{%- set system_message = messages[0]['content'] | trim %}{%- set messages = messages[1:] %}"
    "{%- else %}{%- set system_message = '' %}{%- endif %}"
    "{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}"
    "{{- 'Cutting Knowledge Date: December 2023\\n' }}"
    "{{- 'Today Date: ' + date_string + '\\n\\n' }}"
    "{{- system_message }}{{- '<|eot_id|>' }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}"
    "{{- message['content'] | trim + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)


@dataclass(frozen=True)
class ModelSize:
    hidden_size: int
    layers: int
    heads: int
    kv_heads: int
    intermediate_size: int
    max_positions: int
    vocab_rows: int | None = None  # embedding rows; None: the tokenizer's length padded to the shape's multiple


SIZES: dict[str, ModelSize] = {
    "tiny": ModelSize(hidden_size=64, layers=2, heads=4, kv_heads=2, intermediate_size=128, max_positions=512),
    "tiny-h32": ModelSize(hidden_size=64, layers=2, heads=2, kv_heads=1, intermediate_size=128, max_positions=512),
    # the embedded default model's dimensions (model/think_recipe.py), head size 32: the smallest that learns a task
    "small-h32": ModelSize(hidden_size=128, layers=4, heads=4, kv_heads=2, intermediate_size=384, max_positions=512),
    # Qwen2.5-0.5B-Instruct's dimensions: the real memory and compute of a small production model.
    "qwen2.5-0.5b": ModelSize(hidden_size=896, layers=24, heads=14, kv_heads=2, intermediate_size=4864,
                              max_positions=32768, vocab_rows=151936),
}


@dataclass(frozen=True)
class ModelShape:
    config_class: type[PretrainedConfig]
    model_class: type[PreTrainedModel]
    tokenizer: BpeSpec
    generation_eos: tuple[str, ...]  # generation_config.json's eos_token_id list, in this order
    tie_embeddings: bool
    vocab_multiple: int  # embedding rows are padded to a multiple of this, always past the tokenizer's length
    config_eos_list: bool  # config.json's eos_token_id: the generation list (Llama 3.1) or the tokenizer's EOS
    generation_extra: dict[str, Any] = field(default_factory=dict)
    config_extra: dict[str, Any] = field(default_factory=dict)


SHAPES: dict[str, ModelShape] = {
    "qwen2.5-instruct": ModelShape(
        config_class=Qwen2Config, model_class=Qwen2ForCausalLM,
        tokenizer=BpeSpec(special_tokens=("<|endoftext|>", "<|im_start|>", "<|im_end|>"), eos_token="<|im_end|>",
                          pad_token="<|endoftext|>", chat_template=QWEN_CHAT_TEMPLATE),
        generation_eos=("<|im_end|>", "<|endoftext|>"), tie_embeddings=True, vocab_multiple=64,
        config_eos_list=False,
        generation_extra={"do_sample": True, "repetition_penalty": 1.1, "temperature": 0.7, "top_p": 0.8,
                          "top_k": 20},
        config_extra={"rope_theta": 1000000.0, "rms_norm_eps": 1e-6}),
    "llama-3-instruct": ModelShape(
        config_class=LlamaConfig, model_class=LlamaForCausalLM,
        tokenizer=BpeSpec(special_tokens=("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                                          "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>"),
                          eos_token="<|eot_id|>", bos_token="<|begin_of_text|>", pad_token=None,
                          chat_template=LLAMA_CHAT_TEMPLATE),
        generation_eos=("<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"), tie_embeddings=False, vocab_multiple=1,
        config_eos_list=True,
        generation_extra={"do_sample": True, "temperature": 0.6, "top_p": 0.9},
        config_extra={"rope_theta": 500000.0, "rms_norm_eps": 1e-5}),
}


def vocab_rows(shape: ModelShape, size: ModelSize, tokenizer_length: int) -> int:
    """Embedding rows: the size's own count, else the tokenizer's length rounded up past itself to the multiple
    (a multiple of 1 means exactly the tokenizer's length, as Llama 3 ships)."""
    if size.vocab_rows is not None:
        if size.vocab_rows < tokenizer_length:
            raise ValueError(f"{size.vocab_rows} embedding rows cannot hold {tokenizer_length} tokens")
        return size.vocab_rows
    if shape.vocab_multiple == 1:
        return tokenizer_length
    return (tokenizer_length // shape.vocab_multiple + 1) * shape.vocab_multiple


def shaped_tokenizer(shape_name: str, learned_vocab: int | None = None) -> PreTrainedTokenizerFast:
    spec = SHAPES[shape_name].tokenizer
    return build_bpe_tokenizer(spec if learned_vocab is None else replace(spec, learned_vocab=learned_vocab))


def shaped_config(shape_name: str, size: ModelSize, tokenizer: PreTrainedTokenizerFast,
                  extra: dict[str, Any] | None = None) -> PretrainedConfig:
    """The shape's config at `size`; `extra` overrides the shape's own extra settings (e.g. `rope_theta`)."""
    shape = SHAPES[shape_name]
    eos_ids = [tokenizer.convert_tokens_to_ids(tok) for tok in shape.generation_eos]
    bos_id = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.pad_token_id
    return shape.config_class(
        vocab_size=vocab_rows(shape, size, len(tokenizer)), hidden_size=size.hidden_size,
        num_hidden_layers=size.layers, num_attention_heads=size.heads, num_key_value_heads=size.kv_heads,
        intermediate_size=size.intermediate_size, max_position_embeddings=size.max_positions,
        tie_word_embeddings=shape.tie_embeddings, bos_token_id=bos_id,
        eos_token_id=eos_ids if shape.config_eos_list else tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, **{**shape.config_extra, **(extra or {})})


def build_shaped_model(shape_name: str, size: ModelSize | str = "tiny", *, seed: int = 0,
                       learned_vocab: int | None = None) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """A randomly initialised model of the shape and size with its tokenizer (deterministic from `seed`)."""
    size = SIZES[size] if isinstance(size, str) else size
    tokenizer = shaped_tokenizer(shape_name, learned_vocab)
    config = shaped_config(shape_name, size, tokenizer)
    torch.manual_seed(seed)
    return SHAPES[shape_name].model_class(config), tokenizer


def generation_config(shape_name: str, tokenizer: PreTrainedTokenizerFast) -> GenerationConfig:
    shape = SHAPES[shape_name]
    eos_ids = [tokenizer.convert_tokens_to_ids(tok) for tok in shape.generation_eos]
    bos_id = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.pad_token_id
    extra = {"pad_token_id": tokenizer.pad_token_id} if tokenizer.pad_token_id is not None else {}
    return GenerationConfig(bos_token_id=bos_id, eos_token_id=eos_ids, **extra, **shape.generation_extra)


def save_shaped_model_dir(shape_name: str, model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast,
                          path: Path) -> Path:
    """Write a whole HF directory: config.json, safetensors weights, tokenizer files, generation_config.json."""
    path.mkdir(parents=True, exist_ok=True)
    model.generation_config = generation_config(shape_name, tokenizer)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    (path / "swarm_node_shape.json").write_text(json.dumps({"shape": shape_name}))
    return path


def build_shaped_model_dir(shape_name: str, path: Path, size: ModelSize | str = "tiny", *, seed: int = 0,
                           learned_vocab: int | None = None) -> Path:
    """Build a random model of the shape and size and save it as a HF directory at `path`."""
    model, tokenizer = build_shaped_model(shape_name, size, seed=seed, learned_vocab=learned_vocab)
    return save_shaped_model_dir(shape_name, model, tokenizer, Path(path))
