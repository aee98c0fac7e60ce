"""Corrections of our own stale rollouts (rows sampled by an older policy mu), registered by name (`STALE_CORRECTIONS`).

A correction sees one minibatch's stale rows (`StaleBatch`: per token the log-ratio log pi_proximal - log mu, where
pi_proximal is the policy being trained, before this minibatch's update) and says how they train (`StaleWeights`):
whether the PPO ratio is taken against the proximal policy or against mu, a detached weight per token multiplying
its loss term, the advantages, and a factor on this minibatch's learning rate. Rows that are not stale are left
exactly as they are (and a minibatch without stale rows keeps its learning rate). Shapes: [N, T] per token, [N] per
row; `mask` is 1.0 at the stale rows' completion tokens.
- "none": the stale rows train as if on-policy: the ratio pi/mu, clipped as the loss clips it (plain GRPO/PPO).
- "tis": AReaL's decoupled objective: the ratio against the proximal policy, each token weighted by
  min(pi_proximal / mu, cap) (truncated IS; the trainer's behaviour before this registry).
- "m2po": M2PO (Zheng et al., 2025, "Prosperity before Collapse"): no trust-region clip; each token weighted by
  the untruncated pi_proximal / mu, and the tokens with the largest (log r)^2 masked (weight 0) until the mean of
  (log r)^2 over the minibatch's remaining stale tokens is <= `bound` (M2PO's tau_M2).
- "vcpo": VCPO (Huang et al., 2026, "Stable Asynchrony"): tis's weights; the learning rate scaled by
  sqrt(ESS / n), ESS = (sum w)^2 / sum w^2 over the minibatch's n rows with w the sequence weight
  prod_t pi_proximal / mu (1 for a row that is not stale); and each group's advantages re-centred on the
  off-policy baseline b* = sum_i w_i^2 A_i / sum_i w_i^2 over the group's rows (the paper's closed form with
  every per-sample gradient norm taken equal: see docs/ROLLOUT_METHODS.md).
Sequence weights are handled in log space (shifted by their maximum), so no product of ratios overflows.
Pure tensor code: no model, no optimizer, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from swarm_node import variants

M2PO_BOUND = 0.04  # M2PO's tau_M2, as config/train.M2PO_BOUND (the default of [train.stale_correction] bound)


@dataclass(frozen=True)
class StaleBatch:
    log_ratio: torch.Tensor  # [N, T] log pi_proximal - log mu, detached; 0 where mask is 0
    mask: torch.Tensor  # [N, T] float: 1.0 at the completion tokens of stale rows
    stale: torch.Tensor  # [N] bool: rows sampled by an older policy
    advantages: torch.Tensor  # [N]
    groups: torch.Tensor  # [N] int64: rows of one group (one prompt) share a key


@dataclass(frozen=True)
class StaleParams:
    cap: float = 2.0  # tis and vcpo: the truncation of the token weight (train.is_cap)
    bound: float = M2PO_BOUND  # m2po: the bound on the mean squared log-ratio


@dataclass(frozen=True)
class StaleWeights:
    proximal_ratio: bool  # True: the stale rows' ratio is taken against pi_proximal; False: against mu
    token_weights: torch.Tensor | None  # [N, T] detached weights of the stale rows' tokens, or None (all 1)
    advantages: torch.Tensor  # [N]
    lr_scale: float = 1.0
    stats: dict[str, float] = field(default_factory=dict)  # reported per step (metrics.jsonl: stale_<name>)


@dataclass(frozen=True)
class StaleCorrection:
    apply: Callable[[StaleBatch, StaleParams], StaleWeights]
    # True: the correction needs the whole minibatch at once (a batch statistic), not one micro-batch at a time
    whole_minibatch: bool = False


STALE_CORRECTIONS: variants.Registry[StaleCorrection] = variants.Registry("train.stale_correction.kind",
                                                                          variants.STALE_CORRECTIONS)


def m2po_keep(log_ratio: torch.Tensor, mask: torch.Tensor, bound: float) -> torch.Tensor:
    """[N, T]: 1.0 where a masked-in token is kept, 0.0 where M2PO masks it or `mask` is 0. The fewest tokens of
    largest (log r)^2 are masked (ties: the first in row-major order first) such that the mean of (log r)^2 over
    the kept tokens is <= bound; masking all of them leaves nothing to bound."""
    selected = mask.bool()
    squares = log_ratio[selected].double().square()
    n = squares.numel()
    keep = torch.zeros_like(mask)
    if n == 0:
        return keep
    ordered, order = torch.sort(squares, descending=True, stable=True)
    # after masking the k largest: the mean of the n - k others, from exact suffix sums
    suffix = ordered.flip(0).cumsum(0).flip(0)
    remaining_mean = suffix / torch.arange(n, 0, -1, dtype=torch.float64, device=squares.device)
    within = torch.nonzero(remaining_mean <= bound)
    k = int(within[0]) if within.numel() else n
    kept = torch.ones(n, dtype=mask.dtype, device=mask.device)
    kept[order[:k]] = 0.0
    keep[selected] = kept
    return keep


def sequence_log_weights(batch: StaleBatch) -> torch.Tensor:
    """[N]: log prod_t pi_proximal / mu over each stale row's tokens; 0 for a row that is not stale."""
    return (batch.log_ratio.double() * batch.mask).sum(-1) * batch.stale


