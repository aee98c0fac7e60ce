"""`bpe-think-answer-v2`: the embedded default model, a small Qwen2 that writes its steps before its answer.

Shaped like the models users bring (`shapes.SHAPES["qwen2.5-instruct"]`): a byte-level BPE tokenizer trained offline
on the recipe's mix (digits one per token), ChatML chat template, special tokens, generation_config.json with its
EOS ids. Warmed up supervised (`warmup.supervised_warm_up`) on the verified think-answer traces of training problems
of `recipe_mixes.REASONING_MIX`, prompted exactly as a node prompts it (`prompting.build_prompter("think-answer")`:
the format the node picks for a model with a chat template). Training problems only: the warm-up skips the test
split and the validation split (`tasks.SPLITS`; the task source skips both, `training_instances` checks it), on
which the recipe's settings were chosen (docs/DEFAULT_MODEL.md). `max_new_tokens` is the model's own generation budget:
the longest trace of the mix in its tokens, plus a margin.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from swarm_node import tasks
from swarm_node.model.bpe import build_bpe_tokenizer
from swarm_node.model.prompting import Prompter, build_prompter
from swarm_node.model.recipe_mixes import REASONING_MIX
from swarm_node.model.shapes import QWEN_CHAT_TEMPLATE, SHAPES, ModelSize, save_shaped_model_dir, shaped_config
from swarm_node.model.warmup import DrawFn, WarmupExample, WarmupSettings, supervised_warm_up, think_answer_example

ProgressFn = Callable[[int, int, str], None]
SHAPE = "qwen2.5-instruct"
FORMAT = "think-answer"


@dataclass(frozen=True)
class ThinkRecipe:
    # Chosen on the validation split (docs/DEFAULT_MODEL.md): digit-column traces are learnt only past a sudden
    # drop of the loss (600-1,200 steps of 32 rows at hidden 128); a narrower model passes it (steps 700-900 of
    # 16 rows) within the CPU build budget because its steps cost a fifth.
    hidden_size: int = 64
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    intermediate_size: int = 256
    max_positions: int = 512
    learned_vocab: int = 384  # BPE: the byte alphabet (256) and merges, before the special tokens
    warmup_steps: int = 1800
    warmup_batch: int = 16
    warmup_lr: float = 3e-3
    max_new_tokens: int = 192  # the model's own generation budget (EOS included)
    rope_theta: float = 10_000.0  # the sweep's setting past 300 steps (Qwen2.5's 1e6 was not tried that long)
    trace_style: str = "digit-columns"  # how the warm-up's traces write their steps (tasks.traces.TRACE_STYLES)
    seed: int = 1234
    task_seed: int = 987_654  # warm-up problems come from their own stream, not the RL or eval streams

    def key(self) -> str:
        """Names the cache directory: the recipe, its mix, the shape's template and the format's system prompt."""
        validation = tasks.SPLITS["validation"]
        what = {**asdict(self), "mix": REASONING_MIX, "test_percent": tasks.EVAL_PERCENT,
                "validation": [validation.start, validation.stop], "shape": SHAPE, "format": FORMAT,
                "template": QWEN_CHAT_TEMPLATE, "system": tasks.THINK_ANSWER_SYSTEM}
        return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:12]

    def task_mix(self) -> tuple[dict[str, Any], ...]:
        return REASONING_MIX

    def facts(self) -> dict[str, Any]:
        """What `swarm_node_recipe.json` records besides the build time."""
        return {**asdict(self), "recipe": "bpe-think-answer-v2", "shape": SHAPE, "prompt_format": FORMAT}

    def size(self) -> ModelSize:
        return ModelSize(hidden_size=self.hidden_size, layers=self.layers, heads=self.heads, kv_heads=self.kv_heads,
                         intermediate_size=self.intermediate_size, max_positions=self.max_positions)

    def tokenizer(self) -> PreTrainedTokenizerFast:
        spec = replace(SHAPES[SHAPE].tokenizer, learned_vocab=self.learned_vocab,
                       corpus_mix=json.dumps(REASONING_MIX, sort_keys=True), corpus_system=tasks.THINK_ANSWER_SYSTEM,
                       corpus_trace_style=self.trace_style)
        return build_bpe_tokenizer(spec)

    def untrained(self) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
        """The randomly initialised model (seeded) and its tokenizer."""
        tokenizer = self.tokenizer()
        config = shaped_config(SHAPE, self.size(), tokenizer, {"rope_theta": self.rope_theta})
        torch.manual_seed(self.seed)
        return SHAPES[SHAPE].model_class(config), tokenizer

    def build(self, path: Path, progress: ProgressFn | None, device: str = "cpu") -> None:
        """Build, warm up (on the torch `device`) and save the model as a HF directory at `path`."""
        model, tokenizer = self.untrained()
        prompter = build_prompter(FORMAT, tokenizer, self.max_new_tokens)
        source = tasks.TaskSource(seed=self.task_seed, selection="balanced", mix=REASONING_MIX)
        settings = WarmupSettings(steps=self.warmup_steps, batch=self.warmup_batch, lr=self.warmup_lr, seed=self.seed)
        draw = training_draw(tokenizer, source, prompter, self.trace_style)
        supervised_warm_up(model.to(device), draw, settings, int(tokenizer.pad_token_id), progress)
        save_shaped_model_dir(SHAPE, model.to("cpu"), tokenizer, path)


def in_validation(inst: tasks.TaskInstance) -> bool:
    return tasks.in_split("validation", inst.ref.dataset, inst.question)


def training_instances(source: tasks.TaskSource, rng: random.Random, count: int) -> list[tasks.TaskInstance]:
    """`count` of `source`'s training draws (no test problem: the source skips them), validation problems skipped."""
    out: list[tasks.TaskInstance] = []
    while len(out) < count:
        insts = [tasks.instance(ref) for ref in source.draw(rng, count - len(out))]
        out.extend(inst for inst in insts if not in_validation(inst))
    return out


def training_draw(tokenizer: PreTrainedTokenizerFast, source: tasks.TaskSource, prompter: Prompter,
                  trace_style: str) -> DrawFn:
    """Warm-up examples of `training_instances`, prompted as a node prompts the model, traces in `trace_style`."""

    def draw(rng: random.Random, count: int) -> list[WarmupExample]:
        return [think_answer_example(tokenizer, inst, prompter.ids(inst), trace_style)
                for inst in training_instances(source, rng, count)]

    return draw
