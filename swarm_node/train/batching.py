"""Training samples into tensors: right-padded batches, minibatches that keep each group whole, and micro-batches
under a token budget.

A minibatch (one optimizer step) is collated as micro-batches: `microbatch_plan` sorts its rows by length and
cuts them into micro-batches whose padded size (rows x longest row) stays within a token budget, and never pads a
row to more than twice its length, so one long row is padded alone instead of multiplying the memory (and the
compute) of the whole minibatch. A row longer than the budget is a micro-batch of its own (the share bounds cap a
row at the model's context).
A batch carries per-token weights and per-row IS caps only when some sample sets them (external completions,
sharing/corrections.py), and per-token stale flags only when some sample sets them (a completion resumed under a
newer policy, APRIL); otherwise those fields are None and the trainer computes exactly as without them.
Shapes: N sequences, L positions. Pure tensor code: no model, no optimizer.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from swarm_node.types import TrainSample


@dataclass
class Batch:
    input_ids: torch.Tensor  # [N, L] right-padded prompt+completion
    attention: torch.Tensor  # [N, L]
    targets: torch.Tensor  # [N, L-1] next token at each position
    mask: torch.Tensor  # [N, L-1] 1.0 where the target is a completion token
    behaviour: torch.Tensor  # [N, L-1] behaviour log-prob at completion positions, 0 elsewhere
    advantages: torch.Tensor  # [N]
    off_policy: torch.Tensor  # [N] bool
    # [N, L-1] fixed per-token loss weights (1 where a sample has none, 0 at padding), or None when no sample has
    # any: then the loss is computed exactly as without them.
    token_weights: torch.Tensor | None = None
    # [N] per-row cap on an off-policy row's truncated IS weight (NaN: the trainer's train.is_cap), or None when
    # no sample sets one.
    is_cap: torch.Tensor | None = None
    # [N, L-1] bool: the completion tokens an older policy sampled (True at every position of a sample without
    # `stale_tokens`), or None when no sample sets it: then every token of an off-policy row is stale.
    stale_tokens: torch.Tensor | None = None


def collate(samples: list[TrainSample], pad_id: int) -> Batch:
    width = max(len(s.prompt_ids) + len(s.completion_ids) for s in samples)
    n = len(samples)
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    attention = torch.zeros((n, width), dtype=torch.long)
    mask = torch.zeros((n, width - 1))
    behaviour = torch.zeros((n, width - 1))
    for i, s in enumerate(samples):
        p, c = len(s.prompt_ids), len(s.completion_ids)
        if len(s.behaviour_logprobs) != c:
            raise ValueError(f"sample {i}: {c} completion tokens but {len(s.behaviour_logprobs)} log-probs")
        ids[i, : p + c] = torch.tensor(s.prompt_ids + s.completion_ids)
        attention[i, : p + c] = 1
        # Completion token j sits at position p+j and is predicted from position p+j-1.
        mask[i, p - 1 : p + c - 1] = 1.0
        behaviour[i, p - 1 : p + c - 1] = torch.tensor(s.behaviour_logprobs)
    return Batch(ids, attention, ids[:, 1:], mask, behaviour,
                 torch.tensor([s.advantage for s in samples], dtype=torch.float32),
                 torch.tensor([s.off_policy for s in samples]),
                 _token_weights(samples, mask), _row_caps(samples), _stale_tokens(samples, width))


def _stale_tokens(samples: list[TrainSample], width: int) -> torch.Tensor | None:
    if all(s.stale_tokens is None for s in samples):
        return None
    stale = torch.ones((len(samples), width - 1), dtype=torch.bool)
    for i, s in enumerate(samples):
        if s.stale_tokens is not None:
            p, c = len(s.prompt_ids), len(s.completion_ids)
            if len(s.stale_tokens) != c:
                raise ValueError(f"sample {i}: {c} completion tokens but {len(s.stale_tokens)} stale flags")
            stale[i, p - 1 : p + c - 1] = torch.tensor(s.stale_tokens, dtype=torch.bool)
    return stale


def _token_weights(samples: list[TrainSample], mask: torch.Tensor) -> torch.Tensor | None:
    if all(s.token_weights is None for s in samples):
        return None
    weights = mask.clone()
    for i, s in enumerate(samples):
        if s.token_weights is not None:
            p, c = len(s.prompt_ids), len(s.completion_ids)
            if len(s.token_weights) != c:
                raise ValueError(f"sample {i}: {c} completion tokens but {len(s.token_weights)} token weights")
            weights[i, p - 1 : p + c - 1] = torch.tensor(s.token_weights)
    return weights


def _row_caps(samples: list[TrainSample]) -> torch.Tensor | None:
    if all(s.is_cap is None for s in samples):
        return None
    return torch.tensor([math.nan if s.is_cap is None else s.is_cap for s in samples], dtype=torch.float32)


def prompt_keys(batch: Batch) -> torch.Tensor:
    """[N] int64 on the CPU: one key per row, equal for rows of equal prompt (one group), the same in every
    micro-batch of a minibatch. A row's prompt ends where its completion mask starts."""
    ids, mask = batch.input_ids.cpu(), batch.mask.cpu()
    keys = []
    for row, row_mask in zip(ids, mask, strict=True):
        completion = torch.nonzero(row_mask)
        end = int(completion[0]) + 1 if completion.numel() else row.numel()
        keys.append(hash(tuple(row[:end].tolist())))  # int tuples hash the same in every process
    return torch.tensor(keys, dtype=torch.int64)


def group_minibatches(samples: list[TrainSample], minibatches: int, rng: random.Random) -> list[list[int]]:
    """Sample indices per minibatch, keeping each group (samples sharing a prompt) whole; groups shuffled.

    Within a group the advantages sum to zero, so the push on tokens nobody sampled cancels. Split a group across
    minibatches and each optimizer step gets a net push on those tokens, which Adam's normalisation amplifies into
    probability leaking to never-sampled (garbage) tokens: measured, splitting groups degraded greedy accuracy.
    """
    by_prompt: dict[tuple[int, ...], list[int]] = {}
    for i, s in enumerate(samples):
        by_prompt.setdefault(tuple(s.prompt_ids), []).append(i)
    keys = list(by_prompt)
    rng.shuffle(keys)
    return [[i for key in keys[m::minibatches] for i in by_prompt[key]] for m in range(minibatches)]


def sample_length(sample: TrainSample) -> int:
    """Positions the sample occupies in a batch: prompt + completion."""
    return len(sample.prompt_ids) + len(sample.completion_ids)


def microbatch_plan(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Row indices per micro-batch: every index exactly once, rows sorted longest first (ties in index order) and
    cut greedily so that each micro-batch's padded size, rows x its longest row, is <= max_tokens; a row longer
    than max_tokens alone makes a micro-batch. Rows are also bucketed by length: a micro-batch only takes rows
    longer than half its longest, so padding at most doubles any row and the padded total stays under twice the
    real tokens. So no micro-batch allocates more than max(max_tokens, longest row) positions."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be positive, got {max_tokens}")
    plan: list[list[int]] = []
    width = 0
    for i in sorted(range(len(lengths)), key=lambda j: (-lengths[j], j)):
        if plan and (len(plan[-1]) + 1) * width <= max_tokens and 2 * lengths[i] > width:
            plan[-1].append(i)
        else:
            plan.append([i])
            width = max(lengths[i], 1)  # the first row of a micro-batch is its longest
    return plan
