"""External completions as training samples, with the registered off-policy corrections.

Before training, `external_samples` recomputes every external completion's log-probs under the local policy,
pi_local, and builds the on-policy sample: those log-probs are the ratio's old log-probs (ratio 1 at the first
minibatch, as in rl-swarm) and the advantage is the group's, re-scored by us. A correction from `CORRECTIONS`,
`fn(sample, sender_logprobs, params) -> sample`, then turns it into the sample that trains; mu_sender is the
sender's claimed log-prob of each token, None when it does not apply (another tokenizer: our ids are a
re-tokenization), and then every correction leaves the on-policy sample as it is.

The sender's log-probs are untrusted: they may only shrink a completion's gradient, never enlarge it. So every
weight below is <= cap = `share.correction.cap` <= 1, whatever the sender claims (config/share.py rejects a cap
above 1).
With r_t = pi_local(y_t) / mu_sender(y_t) per completion token t (T tokens), A the advantage:
- "none": weight 1, external completions trained as on-policy (SAPO's and rl-swarm's choice).
- "is": the advantage becomes A * min(exp(mean_t log r_t), cap): one truncated, length-normalised (GSPO)
  sequence weight.
- "ftis": filtered truncated IS, per token: w_t = 0 when r_t is outside the band [band_low, band_high],
  else min(r_t, cap); the token's loss term is multiplied by w_t (`TrainSample.token_weights`). A dropped token
  (w_t = 0) still counts in the token mean's denominator, as in prime-rl's masking. Per token rather than per
  sequence: the policies of two peers disagree on a few tokens (a digit, the stop), and dropping those keeps the
  rest of the completion, where a sequence filter loses all of it or keeps all of it; a sender's forged claim
  on one token drops that token only. Band default [0.125, 8]: prime-rl's token mask defaults (token_mask_low,
  token_mask_high), wide enough that peers grown from one checkpoint keep most tokens, narrow enough to drop a
  claim that is off by a factor of 8.
- "decoupled": AReaL's decoupled objective, as the trainer applies it to its own stale rollouts: the row is
  `off_policy` with mu_sender as behaviour log-probs and its own cap. Per minibatch, the PPO ratio is taken
  against the proximal policy (the current local policy, detached), so the clip bounds the update from here,
  and each token's term is weighted by min(pi_proximal(y_t) / mu_sender(y_t), cap). mu_sender enters only that
  truncated weight, never the ratio.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from swarm_node import variants
from swarm_node.train.batching import collate, microbatch_plan, sample_length
from swarm_node.train.trainer import Trainer
from swarm_node.types import PoolEntry, TrainSample

DEFAULT_BAND = (0.125, 8.0)  # ftis: prime-rl's token mask defaults


@dataclass(frozen=True)
class CorrectionParams:
    """The knobs of the corrections (`share.correction`'s, by `knobs()`): `cap` (<= 1) and ftis's band on r."""

    cap: float = 1.0
    band_low: float = DEFAULT_BAND[0]
    band_high: float = DEFAULT_BAND[1]

    def __post_init__(self) -> None:
        if not 0 < self.cap <= 1:
            raise ValueError(f"an external completion's weight cap must be in (0, 1], got {self.cap}")
        if not 0 <= self.band_low <= 1 <= self.band_high:
            raise ValueError(f"the ftis band needs 0 <= low <= 1 <= high, got [{self.band_low}, {self.band_high}]")


# fn(on-policy sample (behaviour = pi_local), sender log-probs or None, params) -> the sample to train on
Correction = Callable[[TrainSample, "list[float] | None", CorrectionParams], TrainSample]
CORRECTIONS: variants.Registry[Correction] = variants.Registry("share.correction.kind", variants.CORRECTIONS)


def sequence_is_weight(local_logprobs: list[float], sender_logprobs: list[float], cap: float) -> float:
    """min(exp(mean_t(local - sender)), cap): the length-normalised truncated importance weight of one
    completion. Never above cap, whatever the sender claims."""
    if not local_logprobs:
        return 1.0
    mean = sum(a - b for a, b in zip(local_logprobs, sender_logprobs, strict=True)) / len(local_logprobs)
    return min(math.exp(min(mean, math.log(cap))), cap)


def ftis_token_weights(local_logprobs: list[float], sender_logprobs: list[float], params: CorrectionParams
                       ) -> list[float]:
    """Per token: 0 when r = exp(local - sender) is outside [band_low, band_high], else min(r, cap). Compared in
    log space, so no claim overflows; never above cap."""
    lo = math.log(params.band_low) if params.band_low > 0 else -math.inf
    hi, log_cap = math.log(params.band_high), math.log(params.cap)
    out = []
    for a, b in zip(local_logprobs, sender_logprobs, strict=True):
        log_r = a - b
        out.append(math.exp(min(log_r, log_cap)) if lo <= log_r <= hi else 0.0)
    return out


@CORRECTIONS.register("none")
def on_policy(sample: TrainSample, sender_logprobs: list[float] | None, params: CorrectionParams) -> TrainSample:
    return sample


@CORRECTIONS.register("is")
def truncated_is(sample: TrainSample, sender_logprobs: list[float] | None, params: CorrectionParams) -> TrainSample:
    if sender_logprobs is None:
        return sample
    weight = sequence_is_weight(sample.behaviour_logprobs, sender_logprobs, params.cap)
    return dataclasses.replace(sample, advantage=sample.advantage * weight)


@CORRECTIONS.register("ftis")
def filtered_truncated_is(sample: TrainSample, sender_logprobs: list[float] | None,
                          params: CorrectionParams) -> TrainSample:
    if sender_logprobs is None:
        return sample
    return dataclasses.replace(sample,
                               token_weights=ftis_token_weights(sample.behaviour_logprobs, sender_logprobs, params))


@CORRECTIONS.register("decoupled")
def decoupled(sample: TrainSample, sender_logprobs: list[float] | None, params: CorrectionParams) -> TrainSample:
    if sender_logprobs is None:
        return sample
    return dataclasses.replace(sample, behaviour_logprobs=list(sender_logprobs), off_policy=True, is_cap=params.cap)


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
                     params: CorrectionParams | float) -> list[TrainSample]:
    """Training samples for external groups, built on-policy under the local model and then corrected (see the
    module contract). `params` may be just the cap (the band then takes its defaults)."""
    fix = CORRECTIONS[correction]
    knobs = params if isinstance(params, CorrectionParams) else CorrectionParams(cap=params)
    raw: list[tuple[TrainSample, list[float] | None]] = []
    for ext in externals:
        g = ext.group
        for c, a in g.trained():  # the pivot (MC-GRPO's median completion) trains no row
            if not c.token_ids:
                continue
            sender_lp = None if ext.retokenized else c.logprobs
            raw.append((TrainSample(g.prompt_ids, c.token_ids, [0.0] * len(c.token_ids), a), sender_lp))
    if not raw:
        return []
    local = policy_logprobs(trainer, [s for s, _ in raw])
    return [fix(dataclasses.replace(s, behaviour_logprobs=lp), sender_lp, knobs)
            for (s, sender_lp), lp in zip(raw, local, strict=True)]
