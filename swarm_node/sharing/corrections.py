"""External completions as training samples, with the registered off-policy corrections.

Before training, `external_samples` recomputes every external completion's log-probs under the local policy and
uses them as the ratio's old log-probs (ratio 1 at the first minibatch, as in rl-swarm). A correction from
`CORRECTIONS` then weights each completion's advantage: `fn(local_logprobs, sender_logprobs, cap) -> weight`, where
the sender's log-probs are None when they do not apply (another tokenizer: our ids are a re-tokenization).
- "none": weight 1, external completions trained as on-policy (SAPO's and rl-swarm's choice).
- "is": `sequence_is_weight` = min(exp(mean_t(log pi_local - log mu_sender)), cap), cap <= 2; 1 without the
  sender's log-probs. They are untrusted, so they can shrink a completion's gradient but never enlarge it past
  `cap`. (The trainer takes per-sequence advantages, so the weight is GSPO's length-normalised ratio, truncated.)
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from swarm_node import variants
from swarm_node.train.batching import collate, microbatch_plan, sample_length
from swarm_node.train.trainer import Trainer
from swarm_node.types import PoolEntry, TrainSample

# fn(local log-probs, sender log-probs or None, cap) -> the weight of one completion's advantage
Correction = Callable[[list[float], "list[float] | None", float], float]
CORRECTIONS: variants.Registry[Correction] = variants.Registry("share.external_correction", variants.CORRECTIONS)


def sequence_is_weight(local_logprobs: list[float], sender_logprobs: list[float], cap: float) -> float:
    """min(exp(mean_t(local - sender)), cap): the length-normalised truncated importance weight of one
    completion. Never above cap, whatever the sender claims."""
    if not local_logprobs:
        return 1.0
    mean = sum(a - b for a, b in zip(local_logprobs, sender_logprobs, strict=True)) / len(local_logprobs)
    return min(math.exp(min(mean, math.log(cap))), cap)


@CORRECTIONS.register("none")
def on_policy(local_logprobs: list[float], sender_logprobs: list[float] | None, cap: float) -> float:
    return 1.0


@CORRECTIONS.register("is")
def truncated_is(local_logprobs: list[float], sender_logprobs: list[float] | None, cap: float) -> float:
    return 1.0 if sender_logprobs is None else sequence_is_weight(local_logprobs, sender_logprobs, cap)


@torch.no_grad()
def policy_logprobs(trainer: Trainer, samples: list[TrainSample], max_tokens: int | None = None) -> list[list[float]]:
    """Processed log-probs of each sample's completion tokens under the trainer's current policy, in the samples'
    order. Computed in micro-batches of at most `max_tokens` padded positions (default: the trainer's budget),
    rows bucketed by length, so one long completion is never padded onto the others."""
    out: list[list[float]] = [[] for _ in samples]
    budget = trainer.microbatch_tokens if max_tokens is None else max_tokens
    for rows in microbatch_plan([sample_length(s) for s in samples], budget):
        b = collate([samples[i] for i in rows], trainer.pad_id)
        lp, _ = trainer.token_log_probs(trainer.model, b)
        for r, i in enumerate(rows):
            p = len(samples[i].prompt_ids)
            out[i] = lp[r, p - 1 : p - 1 + len(samples[i].completion_ids)].tolist()
    return out


def external_samples(trainer: Trainer, externals: list[PoolEntry], correction: str,
                     is_cap: float) -> list[TrainSample]:
    """Training samples for external groups, on-policy under the local model (see the module contract)."""
    weight = CORRECTIONS[correction]
    raw: list[tuple[TrainSample, list[float] | None]] = []
    for ext in externals:
        g = ext.group
        for c, a in zip(g.completions, g.advantages, strict=True):
            if not c.token_ids:
                continue
            sender_lp = None if ext.retokenized else c.logprobs
            raw.append((TrainSample(g.prompt_ids, c.token_ids, [0.0] * len(c.token_ids), a), sender_lp))
    if not raw:
        return []
    local = policy_logprobs(trainer, [s for s, _ in raw])
    samples = []
    for (s, sender_lp), lp in zip(raw, local, strict=True):
        adv = s.advantage * weight(lp, sender_lp, is_cap)
        samples.append(TrainSample(s.prompt_ids, s.completion_ids, lp, adv))
    return samples
