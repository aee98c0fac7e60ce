"""`char-answer-line-v1`: the embedded model until November 2026, kept buildable to reproduce earlier results.

A ~1.6M-parameter Qwen2 with the character tokenizer of `tokenizer.py`, warmed up supervised on prompt -> answer
(answer-line, 8 new tokens) over `recipe_mixes.SMALL_MIX`. Its cache key is the one it always had: the recipe's
fields, that mix and the held-out percentage (`CharRecipe.key`).
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase, Qwen2Config, Qwen2ForCausalLM

from swarm_node import tasks
from swarm_node.model.recipe_mixes import SMALL_MIX
from swarm_node.model.tokenizer import build_char_tokenizer

ProgressFn = Callable[[int, int, str], None]
ANSWER_LINE_BUDGET = 8  # new tokens: the answer and its EOS


@dataclass(frozen=True)
class CharRecipe:
    hidden_size: int = 192
    layers: int = 4
    heads: int = 6
    kv_heads: int = 2
    intermediate_size: int = 512
    max_positions: int = 256
    # On SMALL_MIX, 380 steps leave 10-50% held-out accuracy per specialty (docs/TASK_MIX.md): room for RL.
    warmup_steps: int = 380
    warmup_batch: int = 64
    warmup_lr: float = 3e-3
    seed: int = 1234
    task_seed: int = 987_654  # warm-up problems come from their own stream, not the RL or eval streams

    def key(self) -> str:
        """Names the cache directory: the recipe and the mix it is warmed up on."""
        # The warm-up skips held-out problems (tasks/heldout.py): a change of the partition is a new model.
        what = {**asdict(self), "mix": SMALL_MIX, "heldout_percent": tasks.EVAL_PERCENT}
        return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:12]

    def task_mix(self) -> tuple[dict[str, Any], ...]:
        return SMALL_MIX

    def facts(self) -> dict[str, Any]:
        """What `swarm_node_recipe.json` records besides the build time."""
        return {**asdict(self), "recipe": "char-answer-line-v1", "max_new_tokens": ANSWER_LINE_BUDGET}

    def build(self, path: Path, progress: ProgressFn | None) -> None:
        """Build, warm up and save the model and its tokenizer as a HF directory at `path`."""
        tokenizer = build_char_tokenizer()
        model = random_qwen2(tokenizer, self, self.seed)
        torch.manual_seed(self.seed)
        warm_up(model, tokenizer, self, progress)
        model.save_pretrained(path, safe_serialization=True)
        tokenizer.save_pretrained(path)


def random_qwen2(tokenizer: PreTrainedTokenizerBase, recipe: CharRecipe, seed: int) -> Qwen2ForCausalLM:
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=recipe.hidden_size, num_hidden_layers=recipe.layers,
        num_attention_heads=recipe.heads, num_key_value_heads=recipe.kv_heads,
        intermediate_size=recipe.intermediate_size, max_position_embeddings=recipe.max_positions,
        tie_word_embeddings=True, bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, rope_theta=10000.0,
    )
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config)


def warm_up(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, recipe: CharRecipe,
            progress: ProgressFn | None) -> None:
    """Supervised steps on prompt -> answer + EOS over SMALL_MIX, loss on the answer tokens only.

    Every batch holds rows of every specialty (balanced draws), and each specialty's rows run as their own padded
    micro-batch, the loss summed over all answer tokens of the batch and divided by their count. Measured: batches of
    one specialty at a time make the model answer "1" to everything; mixed batches learn every specialty."""
    source = tasks.TaskSource(seed=recipe.task_seed, selection="balanced", mix=SMALL_MIX)
    rng = random.Random(recipe.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.warmup_lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=recipe.warmup_lr, total_steps=recipe.warmup_steps,
                                                pct_start=0.1)
    model.train()
    for step in range(recipe.warmup_steps):
        rows: dict[str, list[tuple[list[int], list[int]]]] = {}
        for ref in source.draw(rng, recipe.warmup_batch):
            inst = tasks.instance(ref)
            prompt = tokenizer.encode(inst.prompt)
            answer = tokenizer.encode(inst.answer) + [tokenizer.eos_token_id]
            rows.setdefault(ref.dataset, []).append((prompt + answer, [-100] * len(prompt) + answer))
        answer_tokens = sum(sum(t != -100 for t in labels) for group in rows.values() for _, labels in group)
        opt.zero_grad()
        total = 0.0
        for group in rows.values():
            width = max(len(seq) for seq, _ in group)
            ids = torch.tensor([seq + [tokenizer.pad_token_id] * (width - len(seq)) for seq, _ in group])
            lab = torch.tensor([labels + [-100] * (width - len(labels)) for _, labels in group])
            logits = model(input_ids=ids, attention_mask=(lab != -100) | (ids != tokenizer.pad_token_id)).logits
            loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)),
                                                     lab[:, 1:].reshape(-1), ignore_index=-100,
                                                     reduction="sum") / answer_tokens
            loss.backward()
            total += loss.item()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if progress is not None:
            progress(step + 1, recipe.warmup_steps, f"loss {total:.3f}")
    model.eval()
