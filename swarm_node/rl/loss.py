"""Policy-gradient losses, registered by name. Shapes: per-token tensors are [N, T]; `mask` marks real
completion tokens (1.0) versus padding (0.0); advantages are per sequence [N].

All losses use token-level normalisation: the sum over every unmasked token of the minibatch divided by the
number of those tokens (DAPO), so long completions are not down-weighted. `is_weights` (detached, per token)
multiply each token's term before that mean: a token of weight 0 adds nothing to the sum yet still counts in the
denominator (prime-rl's masking), so dropping a token never enlarges the others' weight.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from swarm_node import variants
from swarm_node.rl.logprobs import EXCLUDED_LOG_PROB


@dataclass(frozen=True)
class LossInputs:
    logp: torch.Tensor  # [N, T] log-probs under the policy being trained (requires grad)
    old_logp: torch.Tensor  # [N, T] log-probs the ratio is taken against (behaviour or proximal policy)
    advantages: torch.Tensor  # [N]
    mask: torch.Tensor  # [N, T] float
    is_weights: torch.Tensor | None = None  # [N, T] detached truncated importance weights, or None
    ref_logp: torch.Tensor | None = None  # [N, T] reference-policy log-probs for the KL term, or None


@dataclass(frozen=True)
class LossConfig:
    eps_low: float = 0.2
    eps_high: float = 0.28  # asymmetric clip (SAPO / DAPO clip-higher)
    kl_coef: float = 0.0


@dataclass
class LossOutput:
    loss: torch.Tensor  # scalar
    clip_frac: float
    kl: float


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (values * mask).sum() / mask.sum().clamp(min=1.0)


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token KL(pi || ref) estimator k3 = exp(ref - logp) - (ref - logp) - 1 >= 0 (Schulman)."""
    delta = ref_logp - logp
    return delta.exp() - delta - 1.0


def behaviour_drift(logp: torch.Tensor, behaviour_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """k3 between the trained policy and the behaviour one, token-mean over the completion tokens that both sample
    (neither log-prob at EXCLUDED_LOG_PROB): a token one of them excludes would count about e^79 and make the mean
    meaningless (a stale row of 64 versions put "kl" at 1e32)."""
    both = mask * (logp > EXCLUDED_LOG_PROB) * (behaviour_logp > EXCLUDED_LOG_PROB)
    return masked_mean(torch.where(both.bool(), kl_k3(logp, behaviour_logp), 0.0), both)


def truncated_is_weights(proximal_logp: torch.Tensor, behaviour_logp: torch.Tensor,
                         cap: float | torch.Tensor) -> torch.Tensor:
    """min(pi_proximal / mu_behaviour, cap) per token, detached: corrects for rollouts from another policy. `cap`
    is one number, or a tensor broadcast against the log-probs (e.g. [N, 1]: one cap per row)."""
    ratio = (proximal_logp - behaviour_logp).exp()
    if isinstance(cap, torch.Tensor):
        return torch.minimum(ratio, cap).detach()
    return ratio.clamp(max=cap).detach()


LossFn = Callable[[LossInputs, LossConfig], LossOutput]
LOSSES: variants.Registry[LossFn] = variants.Registry("loss", variants.LOSSES)
register = LOSSES.register


@register("grpo")
def clipped_surrogate(inp: LossInputs, cfg: LossConfig) -> LossOutput:
    """-min(r A, clip(r, 1-eps_low, 1+eps_high) A), token-mean, plus kl_coef * k3 when a reference is given."""
    ratio = (inp.logp - inp.old_logp).exp()
    adv = inp.advantages.to(ratio.dtype).unsqueeze(-1)
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - cfg.eps_low, 1.0 + cfg.eps_high) * adv
    per_token = -torch.minimum(unclipped, clipped)
    if inp.is_weights is not None:
        per_token = per_token * inp.is_weights
    loss = masked_mean(per_token, inp.mask)
    kl_value = 0.0
    if inp.ref_logp is not None and cfg.kl_coef > 0:
        kl = masked_mean(kl_k3(inp.logp, inp.ref_logp), inp.mask)
        loss = loss + cfg.kl_coef * kl
        kl_value = float(kl.detach())
    clip_frac = float(masked_mean((clipped < unclipped).to(ratio.dtype), inp.mask).detach())
    return LossOutput(loss=loss, clip_frac=clip_frac, kl=kl_value)
