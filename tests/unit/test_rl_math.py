"""GRPO math against hand-computed numbers."""

from __future__ import annotations

import math

import pytest
import torch

from swarm_node import tasks
from swarm_node.rl.advantages import ADVANTAGE_ESTIMATORS, grpo_advantages
from swarm_node.rl.logprobs import entropy_from_log_probs, processed_log_softmax
from swarm_node.rl.loss import LossConfig, LossInputs, behaviour_drift, clipped_surrogate, kl_k3, truncated_is_weights
from swarm_node.train.scoring import score_group, to_samples
from swarm_node.types import Completion

SAPO_CLIP = LossConfig(eps_low=0.2, eps_high=0.28)


def t(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def test_grpo_two_right_two_wrong() -> None:
    assert grpo_advantages(t(1, 0, 0, 1)).tolist() == [1.0, -1.0, -1.0, 1.0]


def test_grpo_one_right_of_four() -> None:
    # mean 0.25, population std sqrt(0.1875) = 0.4330127
    expected = [0.75 / math.sqrt(0.1875)] + [-0.25 / math.sqrt(0.1875)] * 3
    assert grpo_advantages(t(1, 0, 0, 0)).tolist() == pytest.approx(expected, abs=1e-12)
    assert expected[0] == pytest.approx(1.7320508, abs=1e-7)


@pytest.mark.parametrize("name", sorted(ADVANTAGE_ESTIMATORS))
def test_no_signal_groups_are_zero(name: str) -> None:
    fn = ADVANTAGE_ESTIMATORS[name]
    assert fn(t(1.0)).tolist() == [0.0]
    assert fn(t(0.5, 0.5, 0.5)).tolist() == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("name", ["grpo", "dr_grpo"])
def test_mean_baselines_sum_to_zero(name: str) -> None:
    adv = ADVANTAGE_ESTIMATORS[name](t(0.1, 0.9, 0.3, 0.0, 1.0))
    assert float(adv.sum()) == pytest.approx(0.0, abs=1e-12)


def test_dr_grpo_and_median_baselines() -> None:
    assert ADVANTAGE_ESTIMATORS["dr_grpo"](t(1, 0, 0, 0)).tolist() == [0.75, -0.25, -0.25, -0.25]
    assert ADVANTAGE_ESTIMATORS["median"](t(1, 0, 2)).tolist() == [0.0, -1.0, 1.0]


def test_mc_grpo_median_of_g_plus_1_completions_and_its_pivot() -> None:
    """MC-GRPO (Kim 2026): G + 1 completions (odd), the median as the baseline, the median completion (the pivot,
    advantage 0) left out of the loss so that G train."""
    median = ADVANTAGE_ESTIMATORS["median"]
    assert median(t(1, 0, 0)).tolist() == [1.0, 0.0, 0.0] and median.pivot(t(1, 0, 0)) == 1  # the first 0
    assert median(t(0.5, 1, 0)).tolist() == [0.0, 0.5, -0.5] and median.pivot(t(0.5, 1, 0)) == 0
    assert median(t(0, 1, 1, 0, 1)).tolist() == [-1.0, 0.0, 0.0, -1.0, 0.0] and median.pivot(t(0, 1, 1, 0, 1)) == 1
    # an even group: the mean of the two middle rewards (not torch's lower median 0), and no pivot
    assert median(t(1, 0, 0, 1)).tolist() == [0.5, -0.5, -0.5, 0.5] and median.pivot(t(1, 0, 0, 1)) is None
    assert median.pivot(t(1, 1, 1)) is None  # no signal
    assert ADVANTAGE_ESTIMATORS["grpo"].pivot(t(1, 0, 0)) is None


def test_the_pivot_trains_no_row() -> None:
    inst = tasks.TaskInstance(tasks.TaskRef("chain_sum", "{}", 0, 0), "q", "7", "q\nAnswer: ", {})
    completions = [Completion((10 + k, 1), text, (-1.0, -1.0), 0) for k, text in enumerate(["7", "8", "9"])]
    def reward(_: tasks.TaskInstance, text: str, fmt: tasks.PromptFormat) -> float:
        return {"7": 1.0, "8": 0.0, "9": 0.0}[text]
    group = score_group(inst, (5, 6), completions, reward, "median")
    assert (group.advantages, group.pivot) == ((1.0, 0.0, 0.0), 1)
    samples = to_samples([group])
    assert [(s.completion_ids, s.advantage) for s in samples] == [((10, 1), 1.0), ((12, 1), 0.0)]
    mean = score_group(inst, (5, 6), completions, reward, "dr_grpo")
    assert mean.pivot is None and len(to_samples([mean])) == 3


def _inputs(ratios: list[float], adv: list[float], mask: list[float] | None = None) -> LossInputs:
    old = torch.log(torch.full((1, len(ratios)), 0.5))
    logp = (old + torch.log(torch.tensor([ratios]))).requires_grad_(True)
    m = torch.tensor([mask if mask is not None else [1.0] * len(ratios)])
    return LossInputs(logp=logp, old_logp=old, advantages=torch.tensor(adv), mask=m)


def test_clip_positive_advantage() -> None:
    inp = _inputs([1.5, 0.5], [1.0])
    out = clipped_surrogate(inp, SAPO_CLIP)
    # token 1: min(1.5, 1.28) = 1.28 (clipped); token 2: min(0.5, 0.8) = 0.5; loss = -(1.28 + 0.5) / 2
    assert float(out.loss) == pytest.approx(-0.89, abs=1e-6)
    assert out.clip_frac == pytest.approx(0.5)
    out.loss.backward()
    # clipped token gets no gradient; unclipped: d(-r/2)/dlogp = -r/2 = -0.25
    assert inp.logp.grad.tolist()[0] == pytest.approx([0.0, -0.25], abs=1e-6)


def test_clip_negative_advantage_is_pessimistic() -> None:
    out = clipped_surrogate(_inputs([0.5, 1.5], [-1.0]), SAPO_CLIP)
    # token 1: min(-0.5, -0.8) = -0.8 (clipped at 1 - 0.2); token 2: min(-1.5, -1.28) = -1.5 (unclipped)
    assert float(out.loss) == pytest.approx((0.8 + 1.5) / 2, abs=1e-6)
    assert out.clip_frac == pytest.approx(0.5)


def test_asymmetric_clip_bounds() -> None:
    up = clipped_surrogate(_inputs([1.27], [1.0]), SAPO_CLIP)
    assert up.clip_frac == 0.0 and float(up.loss) == pytest.approx(-1.27, abs=1e-6)
    assert clipped_surrogate(_inputs([1.29], [1.0]), SAPO_CLIP).clip_frac == 1.0


def test_token_level_normalisation() -> None:
    # sequences of 1 and 3 tokens, ratio 1, advantages +1 and -1: (-1*1 + 1*3) / 4 tokens = 0.5
    logp = torch.zeros(2, 3)
    inp = LossInputs(logp=logp, old_logp=logp.clone(), advantages=torch.tensor([1.0, -1.0]),
                     mask=torch.tensor([[1.0, 0, 0], [1, 1, 1]]))
    assert float(clipped_surrogate(inp, SAPO_CLIP).loss) == pytest.approx(0.5)


def test_kl_term_and_k3_value() -> None:
    logp, ref = torch.log(t(0.5)), torch.log(t(0.25))
    assert float(kl_k3(logp, ref)) == pytest.approx(0.5 + math.log(2) - 1, abs=1e-12)
    inp = _inputs([1.0], [0.0])
    inp = LossInputs(inp.logp, inp.old_logp, inp.advantages, inp.mask, ref_logp=inp.old_logp - math.log(2))
    out = clipped_surrogate(inp, LossConfig(kl_coef=0.1))
    assert out.kl == pytest.approx(0.5 + math.log(2) - 1, abs=1e-6)
    assert float(out.loss) == pytest.approx(0.1 * (0.5 + math.log(2) - 1), abs=1e-6)


def test_the_drift_counts_only_the_tokens_both_policies_sample() -> None:
    # token 0: log pi -1, log mu -2 -> k3 = e^-1 - (-1) - 1 = e^-1; token 1: pi excludes it (-80), token 2: mu
    # excludes it, token 3: padding. Only token 0 counts (with every token counted the mean was about e^79 / 3).
    logp = torch.tensor([[-1.0, -80.0, -0.5, 0.0]])
    behaviour = torch.tensor([[-2.0, -1.0, -80.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    assert float(behaviour_drift(logp, behaviour, mask)) == pytest.approx(math.exp(-1), abs=1e-6)
    assert float(behaviour_drift(logp, behaviour, torch.tensor([[0.0, 1.0, 1.0, 0.0]]))) == 0.0


def test_importance_weights_truncate_and_scale() -> None:
    w = truncated_is_weights(torch.log(t(0.3, 0.1)), torch.log(t(0.1, 0.2)), cap=2.0)
    assert w.tolist() == pytest.approx([2.0, 0.5])
    # one cap per row ([N, 1]): row 0 capped at 1 (an external completion), row 1 at 2
    rows = truncated_is_weights(torch.log(torch.tensor([[0.3, 0.1], [0.3, 0.1]], dtype=torch.float64)),
                                torch.log(torch.tensor([[0.1, 0.2], [0.1, 0.2]], dtype=torch.float64)),
                                cap=torch.tensor([[1.0], [2.0]], dtype=torch.float64))
    assert rows.flatten().tolist() == pytest.approx([1.0, 0.5, 2.0, 0.5])
    inp = _inputs([1.0, 1.0], [1.0])
    weighted = LossInputs(inp.logp, inp.old_logp, inp.advantages, inp.mask, is_weights=torch.tensor([[2.0, 0.5]]))
    assert float(clipped_surrogate(weighted, SAPO_CLIP).loss) == pytest.approx(-(2.0 + 0.5) / 2)


def test_processed_log_softmax_temperature_and_top_p() -> None:
    lp = processed_log_softmax(torch.tensor([2.0, 0.0]), temperature=0.5)
    assert lp.tolist() == pytest.approx([-math.log1p(math.exp(-4)), -4 - math.log1p(math.exp(-4))], abs=1e-6)
    logits = torch.tensor([2.0, 1.0, 0.0])  # probs 0.6652, 0.2447, 0.0900
    nucleus = processed_log_softmax(logits, 1.0, top_p=0.7)
    assert nucleus[:2].tolist() == pytest.approx([-math.log1p(math.exp(-1)), -1 - math.log1p(math.exp(-1))],
                                                 abs=1e-6)
    assert nucleus[2] == float("-inf")
    only_top = processed_log_softmax(logits, 1.0, top_p=0.6)
    assert only_top[0] == 0.0 and torch.isinf(only_top[1:]).all()


def test_entropy() -> None:
    assert float(entropy_from_log_probs(torch.log(t(0.5, 0.5)))) == pytest.approx(math.log(2))
    assert float(entropy_from_log_probs(torch.tensor([0.0, float("-inf")]))) == 0.0
