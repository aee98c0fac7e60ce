"""Trainer behaviour on a tiny model: batch layout, on-policy ratio 1, non-finite skips, learning direction."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
import torch

from swarm_node.config import SamplerConfig, TrainConfig
from swarm_node.model.default_model import load_model
from swarm_node.rl.logprobs import processed_log_softmax
from swarm_node.train.batching import collate, group_minibatches
from swarm_node.train.trainer import Trainer
from swarm_node.types import TrainSample


def test_collate_layout() -> None:
    batch = collate([TrainSample([5, 6], [7, 1], [-0.5, -0.25], 1.0),
                     TrainSample([5], [8], [-2.0], -1.0, off_policy=True)], pad_id=0)
    assert batch.input_ids.tolist() == [[5, 6, 7, 1], [5, 8, 0, 0]]
    assert batch.attention.tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]
    # position i predicts token i+1: completion tokens of row 0 are predicted at positions 1 and 2
    assert batch.mask.tolist() == [[0.0, 1.0, 1.0], [1.0, 0.0, 0.0]]
    assert batch.behaviour.tolist() == [[0.0, -0.5, -0.25], [-2.0, 0.0, 0.0]]
    assert batch.targets.tolist() == [[6, 7, 1], [8, 0, 0]]
    assert batch.off_policy.tolist() == [False, True]


def test_collate_token_weights_and_row_caps() -> None:
    plain = collate([TrainSample([5, 6], [7, 1], [-0.5, -0.25], 1.0)], pad_id=0)
    assert plain.token_weights is None and plain.is_cap is None  # absent: the old computation, unchanged
    batch = collate([TrainSample([5, 6], [7, 1], [-0.5, -0.25], 1.0),
                     TrainSample([5], [8], [-2.0], -1.0, off_policy=True, token_weights=[0.25], is_cap=0.5)],
                    pad_id=0)
    assert batch.token_weights is not None and batch.is_cap is not None
    # 1 at a sample's completion tokens when it has no weights of its own, 0 at padding and prompt positions
    assert batch.token_weights.tolist() == [[0.0, 1.0, 1.0], [0.25, 0.0, 0.0]]
    assert math.isnan(batch.is_cap[0]) and batch.is_cap[1] == 0.5
    with pytest.raises(ValueError, match="1 completion tokens but 2 token weights"):
        collate([TrainSample([5], [8], [-2.0], -1.0, token_weights=[1.0, 1.0])], pad_id=0)


def test_collate_rejects_mismatched_logprobs() -> None:
    with pytest.raises(ValueError, match="2 completion tokens but 1 log-probs"):
        collate([TrainSample([5], [7, 1], [-0.5], 1.0)], pad_id=0)


def _on_policy_sample(model: torch.nn.Module, prompt: list[int], completion: list[int], adv: float,
                      temperature: float) -> TrainSample:
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + completion])).logits[0]
    lp = processed_log_softmax(logits, temperature)
    behaviour = [float(lp[len(prompt) - 1 + j, tok]) for j, tok in enumerate(completion)]
    return TrainSample(prompt, completion, behaviour, adv)


def test_first_minibatch_is_on_policy_and_update_moves_toward_advantage(tiny_model_dir: Path) -> None:
    model, tok = load_model(tiny_model_dir)
    trainer = Trainer(model, TrainConfig(lr=1e-2, minibatches=1), SamplerConfig(temperature=0.7), tok.pad_token_id)
    prompt = tok.encode("1 + 2 =\nAnswer: ")
    good, bad = tok.encode("3") + [tok.eos_token_id], tok.encode("4") + [tok.eos_token_id]
    samples = [_on_policy_sample(model, prompt, good, 1.0, 0.7), _on_policy_sample(model, prompt, bad, -1.0, 0.7)]
    stats = trainer.train_step(samples)
    assert stats.minibatches == 1 and stats.skipped_minibatches == 0
    assert stats.clip_frac == 0.0  # ratio exactly 1 before the first update
    assert stats.kl == pytest.approx(0.0, abs=1e-6)
    assert stats.tokens == 4
    after_good = _on_policy_sample(model, prompt, good, 0, 0.7).behaviour_logprobs
    after_bad = _on_policy_sample(model, prompt, bad, 0, 0.7).behaviour_logprobs
    assert after_good[0] > samples[0].behaviour_logprobs[0]
    assert after_bad[0] < samples[1].behaviour_logprobs[0]


def test_non_finite_loss_never_reaches_parameters(tiny_model_dir: Path) -> None:
    model, tok = load_model(tiny_model_dir)
    trainer = Trainer(model, TrainConfig(minibatches=2), SamplerConfig(), tok.pad_token_id)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    samples = [TrainSample(tok.encode("1 + 2 ="), [10, 1], [-1.0, -1.0], math.nan),
               TrainSample(tok.encode("3 + 4 ="), [11, 1], [-1.0, -1.0], float("inf"))]
    stats = trainer.train_step(samples)
    assert stats.minibatches == 2 and stats.skipped_minibatches == 2
    assert trainer.skipped_total == 2
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert all(not s for s in trainer.optimizer.state.values())  # Adam moments untouched too


def test_minibatches_keep_groups_whole() -> None:
    samples = [TrainSample([p], [9], [-1.0], 0.0) for p in (1, 2, 1, 3, 2, 1, 3)]
    chunks = group_minibatches(samples, 2, random.Random(0))
    assert sorted(i for c in chunks for i in c) == list(range(7))
    prompts = [{samples[i].prompt_ids[0] for i in c} for c in chunks]
    assert prompts[0].isdisjoint(prompts[1])  # no prompt's group is split across minibatches
    assert {len(p) for p in prompts} == {1, 2}  # three groups over two minibatches
    assert group_minibatches(samples, 4, random.Random(0))[3] == []  # more minibatches than groups: empty ones


def test_microbatched_train_step_takes_the_same_step(tiny_model_dir: Path) -> None:
    """A tiny token budget (every row its own micro-batch) and the default one give the same parameters."""
    prompts = [[5, 6, 7], [8, 9, 10, 11, 12, 13], [14, 15]]
    samples = [TrainSample(p, [20 + k] * (1 + 3 * k) + [1], [-1.0 - 0.1 * k] * (2 + 3 * k), (-1.0) ** k,
                           off_policy=(k == 1)) for p in prompts for k in range(4)]
    results = []
    for budget in (8192, 1):
        model, tok = load_model(tiny_model_dir)
        trainer = Trainer(model, TrainConfig(lr=1e-3, minibatches=2, warmup_steps=0, microbatch_tokens=budget),
                          SamplerConfig(), tok.pad_token_id, seed=3)
        stats = trainer.train_step(samples)
        results.append((stats, {k: v.clone() for k, v in model.state_dict().items()}))
    (whole, params_whole), (split, params_split) = results
    assert (whole.minibatches, whole.skipped_minibatches, whole.tokens) == (2, 0, split.tokens)
    assert split.skipped_minibatches == 0
    for k in ("loss", "clip_frac", "kl", "entropy", "grad_norm"):
        assert getattr(split, k) == pytest.approx(getattr(whole, k), rel=1e-4, abs=1e-6), k
    for k, v in params_whole.items():
        assert torch.allclose(params_split[k], v, rtol=1e-4, atol=1e-6), k
