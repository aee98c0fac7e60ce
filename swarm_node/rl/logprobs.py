"""The one definition of a token's log-probability that sampler and trainer share.

"Processed" log-probs: log-softmax of logits / temperature after top-p filtering, renormalised over the nucleus:
the distribution the token was actually drawn from (vLLM's `logprobs_mode="processed_logprobs"`). With
temperature 0 (greedy) the raw log-softmax is used. With `vocab` (the tokenizer's length), the rows of a padded
embedding past it (Qwen2.5 pads 151,665 tokens to 151,936) are never a token: -inf before anything else, as the
samplers never sample them.
"""

from __future__ import annotations

import torch


def processed_log_softmax(logits: torch.Tensor, temperature: float, top_p: float = 1.0,
                          vocab: int | None = None) -> torch.Tensor:
    """logits [..., V] -> log-probs [..., V] of the sampling distribution (-inf outside the nucleus and past
    `vocab`)."""
    logits = logits.float()
    if vocab is not None and vocab < logits.shape[-1]:
        logits = logits.clone()
        logits[..., vocab:] = float("-inf")
    if temperature > 0:
        logits = logits / temperature
    if top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        # Keep the smallest prefix whose mass reaches top_p: a token is dropped when the mass before it >= top_p.
        mass_before = probs.cumsum(dim=-1) - probs
        drop_sorted = mass_before >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits.log_softmax(dim=-1)


def entropy_from_log_probs(log_probs: torch.Tensor) -> torch.Tensor:
    """Entropy [...] of the distribution given by log-probs [..., V] (-inf entries contribute 0)."""
    probs = log_probs.exp()
    return -(probs * log_probs.masked_fill(probs == 0, 0.0)).sum(dim=-1)