def ess_ratio(log_weights: torch.Tensor) -> float:
    """ESS / n = (sum w)^2 / (n sum w^2), in (0, 1], from log w (invariant to a common factor of the w)."""
    if log_weights.numel() == 0:
        return 1.0
    w = (log_weights.double() - log_weights.max()).exp()
    return float(w.sum().square() / (w.numel() * w.square().sum()))


def off_policy_baseline_advantages(advantages: torch.Tensor, log_weights: torch.Tensor, groups: torch.Tensor,
                                   stale: torch.Tensor) -> torch.Tensor:
    """The advantages of each group with a stale row, minus b* = sum w^2 A / sum w^2 over the group's rows; other
    groups unchanged. An estimator affine in the rewards (A = (r - c) / s) becomes (r - b*_r) / s, b*_r the same
    weighted mean of the rewards."""
    out = advantages.double().clone()
    if not bool(stale.any()):
        return advantages
    for key in torch.unique(groups[stale]):
        rows = groups == key
        lw = log_weights[rows].double()
        w2 = (2.0 * (lw - lw.max())).exp()
        out[rows] = out[rows] - (w2 * out[rows]).sum() / w2.sum()
    return out.to(advantages.dtype)


def _truncated(batch: StaleBatch, cap: float) -> torch.Tensor:
    # the same operations as rl.loss.truncated_is_weights, so "tis" reproduces the trainer's weights bit for bit
    return batch.log_ratio.exp().clamp(max=cap).detach()


def plain(batch: StaleBatch, params: StaleParams) -> StaleWeights:
    return StaleWeights(False, None, batch.advantages)


def truncated_is(batch: StaleBatch, params: StaleParams) -> StaleWeights:
    return StaleWeights(True, _truncated(batch, params.cap), batch.advantages)


def m2po(batch: StaleBatch, params: StaleParams) -> StaleWeights:
    keep = m2po_keep(batch.log_ratio, batch.mask, params.bound)
    tokens = float(batch.mask.sum())
    masked = tokens - float(keep.sum())
    weights = (batch.log_ratio.exp() * keep).detach()
    return StaleWeights(True, weights, batch.advantages, stats={"masked_frac": masked / tokens if tokens else 0.0})


def vcpo(batch: StaleBatch, params: StaleParams) -> StaleWeights:
    log_w = sequence_log_weights(batch)
    ratio = ess_ratio(log_w)
    advantages = off_policy_baseline_advantages(batch.advantages, log_w, batch.groups, batch.stale)
    return StaleWeights(True, _truncated(batch, params.cap), advantages, lr_scale=math.sqrt(ratio),
                        stats={"ess": ratio})


STALE_CORRECTIONS.add("none", StaleCorrection(plain))
STALE_CORRECTIONS.add("tis", StaleCorrection(truncated_is))
STALE_CORRECTIONS.add("m2po", StaleCorrection(m2po, whole_minibatch=True))
STALE_CORRECTIONS.add("vcpo", StaleCorrection(vcpo, whole_minibatch=True))
