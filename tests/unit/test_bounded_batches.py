"""Memory bounded by construction: micro-batches under a token budget, and gradients equal to the unsplit batch."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from swarm_node.config import SamplerConfig, TrainConfig
from swarm_node.model.default_model import load_model
from swarm_node.train.batching import collate, microbatch_plan, sample_length
from swarm_node.train.trainer import Trainer
from swarm_node.types import TrainSample

LONG = 256  # the model's whole context: the longest row the share bounds let through
SHORT = 20


def test_one_long_row_is_padded_alone_not_with_the_batch() -> None:
    lengths = [SHORT] * 40 + [LONG] + [SHORT] * 23  # 64 rows, as a default minibatch
    budget = 512
    plan = microbatch_plan(lengths, budget)
    assert sorted(i for rows in plan for i in rows) == list(range(64))
    padded = [len(rows) * max(lengths[i] for i in rows) for rows in plan]
    # By hand: the long row is alone (a short row would be padded to over twice its length); the short rows go
    # 512 // 20 = 25 to a micro-batch of width 20. Unsplit, the batch would be 64 x 256 = 16384 positions.
    assert plan[0] == [40]
    assert max(padded) <= budget
    assert all(max(lengths[i] for i in rows) == SHORT and len(rows) <= budget // SHORT for rows in plan[1:])
    assert sum(padded) == LONG + 63 * SHORT  # no short row is padded to the long one


def test_a_long_row_alone_is_the_largest_microbatch_even_under_a_large_budget() -> None:
    lengths = [SHORT] * 63 + [LONG]
    plan = microbatch_plan(lengths, 8192)
    assert plan == [[63], list(range(63))]  # 256 and 63 x 20 = 1260 positions, not 64 x 256 = 16384


def test_collated_microbatches_respect_the_budget_shapes() -> None:
    samples = [TrainSample([5] * (SHORT - 2), [7, 1], [-0.5, -0.5], 1.0) for _ in range(63)]
    samples.insert(17, TrainSample([5] * 60, [7] * (LONG - 61) + [1], [-0.5] * (LONG - 60), -1.0))
    budget = 300
    plan = microbatch_plan([sample_length(s) for s in samples], budget)
    batches = [collate([samples[i] for i in rows], pad_id=0) for rows in plan]
    # The largest tensor a micro-batch allocates is its logits, [rows, width - 1, vocab]: rows x width bounds it.
    assert [tuple(b.input_ids.shape) for b in batches][0] == (1, LONG)  # 2 x 256 > 300: alone
    assert all(b.input_ids.numel() <= max(budget, LONG) for b in batches)
    assert all(b.input_ids.shape[1] == SHORT and b.input_ids.shape[0] <= budget // SHORT for b in batches[1:])
    assert sum(b.mask.sum() for b in batches) == sum(len(s.completion_ids) for s in samples)


def test_plan_covers_every_row_once_within_budget() -> None:
    rng = random.Random(3)
    for _ in range(200):
        lengths = [rng.randint(1, 300) for _ in range(rng.randint(0, 80))]
        budget = rng.randint(1, 2000)
        plan = microbatch_plan(lengths, budget)
        assert sorted(i for rows in plan for i in rows) == list(range(len(lengths)))
        for rows in plan:
            width = max(lengths[i] for i in rows)
            assert len(rows) == 1 or len(rows) * width <= budget
            assert lengths[rows[0]] == width  # sorted longest first: the first row sets the width
            assert all(2 * lengths[i] > width for i in rows)  # padding at most doubles a row
        assert sum(len(rows) * max(lengths[i] for i in rows) for rows in plan) < 2 * sum(lengths) + 1
    with pytest.raises(ValueError):
        microbatch_plan([3], 0)


def test_default_budget_keeps_a_default_minibatch_whole() -> None:
    # 16 prompts x 8 completions / 2 minibatches = 64 rows of ~76 prompt + 8 completion tokens: one micro-batch.
    assert len(microbatch_plan([76 + 8] * 64, TrainConfig().microbatch_tokens)) == 1


def _samples(seed: int) -> list[TrainSample]:
    """Three groups of mixed lengths, random behaviour log-probs and advantages, some rows off-policy."""
    rng = random.Random(seed)
    out = []
    for g in range(3):
        prompt = [rng.randint(2, 98) for _ in range(rng.randint(3, 30))]
        for j in range(4):
            n = rng.choice([1, 2, 8, 40])
            completion = [rng.randint(2, 98) for _ in range(n - 1)] + [1]
            out.append(TrainSample(prompt, completion, [-rng.uniform(0.5, 6.0) for _ in range(n)],
                                   rng.uniform(-1.5, 1.5), off_policy=(g == 1 and j % 2 == 0)))
    return out


@pytest.mark.parametrize("kl_coef", [0.0, 0.05])
def test_microbatched_loss_and_gradient_equal_the_single_batch(tiny_model_dir: Path, kl_coef: float) -> None:
    model, tok = load_model(tiny_model_dir)
    torch.manual_seed(0)
    trainer = Trainer(model, TrainConfig(kl_coef=kl_coef, minibatches=1, microbatch_tokens=64),
                      SamplerConfig(temperature=0.7), tok.pad_token_id)
    if trainer.ref_model is not None:  # a reference that differs from the policy, so the KL term has a gradient
        with torch.no_grad():
            for p in trainer.ref_model.parameters():
                p.add_(0.05 * torch.randn_like(p))
    samples = _samples(0)
    whole = trainer.accumulate([collate(samples, tok.pad_token_id)])
    grads_whole = [p.grad.clone() for p in trainer.params]
    micro = trainer.microbatches(samples)
    assert len(micro) >= 5 and all(b.input_ids.numel() <= max(64, b.input_ids.shape[1]) for b in micro)
    split = trainer.accumulate(micro)
    assert whole is not None and split is not None
    for k in ("loss", "clip_frac", "kl", "entropy"):
        assert split[k] == pytest.approx(whole[k], rel=1e-5, abs=1e-7), k
    assert whole["loss"] != 0.0 and (kl_coef == 0.0 or whole["kl"] > 0.0)
    for p, g in zip(trainer.params, grads_whole, strict=True):
        assert torch.allclose(p.grad, g, rtol=1e-4, atol=1e-7), float((p.grad - g).abs().max())


def test_a_non_finite_microbatch_skips_the_whole_minibatch(tiny_model_dir: Path) -> None:
    model, tok = load_model(tiny_model_dir)
    trainer = Trainer(model, TrainConfig(minibatches=1, microbatch_tokens=16), SamplerConfig(), tok.pad_token_id)
    samples = _samples(1)
    samples[-1] = TrainSample(samples[-1].prompt_ids, samples[-1].completion_ids, samples[-1].behaviour_logprobs,
                              float("nan"))
    assert len(trainer.microbatches(samples)) > 1
    before = {k: v.clone() for k, v in model.state_dict().items()}
    stats = trainer.train_step(samples)
    assert (stats.minibatches, stats.skipped_minibatches) == (1, 1)
    assert all(p.grad is None for p in trainer.params)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_trainer_rejects_a_non_positive_budget(tiny_model_dir: Path) -> None:
    model, tok = load_model(tiny_model_dir)
    with pytest.raises(ValueError, match="microbatch_tokens"):
        Trainer(model, TrainConfig(microbatch_tokens=0), SamplerConfig(), tok.pad_token_id)
