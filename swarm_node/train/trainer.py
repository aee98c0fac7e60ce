"""GRPO trainer: turns scored rollout groups into optimizer steps on an HF causal LM.

Contract: `train_step(samples)` splits the samples into `minibatches` optimizer steps. The ratio's old log-probs
are the sampler's behaviour log-probs (so the clip acts on real policy change); off-policy samples (a stale
rollout, lag > 0) take the ratio against the proximal policy and carry the weight min(pi_proximal/mu, is_cap),
where is_cap is the sample's own `TrainSample.is_cap` when set (external completions, share.correction.cap <= 1) and
train.is_cap otherwise. A sample's `token_weights` (fixed per-token weights, 0 drops a token; set by an external
correction) multiply its per-token loss terms, after any IS weight; a dropped token still counts in the token
mean's denominator. Without these optional fields the computation is exactly the one without them.
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
from swarm_node.rl.logprobs import LOGPROB_CHUNK, chunked_token_log_probs
from swarm_node.rl.loss import LOSSES, LossConfig, LossInputs, kl_k3, masked_mean, truncated_is_weights
from swarm_node.train.batching import (
    Batch,
    collate,
    group_minibatches,
    microbatch_plan,
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


@dataclass
class _MicroLoss:
    loss: torch.Tensor  # scalar: the micro-batch's token-mean loss, with its graph
    clip_frac: float
    kl: float
    entropy: float


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
        self.temperature = sampling.temperature
        self.top_p = sampling.top_p
        self.pad_id = pad_id
        self.vocab = vocab  # the tokenizer's length: ids of a padded embedding past it are masked out
        self.logprob_chunk = LOGPROB_CHUNK  # positions whose full-vocabulary logits exist at once
        self.loss_fn = LOSSES[train.loss]
        self.loss_cfg = LossConfig(eps_low=train.eps_low, eps_high=train.eps_high, kl_coef=train.kl_coef)
        # Only what trains: with LoRA adapters the base weights are frozen.
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=train.lr, weight_decay=train.weight_decay,
                                           betas=(0.9, 0.99), eps=train.adam_eps)
        self.ref_model = copy.deepcopy(model).eval().requires_grad_(False) if train.kl_coef > 0 else None
        self.rng = random.Random(seed)
        self.skipped_total = 0
        self.optimizer_steps = 0  # checkpointed by the node: drives the lr warm-up

    def _set_lr(self) -> None:
        warm = self.cfg.warmup_steps
        scale = min(1.0, (self.optimizer_steps + 1) / warm) if warm else 1.0
        for group in self.optimizer.param_groups:
            group["lr"] = self.cfg.lr * scale

    def token_log_probs(self, model: PreTrainedModel, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """Processed log-probs [N, L-1] of each target token, and the entropy [N, L-1] at each position, on the
        model's device (the batch may be on the CPU). The output head runs `logprob_chunk` positions at a time
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
        return token_lp.view(rows, positions), entropy.view(rows, positions)

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
        for chunk in (c for c in chunks if c):
            batches = self.microbatches([samples[i] for i in chunk])
            stats.minibatches += 1
            result = self._minibatch(batches)
            if result is None:
                stats.skipped_minibatches += 1
                continue
            for k, v in result.items():
                totals[k] += v
            stats.tokens += int(sum(float(b.mask.sum()) for b in batches))
        self.model.eval()
        done = stats.minibatches - stats.skipped_minibatches
        self.skipped_total += stats.skipped_minibatches
        if done:
            for k, v in totals.items():
                setattr(stats, k, v / done)
        return stats

    def accumulate(self, batches: list[Batch]) -> dict[str, float] | None:
        """Backward of one minibatch's loss, given as micro-batches: gradients accumulate in the parameters' .grad
        (zeroed first). The loss and statistics of the whole minibatch, or None (gradients zeroed) when a
        micro-batch's loss is non-finite."""
        self.optimizer.zero_grad(set_to_none=True)
        total = sum(float(b.mask.sum()) for b in batches)
        sums = {"loss": 0.0, "clip_frac": 0.0, "kl": 0.0, "entropy": 0.0}
        for batch in batches:
            # masked_mean divides by max(tokens, 1): the same clamp on the whole minibatch keeps a minibatch
            # without completion tokens at loss 0, as when it was one batch.
            weight = float(batch.mask.sum()) / max(total, 1.0)
            part = self._micro_loss(batch)
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
        self._set_lr()
        self.optimizer.step()
        self.optimizer_steps += 1
        return {**result, "grad_norm": grad_norm}

    def _micro_loss(self, batch: Batch) -> _MicroLoss:
        """One micro-batch's token-mean loss and statistics."""
        batch = self.on_device(batch)
        logp, entropy = self.token_log_probs(self.model, batch)
        old_logp, is_weights = batch.behaviour, None
        if bool(batch.off_policy.any()):
            # AReaL's decoupled objective for rows from an older policy: the ratio is taken against the proximal
            # policy (the current one, before this minibatch's update), so the clip limits the update from here,
            # and the truncated weight pi_proximal / mu corrects for the behaviour policy that sampled them.
            rows = batch.off_policy.unsqueeze(-1)
            proximal = logp.detach()
            cap: float | torch.Tensor = self.cfg.is_cap
            if batch.is_cap is not None:  # rows with their own cap (external completions: share.correction.cap <= 1)
                cap = torch.nan_to_num(batch.is_cap, nan=self.cfg.is_cap).to(proximal.dtype).unsqueeze(-1)
            w = truncated_is_weights(proximal, batch.behaviour, cap)
            is_weights = torch.where(rows, w, torch.ones_like(w))
            old_logp = torch.where(rows, proximal, batch.behaviour)
        if batch.token_weights is not None:
            tw = batch.token_weights.to(logp.dtype)
            is_weights = tw if is_weights is None else is_weights * tw
        ref_logp = None
        if self.ref_model is not None:
            with torch.no_grad():
                ref_logp, _ = self.token_log_probs(self.ref_model, batch)
        out = self.loss_fn(LossInputs(logp, old_logp, batch.advantages, batch.mask, is_weights, ref_logp),
                           self.loss_cfg)
        drift = out.kl if self.ref_model is not None else float(masked_mean(
            kl_k3(logp.detach(), batch.behaviour), batch.mask))
        return _MicroLoss(out.loss, out.clip_frac, drift, float(masked_mean(entropy, batch.mask)))
