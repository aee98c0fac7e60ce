"""A reusable supervised warm-up: next-token loss on completion tokens only, over (prompt ids, completion ids) pairs.

`supervised_warm_up(model, draw, settings, pad_id)` runs `settings.steps` AdamW steps (one-cycle schedule, gradient
clip); each step asks `draw(rng, batch)` for examples. Examples of one `group` (a specialty) run as their own padded
micro-batch, and the loss is summed over every completion token of the step and divided by their count: mixed
batches that still pad little (the default model's warm-up measured that batches of one specialty at a time
collapse to one answer). Runs on the model's device (batches are built on the CPU and moved there). Deterministic
from `settings.seed` on one device.

`think_answer_draw(tokenizer, source, prompt_ids)` draws such examples from a `TaskSource`'s training problems (never
a held-out one: `TraceError` if one appears): the prompt is `prompt_ids(inst)` (the caller's: a chat template that
writes BOS itself is encoded without the tokenizer's own), the completion the verified think-answer trace, then the
tokenizer's EOS.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from swarm_node import tasks
from swarm_node.tasks.traces import DEFAULT_TRACE_STYLE, TraceError, think_answer_completion

ProgressFn = Callable[[int, int, str], None]


@dataclass(frozen=True)
class WarmupExample:
    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]  # the target, its EOS included
    group: str = ""  # examples of one group share a padded micro-batch


@dataclass(frozen=True)
class WarmupSettings:
    steps: int = 300
    batch: int = 32
    lr: float = 3e-3
    seed: int = 0
    warmup_fraction: float = 0.1  # one-cycle: share of steps spent raising the learning rate
    clip_norm: float = 1.0


DrawFn = Callable[[random.Random, int], list[WarmupExample]]


def completion_loss_sum(model: PreTrainedModel, examples: list[WarmupExample], pad_id: int) -> torch.Tensor:
    """Summed cross-entropy of the completion tokens of `examples`, right-padded into one batch."""
    rows = [list(ex.prompt_ids) + list(ex.completion_ids) for ex in examples]
    width = max(len(row) for row in rows)
    ids = torch.tensor([row + [pad_id] * (width - len(row)) for row in rows])
    labels = torch.tensor([[-100] * len(ex.prompt_ids) + list(ex.completion_ids)
                           + [-100] * (width - len(row)) for ex, row in zip(examples, rows, strict=True)])
    mask = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in rows])
    device = next(model.parameters()).device
    logits = model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits
    labels = labels.to(device)
    return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)), labels[:, 1:].reshape(-1),
                                             ignore_index=-100, reduction="sum")


def supervised_warm_up(model: PreTrainedModel, draw: DrawFn, settings: WarmupSettings, pad_id: int,
                       progress: ProgressFn | None = None) -> list[float]:
    """Train `model` in place; returns each step's mean loss per completion token. Leaves the model in eval mode."""
    torch.manual_seed(settings.seed)
    rng = random.Random(settings.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=settings.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=settings.lr, total_steps=settings.steps,
                                                pct_start=settings.warmup_fraction)
    losses: list[float] = []
    model.train()
    for step in range(settings.steps):
        groups: dict[str, list[WarmupExample]] = {}
        for ex in draw(rng, settings.batch):
            groups.setdefault(ex.group, []).append(ex)
        tokens = sum(len(ex.completion_ids) for group in groups.values() for ex in group)
        opt.zero_grad()
        total = 0.0
        for group in groups.values():
            loss = completion_loss_sum(model, group, pad_id) / tokens
            loss.backward()
            total += loss.item()
        torch.nn.utils.clip_grad_norm_(model.parameters(), settings.clip_norm)
        opt.step()
        sched.step()
        losses.append(total)
        if progress is not None:
            progress(step + 1, settings.steps, f"loss {total:.3f}")
    model.eval()
    return losses


def think_answer_example(tokenizer: PreTrainedTokenizerBase, inst: tasks.TaskInstance, prompt_ids: Sequence[int],
                         trace_style: str = DEFAULT_TRACE_STYLE) -> WarmupExample:
    """One training problem as a supervised example: `prompt_ids` -> its verified think-answer trace (written in
    `trace_style`, `traces.TRACE_STYLES`), then EOS."""
    if tasks.is_heldout(inst):
        raise TraceError(f"{inst.ref.dataset} index {inst.ref.index} is held out: never a training example")
    completion = tokenizer.encode(think_answer_completion(inst, trace_style), add_special_tokens=False)
    return WarmupExample(tuple(prompt_ids), tuple(completion + [int(tokenizer.eos_token_id)]),
                         inst.ref.dataset)


def think_answer_draw(tokenizer: PreTrainedTokenizerBase, source: tasks.TaskSource,
                      prompt_ids: Callable[[tasks.TaskInstance], Sequence[int]],
                      trace_style: str = DEFAULT_TRACE_STYLE) -> DrawFn:
    """A `DrawFn` over `source`'s training draws (which skip held-out problems), prompts from `prompt_ids`, traces
    in `trace_style`."""

    def draw(rng: random.Random, count: int) -> list[WarmupExample]:
        return [think_answer_example(tokenizer, inst, prompt_ids(inst), trace_style)
                for inst in (tasks.instance(ref) for ref in source.draw(rng, count))]

    return draw
