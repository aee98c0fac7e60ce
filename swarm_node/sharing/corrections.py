"""External completions as training samples, with the registered off-policy corrections.

External completions are on-policy by default: before training, `external_samples` recomputes their log-probs under
the local policy and uses them as the ratio's old log-probs (ratio 1 at the first minibatch, as in rl-swarm). With
correction "is" and a matching tokenizer each completion's advantage is scaled by `sequence_is_weight` =
min(exp(mean_t(log pi_local - log mu_sender)), cap), cap <= 2: the sender's log-probs are untrusted, so they can
shrink a completion's gradient but never enlarge it past `cap`. (The trainer takes per-sequence advantages, so the
weight is the length-normalised sequence ratio of GSPO, truncated.)
"""

from __future__ import annotations

import math

import torch

from swarm_node.sharing.pool import PoolEntry
from swarm_node.train.batching import collate
from swarm_node.train.trainer import Trainer
from swarm_node.types import TrainSample


def sequence_is_weight(local_logprobs: list[float], sender_logprobs: list[float], cap: float) -> float:
    """min(exp(mean_t(local - sender)), cap): the length-normalised truncated importance weight of one
    completion. Never above cap, whatever the sender claims."""
    if not local_logprobs:
        return 1.0
    mean = sum(a - b for a, b in zip(local_logprobs, sender_logprobs, strict=True)) / len(local_logprobs)
    return min(math.exp(min(mean, math.log(cap))), cap)


@torch.no_grad()
def policy_logprobs(trainer: Trainer, samples: list[TrainSample], batch: int = 64) -> list[list[float]]:
    """Processed log-probs of each sample's completion tokens under the trainer's current policy."""
    out: list[list[float]] = []
    for start in range(0, len(samples), batch):
        chunk = samples[start:start + batch]
        b = collate(chunk, trainer.pad_id)
        lp, _ = trainer.token_log_probs(trainer.model, b)
        for i, s in enumerate(chunk):
            p = len(s.prompt_ids)
            out.append(lp[i, p - 1 : p - 1 + len(s.completion_ids)].tolist())
    return out


def external_samples(trainer: Trainer, externals: list[PoolEntry], correction: str,
                     is_cap: float) -> list[TrainSample]:
    """Training samples for external groups, on-policy under the local model (see the module contract)."""
    raw: list[tuple[TrainSample, list[float] | None]] = []
    for ext in externals:
        g = ext.group
        for c, a in zip(g.completions, g.advantages, strict=True):
            if not c.token_ids:
                continue
            sender_lp = c.logprobs if (correction == "is" and not ext.retokenized) else None
            raw.append((TrainSample(g.prompt_ids, c.token_ids, [0.0] * len(c.token_ids), a), sender_lp))
    if not raw:
        return []
    local = policy_logprobs(trainer, [s for s, _ in raw])
    samples = []
    for (s, sender_lp), lp in zip(raw, local, strict=True):
        adv = s.advantage * (sequence_is_weight(lp, sender_lp, is_cap) if sender_lp is not None else 1.0)
        samples.append(TrainSample(s.prompt_ids, s.completion_ids, lp, adv))
    return samples
