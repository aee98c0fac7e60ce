"""Log-probs in chunks of positions (rl/logprobs.chunked_token_log_probs, Trainer.token_log_probs): the same
values and gradients as the full-vocabulary logits of every position at once, padded vocabulary rows still masked."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from swarm_node.config import SamplerConfig, TrainConfig
from swarm_node.model.default_model import load_model
from swarm_node.rl.logprobs import (
    NUCLEUS_CANDIDATES,
    chunked_token_log_probs,
    entropy_from_log_probs,
    logprob_chunk,
    nucleus,
    processed_log_softmax,
    trainable_log_probs,
)
from swarm_node.train.batching import collate
from swarm_node.train.trainer import Trainer
from swarm_node.types import TrainSample


def _whole(logits: torch.Tensor, targets: torch.Tensor, temperature: float, top_p: float,
           vocab: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    log_probs = processed_log_softmax(logits, temperature, top_p, vocab)
    return log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1), entropy_from_log_probs(log_probs.detach())


@pytest.mark.parametrize(("chunk", "top_p", "vocab"), [(1, 1.0, None), (3, 0.8, None), (4, 1.0, 9), (64, 0.9, 9)])
def test_chunks_equal_the_whole_logits_values_and_gradients(chunk: int, top_p: float, vocab: int | None) -> None:
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(10, 5, dtype=torch.float64, generator=gen)
    weight = torch.randn(11, 5, dtype=torch.float64, generator=gen)  # 11 logits, of which 9 are tokens with vocab
    targets = torch.randint(0, 9, (10,), generator=gen)
    upstream = torch.randn(10, dtype=torch.float64, generator=gen)
    results = []
    for chunked in (False, True):
        h, w = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
        if chunked:
            lp, ent = chunked_token_log_probs(h, lambda x, w=w: x @ w.T, targets, 0.7, top_p, vocab, chunk)
        else:
            lp, ent = _whole(h @ w.T, targets, 0.7, top_p, vocab)
        (lp * upstream).sum().backward()
        assert not ent.requires_grad
        results.append((lp.detach(), ent, h.grad, w.grad))
    for whole, chunked in zip(*results, strict=True):
        assert torch.allclose(chunked, whole, rtol=0, atol=1e-12)
    assert results[1][1].shape == (10,)


def test_without_autograd_no_graph_is_kept() -> None:
    hidden = torch.randn(7, 3, requires_grad=True)
    weight = torch.randn(4, 3)
    with torch.no_grad():
        lp, ent = chunked_token_log_probs(hidden, lambda x: x @ weight.T, torch.zeros(7, dtype=torch.long), 1.0,
                                          chunk=2)
    assert lp.shape == ent.shape == (7,) and not lp.requires_grad
    with pytest.raises(ValueError, match="chunk must be positive"):
        chunked_token_log_probs(hidden, lambda x: x @ weight.T, torch.zeros(7, dtype=torch.long), 1.0, chunk=0)


def test_a_chunk_holds_a_fixed_number_of_logits() -> None:
    assert logprob_chunk(151_936) == 256  # Qwen2.5's padded vocabulary
    assert logprob_chunk(128_256) == 303  # Llama-3's: 38,895,616 // 128,256
    assert logprob_chunk(600) == 64_826
    assert logprob_chunk(10**9) == 1
    with pytest.raises(ValueError, match="vocab_rows must be positive"):
        logprob_chunk(0)


@pytest.mark.parametrize(("chunk", "head_calls"), [(7, 1), (100, 1), (3, 6)])
def test_only_several_chunks_are_recomputed_in_backward(chunk: int, head_calls: int) -> None:
    """One chunk covering every position is computed once and kept; several chunks (7 positions by 3: 3 chunks)
    are each computed again in backward."""
    hidden = torch.randn(7, 3, requires_grad=True)
    weight = torch.randn(4, 3)
    calls = []

    def head(x: torch.Tensor) -> torch.Tensor:
        calls.append(x.shape[0])
        return x @ weight.T

    lp, _ = chunked_token_log_probs(hidden, head, torch.zeros(7, dtype=torch.long), 1.0, chunk=chunk)
    lp.sum().backward()
    assert len(calls) == head_calls


def test_trainer_log_probs_and_gradients_match_the_model_logits(tiny_model_dir: Path) -> None:
    """The trainer's chunked path (decoder, then the head 5 positions at a time) against the model's own logits
    for whole rows, in float64; with a padded vocabulary (the tokenizer shorter than the embedding). Both made
    trainable (excluded targets finite, positions outside the completions 0), as the trainer returns them."""
    model, tokenizer = load_model(tiny_model_dir)
    model = model.double()
    vocab = len(tokenizer) - 3  # pretend the last 3 embedding rows are padding
    trainer = Trainer(model, TrainConfig(), SamplerConfig(temperature=0.8, top_p=0.9), pad_id=0, vocab=vocab)
    batch = collate([TrainSample([3, 4, 5, 6], [7, 8, 9, 10, 1], [-1.0] * 5, 1.0),
                     TrainSample([3, 4], [8, 1], [-1.0] * 2, -1.0)], pad_id=0)
    upstream = torch.randn(batch.targets.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    results = []
    for chunk in (0, 5):
        model.zero_grad(set_to_none=True)
        if chunk:
            trainer.logprob_chunk = chunk
            lp, ent = trainer.token_log_probs(model, batch)
        else:
            logits = model(input_ids=batch.input_ids, attention_mask=batch.attention).logits[:, :-1]
            lp, ent = _whole(logits, batch.targets, 0.8, 0.9, vocab)
            lp = trainable_log_probs(lp, batch.mask)  # the trainer's: 0 outside the completions
        (lp * upstream * batch.mask).sum().backward()
        results.append((lp.detach(), ent, {n: p.grad.clone() for n, p in model.named_parameters()}))
    (lp0, ent0, grads0), (lp1, ent1, grads1) = results
    assert lp1.shape == batch.targets.shape and torch.allclose(lp1, lp0, rtol=0, atol=1e-10)
    assert torch.allclose(ent1, ent0, rtol=0, atol=1e-10)
    assert grads1.keys() == grads0.keys()
    for name, grad in grads0.items():
        assert torch.allclose(grads1[name], grad, rtol=0, atol=1e-10), name


def _nucleus_by_full_sort(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """The definition: sort the whole row, keep a token while the mass before it is below top_p."""
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    probs = sorted_logits.softmax(dim=-1)
    return torch.zeros_like(logits, dtype=torch.bool).scatter(-1, order, probs.cumsum(dim=-1) - probs < top_p)


@pytest.mark.parametrize("top_p", [0.5, 0.8, 0.95])
def test_nucleus_from_the_top_candidates_equals_the_full_sort(top_p: float) -> None:
    """Peaked rows (the nucleus is the top token, or among the first candidates) and flat rows (past them: the whole
    row is sorted) in one batch, with the padded vocabulary's -inf columns, give the mask of the full sort."""
    gen = torch.Generator().manual_seed(0)
    peaked = 12.0 * torch.randn(300, 500, generator=gen)
    flat = 0.05 * torch.randn(100, 500, generator=gen)
    logits = torch.cat([peaked, flat])[torch.randperm(400, generator=gen)]
    logits[:, 450:] = float("-inf")
    kept = nucleus(logits, top_p)
    assert torch.equal(kept, _nucleus_by_full_sort(logits, top_p))
    sizes = kept.sum(-1)
    # every path ran: the top token alone, a prefix of the candidates, the whole row sorted
    assert (sizes == 1).any() and ((sizes > 1) & (sizes < NUCLEUS_CANDIDATES)).any()
    assert (sizes > NUCLEUS_CANDIDATES).any()
    assert not kept[:, 450:].any()
