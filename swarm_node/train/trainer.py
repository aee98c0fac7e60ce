"""GRPO trainer: turns scored rollout groups into optimizer steps on an HF causal LM.

Contract: `train_step(samples)` splits the samples into `minibatches` optimizer steps. The ratio's old log-probs are
the sampler's behaviour log-probs (so the clip acts on real policy change). An off-policy sample with its own
`TrainSample.is_cap` (an external completion, share.correction.cap <= 1) takes the ratio against the proximal policy
and carries the weight min(pi_proximal/mu, is_cap). The other off-policy samples (our stale rollouts, lag > 0, and a
learner's workers' rows) train as `train.stale_correction` says (rl/stale.py, registry `STALE_CORRECTIONS`; its
default "tis" is the decoupled objective with the cap train.is_cap), on the tokens an older policy sampled: a row
resumed under a newer policy (APRIL, `TrainSample.stale_tokens`) trains its newer tokens as on-policy; a correction
that needs the whole minibatch (m2po, vcpo) gets its proximal log-probs from a forward pass without gradients first
when the minibatch is more than one micro-batch. Its per-step statistics are `StepStats.correction` (mean over the
minibatches that report them). A sample's `token_weights` (fixed per-token weights, 0 drops a token; set by an
external correction) multiply its per-token loss terms, after any IS weight; a dropped token still counts in the
token mean's denominator. Log-probs are finite (rl/logprobs.trainable_log_probs): a target the processed distribution
excludes is EXCLUDED_LOG_PROB, and a completion token whose behaviour log-prob is that (a peer's token outside our
nucleus) is dropped so.
Without these optional fields the computation is exactly the one without them.
A minibatch whose loss or gradient is non-finite is skipped (counted) and never reaches the parameters.
Memory is bounded by construction: each minibatch runs forward/backward in micro-batches (`microbatch_plan`) of at
most `microbatch_tokens` padded positions (or one row), and their gradients accumulate into exactly the gradient of
the whole minibatch's loss: every registered loss is a token mean over the minibatch (rl/loss.py), so micro-batch k
with m_k of the minibatch's M completion tokens contributes its own token-mean loss times m_k / M. The reported
statistics (clip fraction, KL, entropy) are token means weighted the same way.
Device and precision: the trainer computes on its model's device (model/device.py places the model first);
batches are collated on the CPU and moved there, so callers (sharing/corrections.py) pass CPU batches and get
log-probs on that device. With `autocast` (a dtype, e.g. bf16) the forward passes run under torch.autocast and
the logits are taken back to fp32 before the log-softmax; the weights and Adam's state stay fp32. Without it the
computation is exactly the fp32 one. Log-probs come from the decoder's last hidden state through the output
embeddings, `logprob_chunk` positions at a time (`token_log_probs`): the logits of Qwen2/Llama-style models; a model
that scales or caps its logits after the head is not supported. `microbatch_tokens` may be lowered between steps
(the memory guard does).
Shapes: N sequences, L positions.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
import random
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from swarm_node.config import SamplerConfig, TrainConfig
from swarm_node.rl.logprobs import EXCLUDED_LOG_PROB, chunked_token_log_probs, logprob_chunk, trainable_log_probs
from swarm_node.rl.loss import LOSSES, LossConfig, LossInputs, behaviour_drift, masked_mean, truncated_is_weights
from swarm_node.rl.stale import STALE_CORRECTIONS, StaleBatch, StaleParams, StaleWeights
from swarm_node.train.batching import (
    Batch,
    collate,
    group_minibatches,
    microbatch_plan,
    prompt_keys,
    sample_length,
)
from swarm_node.types import TrainSample


@dataclass
class StepStats:
    loss: float = 0.0
    clip_frac: float = 0.0
    kl: float = 0.0
    entropy: float = 0.0
    grad_norm: float = 0.0
    minibatches: int = 0
    skipped_minibatches: int = 0
    tokens: int = 0
    correction: dict[str, float] = dataclasses.field(default_factory=dict)  # the stale correction's statistics


@dataclass
class _MicroLoss:
    loss: torch.Tensor  # scalar: the micro-batch's token-mean loss, with its graph
    clip_frac: float
    kl: float
    entropy: float
    stale: StaleWeights | None  # how this micro-batch's stale rows trained, or None without any


class Trainer:
    def __init__(self, model: PreTrainedModel, train: TrainConfig, sampling: SamplerConfig, pad_id: int,
                 seed: int = 0, autocast: torch.dtype | None = None, vocab: int | None = None) -> None:
        if train.microbatch_tokens < 1:
            raise ValueError(f"train.microbatch_tokens must be positive, got {train.microbatch_tokens}")
        self.model = model
        self.device = next(model.parameters()).device  # where the model was placed (model/device.py)
        self.autocast = autocast  # None: plain fp32
        self.microbatch_tokens = train.microbatch_tokens  # padded positions per forward/backward (the contract)
        self.cfg = train
        self.temperature, self.top_p = sampling.temperature_top_p()
        self.pad_id = pad_id
        self.vocab = vocab  # the tokenizer's length: ids of a padded embedding past it are masked out
        # positions whose full-vocabulary logits exist at once
        self.logprob_chunk = logprob_chunk(model.get_output_embeddings().weight.shape[0])
        self.loss_fn = LOSSES[train.loss]
        self.loss_cfg = LossConfig(eps_low=train.eps_low, eps_high=train.eps_high, kl_coef=train.kl_coef)
        self.stale_correction = STALE_CORRECTIONS[train.stale_correction.kind]
        self.stale_params = StaleParams(cap=train.is_cap, **train.stale_correction.knobs())
        self.lr_scale = 1.0  # the stale correction's factor on the current minibatch's learning rate
        # Only what trains: with LoRA adapters the base weights are frozen.
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=train.lr, weight_decay=train.weight_decay,
                                           betas=(0.9, 0.99), eps=train.adam_eps)
        self.ref_model = copy.deepcopy(model).eval().requires_grad_(False) if train.kl_coef > 0 else None
        self.rng = random.Random(seed)
        self.skipped_total = 0
        self.optimizer_steps = 0  # checkpointed by the node: drives the lr warm-up

    def _set_lr(self, correction_scale: float = 1.0) -> None:
        warm = self.cfg.warmup_steps
        scale = min(1.0, (self.optimizer_steps + 1) / warm) if warm else 1.0
        for group in self.optimizer.param_groups:
            group["lr"] = self.cfg.lr * scale * correction_scale

    def token_log_probs(self, model: PreTrainedModel, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """Processed log-probs [N, L-1] of each target token (finite: rl/logprobs.trainable_log_probs, 0 outside
        the completions), and the entropy [N, L-1] at each position, on the model's device (the batch may be on the
        CPU). The output head runs `logprob_chunk` positions at a time
        (rl/logprobs.chunked_token_log_probs): the full-vocabulary logits of a whole micro-batch never exist."""
        batch = self.on_device(batch)
        with self._autocast():
            hidden = model.get_decoder()(input_ids=batch.input_ids, attention_mask=batch.attention,
                                         use_cache=False).last_hidden_state[:, :-1]
        rows, positions, width = hidden.shape
        head = model.get_output_embeddings()

        def logits(h: torch.Tensor) -> torch.Tensor:
            with self._autocast():
                return head(h).float()  # a no-op in fp32; under autocast the log-softmax runs in fp32

        token_lp, entropy = chunked_token_log_probs(hidden.reshape(-1, width), logits, batch.targets.reshape(-1),
                                                    self.temperature, self.top_p, self.vocab, self.logprob_chunk)
        return trainable_log_probs(token_lp.view(rows, positions), batch.mask), entropy.view(rows, positions)

    def _autocast(self) -> contextlib.AbstractContextManager[object]:
        if self.autocast is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.autocast)

    def on_device(self, batch: Batch) -> Batch:
        """The batch with every tensor on the trainer's device (the same batch when it is there already)."""
        if batch.input_ids.device == self.device:
            return batch
        moved = {f.name: getattr(batch, f.name) for f in dataclasses.fields(batch)}
        return Batch(**{k: v.to(self.device) if isinstance(v, torch.Tensor) else v for k, v in moved.items()})

    def microbatches(self, samples: list[TrainSample]) -> list[Batch]:
        """The samples as collated micro-batches under the token budget (see `microbatch_plan`)."""
        plan = microbatch_plan([sample_length(s) for s in samples], self.microbatch_tokens)
        return [collate([samples[i] for i in rows], self.pad_id) for rows in plan]

    def train_step(self, samples: list[TrainSample]) -> StepStats:
        stats = StepStats()
        if not samples:
            return stats
        chunks = group_minibatches(samples, self.cfg.minibatches, self.rng)
        self.model.train()
        totals = {"loss": 0.0, "clip_frac": 0.0, "kl": 0.0, "entropy": 0.0, "grad_norm": 0.0}
        correction: dict[str, list[float]] = {}  # a statistic over the minibatches that reported it
        for chunk in (c for c in chunks if c):
            batches = self.microbatches([samples[i] for i in chunk])
            stats.minibatches += 1
            result = self._minibatch(batches)
            if result is None:
                stats.skipped_minibatches += 1
                continue
            for k, v in result.items():
                if k in totals:
                    totals[k] += v
                else:
                    correction.setdefault(k, []).append(v)
            stats.tokens += int(sum(float(b.mask.sum()) for b in batches))
        self.model.eval()
        done = stats.minibatches - stats.skipped_minibatches
        self.skipped_total += stats.skipped_minibatches
        if done:
            for k, v in totals.items():
                setattr(stats, k, v / done)
            stats.correction = {k: sum(v) / len(v) for k, v in correction.items()}
        return stats

    def accumulate(self, batches: list[Batch]) -> dict[str, float] | None:
        """Backward of one minibatch's loss, given as micro-batches: gradients accumulate in the parameters' .grad
        (zeroed first). The loss and statistics of the whole minibatch, or None (gradients zeroed) when a
        micro-batch's loss is non-finite."""
        self.optimizer.zero_grad(set_to_none=True)
        total = sum(float(b.mask.sum()) for b in batches)
        sums = {"loss": 0.0, "clip_frac": 0.0, "kl": 0.0, "entropy": 0.0}
        self.lr_scale = 1.0
        fixed = self._whole_minibatch_weights(batches)
        for i, batch in enumerate(batches):
            # masked_mean divides by max(tokens, 1): the same clamp on the whole minibatch keeps a minibatch
            # without completion tokens at loss 0, as when it was one batch.
            weight = float(batch.mask.sum()) / max(total, 1.0)
            part = self._micro_loss(batch, None if fixed is None else fixed[i])
            if part.stale is not None and (fixed is not None or len(batches) == 1):
                # the correction saw the whole minibatch: its learning-rate factor and statistics are the step's
                self.lr_scale = part.stale.lr_scale
                sums.update(part.stale.stats)
            loss = part.loss * weight
            if not torch.isfinite(loss):
                self.optimizer.zero_grad(set_to_none=True)
                return None
            loss.backward()
            sums["loss"] += float(loss.detach())
            sums["clip_frac"] += part.clip_frac * weight
            sums["kl"] += part.kl * weight
            sums["entropy"] += part.entropy * weight
        return sums

    def _minibatch(self, batches: list[Batch]) -> dict[str, float] | None:
        result = self.accumulate(batches)
        if result is None:
            return None
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params, self.cfg.max_grad_norm))
        if not math.isfinite(grad_norm):
            self.optimizer.zero_grad(set_to_none=True)
            return None
        self._set_lr(self.lr_scale)
        self.optimizer.step()
        self.optimizer_steps += 1
        return {**result, "grad_norm": grad_norm}

    def _micro_loss(self, batch: Batch, fixed: StaleWeights | None = None) -> _MicroLoss:
        """One micro-batch's token-mean loss and statistics. `fixed`: the stale rows' weights, already computed over
        the whole minibatch (else the correction runs on this micro-batch)."""
        batch = self.on_device(batch)
        logp, entropy = self.token_log_probs(self.model, batch)
        old_logp, is_weights, advantages, stale = batch.behaviour, None, batch.advantages, None
        if bool(batch.off_policy.any()):
            # Rows with their own cap: AReaL's decoupled objective, the ratio taken against the proximal policy (the
            # current one, before this minibatch's update), so the clip limits the update from here, and the
            # truncated weight pi_proximal / mu corrects for the behaviour policy that sampled them. The other
            # off-policy rows: as the stale correction says (tis: the same objective with train.is_cap).
            proximal = logp.detach()
            capped = self._capped_rows(batch)
            stale_rows = batch.off_policy & ~capped
            is_weights = torch.ones_like(proximal)
            # per token: against the proximal policy; a resumed completion's fresh tokens keep their own ratio
            against_proximal = capped.unsqueeze(-1).expand_as(proximal)
            if bool(stale_rows.any()):
                stale = fixed if fixed is not None else self.stale_correction.apply(
                    self._stale_batch(batch, proximal, stale_rows), self.stale_params)
                stale_tokens = self._stale_tokens(batch, stale_rows)
                if stale.token_weights is not None:
                    is_weights = torch.where(stale_tokens, stale.token_weights.to(proximal.dtype), is_weights)
                if stale.proximal_ratio:
                    against_proximal = against_proximal | stale_tokens
                advantages = torch.where(stale_rows, stale.advantages.to(advantages.dtype), advantages)
            if batch.is_cap is not None:  # rows with their own cap (external completions: share.correction.cap <= 1)
                cap = torch.nan_to_num(batch.is_cap, nan=self.cfg.is_cap).to(proximal.dtype).unsqueeze(-1)
                w = truncated_is_weights(proximal, batch.behaviour, cap)
                is_weights = torch.where(capped.unsqueeze(-1), w, is_weights)
            old_logp = torch.where(against_proximal, proximal, batch.behaviour)
        if batch.token_weights is not None:
            tw = batch.token_weights.to(logp.dtype)
            is_weights = tw if is_weights is None else is_weights * tw
        excluded = (batch.behaviour <= EXCLUDED_LOG_PROB) & batch.mask.bool()
        if bool(excluded.any()):
            # A token its behaviour policy excluded (a peer's token outside our nucleus when policy_logprobs scored
            # it) has no ratio to train by: once an update brings it into the nucleus, pi / mu is ~e^80 and the
            # gradient overflows. It trains with weight 0 and stays in the token mean's denominator.
            keep = (~excluded).to(logp.dtype)
            is_weights = keep if is_weights is None else is_weights * keep
        ref_logp = None
        if self.ref_model is not None:
            with torch.no_grad():
                ref_logp, _ = self.token_log_probs(self.ref_model, batch)
        out = self.loss_fn(LossInputs(logp, old_logp, advantages, batch.mask, is_weights, ref_logp),
                           self.loss_cfg)
        drift = out.kl if self.ref_model is not None else float(behaviour_drift(logp.detach(), batch.behaviour,
                                                                                  batch.mask))
        return _MicroLoss(out.loss, out.clip_frac, drift, float(masked_mean(entropy, batch.mask)), stale)

    @staticmethod
    def _capped_rows(batch: Batch) -> torch.Tensor:
        """[N] bool: off-policy rows with a cap of their own (external completions), outside the stale correction."""
        if batch.is_cap is None:
            return torch.zeros_like(batch.off_policy)
        return batch.off_policy & ~torch.isnan(batch.is_cap)

    @staticmethod
    def _stale_tokens(batch: Batch, stale_rows: torch.Tensor) -> torch.Tensor:
        """[N, L-1] bool: the positions the stale correction acts on: every position of a stale row, or, where the
        batch marks tokens (`Batch.stale_tokens`, APRIL), the stale tokens of stale rows alone."""
        rows = stale_rows.unsqueeze(-1).expand(batch.mask.shape)
        return rows if batch.stale_tokens is None else rows & batch.stale_tokens

    @staticmethod
    def _stale_batch(batch: Batch, proximal: torch.Tensor, stale_rows: torch.Tensor) -> StaleBatch:
        mask = batch.mask * Trainer._stale_tokens(batch, stale_rows)
        return StaleBatch((proximal - batch.behaviour) * mask, mask, stale_rows, batch.advantages,
                          prompt_keys(batch).to(batch.advantages.device))

    def _whole_minibatch_weights(self, batches: list[Batch]) -> list[StaleWeights] | None:
        """Per micro-batch, the stale rows' weights computed over the whole minibatch, when the correction needs it
        and the minibatch is several micro-batches (one micro-batch computes them from its own forward pass)."""
        if not self.stale_correction.whole_minibatch or len(batches) < 2:
            return None
        if not any(bool((b.off_policy & ~self._capped_rows(b)).any()) for b in batches):
            return None
        parts = []
        with torch.no_grad():
            for batch in batches:
                batch = self.on_device(batch)
                proximal, _ = self.token_log_probs(self.model, batch)
                parts.append(self._stale_batch(batch, proximal, batch.off_policy & ~self._capped_rows(batch)))
        width = max(p.mask.shape[1] for p in parts)
        whole = StaleBatch(*(torch.cat([_pad(getattr(p, f.name), width) for p in parts])
                             for f in dataclasses.fields(StaleBatch)))
        weights = self.stale_correction.apply(whole, self.stale_params)
        out, row = [], 0
        for p in parts:
            n, t = p.mask.shape
            tw = None if weights.token_weights is None else weights.token_weights[row:row + n, :t]
            out.append(dataclasses.replace(weights, token_weights=tw, advantages=weights.advantages[row:row + n]))
            row += n
        return out


def _pad(values: torch.Tensor, width: int) -> torch.Tensor:
    """A [N, T] tensor right-padded with zeros to [N, width]; a [N] tensor as it is."""
    if values.dim() < 2 or values.shape[1] == width:
        return values
    return torch.nn.functional.pad(values, (0, width - values.shape[1]))
