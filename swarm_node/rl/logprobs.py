"""The one definition of a token's log-probability that sampler and trainer share.

"Processed" log-probs: log-softmax of logits / temperature after top-p filtering, renormalised over the nucleus:
the distribution the token was actually drawn from (vLLM's `logprobs_mode="processed_logprobs"`). With
temperature 0 (greedy) the raw log-softmax is used. With `vocab` (the tokenizer's length), the rows of a padded
embedding past it (Qwen2.5 pads 151,665 tokens to 151,936) are never a token: -inf before anything else, as the
samplers never sample them.

`chunked_token_log_probs(hidden, head, targets, ...)` is the trainer's path to the same numbers without the
full-vocabulary logits of every position at once: the output head runs on `chunk` positions at a time (a
151,936-token vocabulary makes one 1,099-token row's fp32 logits ~0.6 GiB, times the softmax copies), and under
autograd each chunk is checkpointed, so backward recomputes its logits one chunk at a time instead of keeping them
all. `logprob_chunk(vocab_rows)` sizes a chunk by its logits (`LOGPROB_CHUNK_ELEMENTS`), not by positions: a small
vocabulary's positions all fit in one chunk, which is computed once and kept (recomputing it would only cost time:
backward of the default model's steps was 50% slower with every 256 positions checkpointed, bench/step_rate).
The token log-probs and entropies are those of `processed_log_softmax` on the whole logits, and so are the
gradients (tests/unit/test_logprob_chunks.py).

`trainable_log_probs(token_lp, mask)` is what a loss multiplies by masks: a target the processed distribution
excludes (outside the top-p nucleus, past the tokenizer) has log-prob -inf, and 0 * -inf is NaN, so a loss over a
padded row, or over a completion token the trainer's nucleus excludes (a peer's token, a stale row's token, a token
at the nucleus' edge), was NaN and its whole minibatch skipped. There such a target is `EXCLUDED_LOG_PROB`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils.checkpoint import checkpoint

# fp32 logits that exist at once: 256 positions of Qwen2.5's padded 151,936-token vocabulary (~148 MiB)
LOGPROB_CHUNK_ELEMENTS = 256 * 151_936
# An excluded target's log-prob: its probability is ~0 (e^-80 ~ 2e-35) and it gets no gradient, like -inf; and
# exp(0 - EXCLUDED_LOG_PROB) stays finite in fp32 (its max is e^88.7), so a KL or ratio against a log-prob in
# [EXCLUDED_LOG_PROB, 0] stays finite too.
EXCLUDED_LOG_PROB = -80.0
NUCLEUS_CANDIDATES = 64  # tokens sorted first when finding a top-p nucleus (nucleus())


def logprob_chunk(vocab_rows: int) -> int:
    """Positions whose full-vocabulary logits the trainer holds at once (train/memory_estimate.py counts them)."""
    if vocab_rows < 1:
        raise ValueError(f"vocab_rows must be positive, got {vocab_rows}")
    return max(1, LOGPROB_CHUNK_ELEMENTS // vocab_rows)


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
        logits = logits.masked_fill(~nucleus(logits, top_p), float("-inf"))
    return logits.log_softmax(dim=-1)


@torch.no_grad()  # a mask: nothing to differentiate
def nucleus(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """[..., V] bool: the smallest prefix of each row's tokens, by descending logit, whose mass reaches top_p (a
    token is dropped when the mass before it >= top_p). Sorting a row is what costs (CPU sorts are slow), and the
    nucleus of a peaked distribution holds a few tokens: a row whose most likely token alone reaches top_p keeps
    it alone; the others sort their `NUCLEUS_CANDIDATES` most likely tokens, and only a row whose nucleus reaches
    past those sorts the whole row."""
    log_norm = logits.logsumexp(dim=-1, keepdim=True)
    top_logit, top_index = logits.max(dim=-1, keepdim=True)
    keep = torch.zeros(logits.shape, dtype=torch.bool, device=logits.device).scatter_(-1, top_index, True)
    wider = (top_logit - log_norm)[..., 0].exp() < top_p
    if wider.any():
        keep[wider] = _sorted_prefix(logits[wider], log_norm[wider], top_p, NUCLEUS_CANDIDATES)
    return keep


def _sorted_prefix(logits: torch.Tensor, log_norm: torch.Tensor, top_p: float, candidates: int) -> torch.Tensor:
    """nucleus() of rows [N, V] from their `candidates` most likely tokens; the whole row where that is short."""
    candidates = min(candidates, logits.shape[-1])
    top_logits, order = logits.topk(candidates, dim=-1)  # sorted, descending
    probs = (top_logits - log_norm).exp()
    keep = torch.zeros(logits.shape, dtype=torch.bool, device=logits.device)
    keep.scatter_(-1, order, probs.cumsum(dim=-1) - probs < top_p)
    short = probs.sum(dim=-1) < top_p  # rows whose nucleus reaches past the candidates
    if short.any() and candidates < logits.shape[-1]:
        keep[short] = _sorted_prefix(logits[short], log_norm[short], top_p, logits.shape[-1])
    return keep


def entropy_from_log_probs(log_probs: torch.Tensor) -> torch.Tensor:
    """Entropy [...] of the distribution given by log-probs [..., V] (-inf entries contribute 0)."""
    probs = log_probs.exp()
    return -(probs * log_probs.masked_fill(probs == 0, 0.0)).sum(dim=-1)


def chunked_token_log_probs(hidden: torch.Tensor, head: Callable[[torch.Tensor], torch.Tensor],
                            targets: torch.Tensor, temperature: float, top_p: float = 1.0, vocab: int | None = None,
                            chunk: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    """hidden [P, H] (the positions' last hidden states), head: [p, H] -> logits [p, V], targets [P] -> the
    processed log-prob [P] of each target and the entropy [P] of each position's distribution (no gradient)."""
    if chunk < 1:
        raise ValueError(f"chunk must be positive, got {chunk}")

    def one(h: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        log_probs = processed_log_softmax(head(h), temperature, top_p, vocab)
        return log_probs.gather(-1, t.unsqueeze(-1)).squeeze(-1), entropy_from_log_probs(log_probs.detach())

    # Checkpointing only pays under autograd and with more than one chunk; without autograd (a reference model, a
    # re-score) each chunk's logits are freed as soon as its log-probs are taken, and a single chunk is the most
    # that is held anyway.
    recompute = torch.is_grad_enabled() and hidden.requires_grad and hidden.shape[0] > chunk
    parts = [checkpoint(one, hidden[i:i + chunk], targets[i:i + chunk], use_reentrant=False) if recompute
             else one(hidden[i:i + chunk], targets[i:i + chunk]) for i in range(0, hidden.shape[0], chunk)]
    if not parts:
        empty = hidden.new_zeros(0, dtype=torch.float32)
        return empty, empty
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


def trainable_log_probs(token_lp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """token_lp [N, T] with each -inf (an excluded target) at `EXCLUDED_LOG_PROB` and 0 where `mask` is 0 (prompt
    and padding positions, where the behaviour log-probs are 0 too): finite wherever token_lp is not NaN. The
    gradient of a kept value is unchanged; a replaced one gets none."""
    finite = torch.where(torch.isneginf(token_lp), torch.full_like(token_lp, EXCLUDED_LOG_PROB), token_lp)
    return torch.where(mask.bool(), finite, torch.zeros_like(token_lp))
