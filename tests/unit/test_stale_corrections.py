"""Corrections of our own stale rollouts (rl/stale.py) against hand-computed values, and as the trainer applies them:
`tis` bit for bit the trainer's computation before the registry, `none` the plain ratio against the behaviour policy,
m2po's masked fraction and vcpo's ESS-scaled learning rate in the step's statistics, the whole-minibatch
statistics unchanged when the minibatch is split into micro-batches, and every correction training (not skipping) a
padded minibatch whose completions hold targets the trainer's top-p nucleus excludes."""

from __future__ import annotations

import dataclasses
import math
import random
from pathlib import Path

import pytest
import torch

from swarm_node.config import SamplerConfig, TrainConfig, load_config
from swarm_node.config.train import M2PO_BOUND, M2POStaleConfig, StaleCorrectionConfig, TISStaleConfig
from swarm_node.errors import ConfigError
from swarm_node.model.default_model import load_model
from swarm_node.rl import stale
from swarm_node.rl.logprobs import EXCLUDED_LOG_PROB, chunked_token_log_probs, trainable_log_probs
from swarm_node.rl.loss import LossInputs, truncated_is_weights
from swarm_node.rl.stale import (
    STALE_CORRECTIONS,
    StaleBatch,
    StaleParams,
    ess_ratio,
    m2po_keep,
    off_policy_baseline_advantages,
)
from swarm_node.train.batching import Batch, collate, prompt_keys
from swarm_node.train.trainer import Trainer
from swarm_node.types import TrainSample

LN2 = math.log(2.0)


def t(*rows: object) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32)


def one_group(log_ratio: torch.Tensor, advantages: list[float], mask: torch.Tensor | None = None) -> StaleBatch:
    n = log_ratio.shape[0]
    mask = torch.ones_like(log_ratio) if mask is None else mask
    return StaleBatch(log_ratio * mask, mask, torch.ones(n, dtype=torch.bool), t(*advantages),
                      torch.zeros(n, dtype=torch.int64))


# ---- the math, by hand ----

def test_m2po_masks_the_largest_squares_until_the_mean_is_within_the_bound() -> None:
    # squares 4, 1, 0.01 | 0.01, 0 (the sixth position is not a token): mean 5.02/5 > 0.04; without the 4:
    # 1.02/4 = 0.255 > 0.04; without the 4 and the 1: 0.02/3 = 0.0067 <= 0.04.
    log_ratio, mask = t([2.0, -1.0, 0.1], [0.1, 0.0, 5.0]), t([1, 1, 1], [1, 1, 0])
    assert m2po_keep(log_ratio, mask, 0.04).tolist() == [[0.0, 0.0, 1.0], [1.0, 1.0, 0.0]]
    assert m2po_keep(log_ratio, mask, 2.0).tolist() == [[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]]  # 1.004 <= 2: none
    out = STALE_CORRECTIONS["m2po"].apply(one_group(log_ratio, [1.0, -1.0], mask), StaleParams(bound=0.04))
    assert out.stats == {"masked_frac": pytest.approx(2 / 5)}
    assert out.proximal_ratio and out.lr_scale == 1.0 and out.advantages.tolist() == [1.0, -1.0]
    assert out.token_weights is not None  # the untruncated ratio on kept tokens: no cap
    assert out.token_weights.flatten().tolist() == pytest.approx([0.0, 0.0, math.exp(0.1), math.exp(0.1), 1.0, 0.0])


def test_m2po_ties_mask_the_first_token_and_an_empty_batch_masks_nothing() -> None:
    # squares 1, 1, 0: 2/3 > 0.5; masking one of the 1s: 1/2 <= 0.5 -> the first in row-major order goes
    assert m2po_keep(t([1.0, -1.0, 0.0]), t([1, 1, 1]), 0.5).tolist() == [[0.0, 1.0, 1.0]]
    # nothing within the bound until every token is masked: all go
    assert m2po_keep(t([3.0, -3.0]), t([1, 1]), 0.5).tolist() == [[0.0, 0.0]]
    assert m2po_keep(t([3.0]), t([0]), 0.5).tolist() == [[0.0]]
    out = STALE_CORRECTIONS["m2po"].apply(one_group(t([3.0]), [1.0], t([0])), StaleParams())
    assert out.stats == {"masked_frac": 0.0}


def test_ess_ratio_of_sequence_weights() -> None:
    assert ess_ratio(torch.tensor([0.0, LN2, 0.0])) == pytest.approx(16 / 18)  # w 1, 2, 1: (4)^2 / (3 * 6)
    assert ess_ratio(torch.tensor([0.0, 0.0, 0.0, 0.0])) == 1.0
    assert ess_ratio(torch.tensor([1000.0, 1000.0])) == 1.0  # log space: no overflow
    assert ess_ratio(torch.tensor([0.0, -1000.0])) == pytest.approx(0.5)  # one sequence carries it all: ESS 1 of 2


def test_off_policy_baseline_recentres_groups_with_stale_rows() -> None:
    # dr_grpo advantages of rewards (1, 0, 0): 2/3, -1/3, -1/3; w = 2, 1, 1, so w^2 = 4, 1, 1 and
    # b* = (4 * 2/3 - 1/3 - 1/3) / 6 = 1/3: the advantages become r - b*_r with b*_r = 4 / 6 = 2/3.
    adv = torch.tensor([2 / 3, -1 / 3, -1 / 3, 0.5, -0.5], dtype=torch.float64)
    log_w = torch.tensor([LN2, 0.0, 0.0, 0.0, 0.0], dtype=torch.float64)
    groups = torch.tensor([7, 7, 7, 9, 9])
    stale_rows = torch.tensor([True, True, True, False, False])
    out = off_policy_baseline_advantages(adv, log_w, groups, stale_rows)
    assert out.tolist() == pytest.approx([1 / 3, -2 / 3, -2 / 3, 0.5, -0.5])
    assert out[3:].tolist() == [0.5, -0.5]  # a group without stale rows is untouched, bit for bit


def test_vcpo_scales_the_step_by_the_root_of_the_ess_and_takes_the_off_policy_baseline() -> None:
    # sequence log-weights: ln 2 + 0, 0.5 - 0.5, 0 + 0 -> w = 2, 1, 1
    batch = one_group(t([LN2, 0.0], [0.5, -0.5], [0.0, 0.0]), [2 / 3, -1 / 3, -1 / 3])
    out = STALE_CORRECTIONS["vcpo"].apply(batch, StaleParams(cap=1.5))
    assert out.stats == {"ess": pytest.approx(8 / 9)}
    assert out.lr_scale == pytest.approx(math.sqrt(8 / 9))
    assert out.advantages.tolist() == pytest.approx([1 / 3, -2 / 3, -2 / 3])
    assert out.token_weights is not None and out.proximal_ratio
    # tis's weights: min(r, 1.5)
    assert out.token_weights.flatten().tolist() == pytest.approx([1.5, 1.0, 1.5, math.exp(-0.5), 1.0, 1.0])


def test_none_and_tis_by_hand() -> None:
    batch = one_group(t([LN2, -LN2]), [1.0])
    plain = STALE_CORRECTIONS["none"].apply(batch, StaleParams())
    assert (plain.proximal_ratio, plain.token_weights, plain.advantages.tolist(), plain.lr_scale, plain.stats) == (
        False, None, [1.0], 1.0, {})
    tis = STALE_CORRECTIONS["tis"].apply(one_group(t([3.0, -LN2]), [1.0]), StaleParams(cap=2.0))
    assert tis.proximal_ratio and tis.token_weights is not None
    assert tis.token_weights.flatten().tolist() == pytest.approx([2.0, 0.5])


def test_prompt_keys_group_rows_by_prompt() -> None:
    batch = collate([TrainSample([5, 6], [7, 1], [-0.5, -0.25], 1.0), TrainSample([5], [8], [-2.0], -1.0),
                     TrainSample([5, 6], [9], [-1.0], 1.0)], pad_id=0)
    keys = prompt_keys(batch).tolist()
    assert keys[0] == keys[2] != keys[1]


# ---- the config ----

def test_config_selects_a_correction_and_its_knobs() -> None:
    assert isinstance(TrainConfig().stale_correction, TISStaleConfig)  # today's behaviour is the default
    assert StaleCorrectionConfig().kind == "none"
    cfg = load_config(overrides={"train.stale_correction.kind": "m2po", "train.stale_correction.bound": 0.1})
    assert isinstance(cfg.train.stale_correction, M2POStaleConfig)
    assert cfg.train.stale_correction.knobs() == {"bound": 0.1}
    assert M2PO_BOUND == stale.M2PO_BOUND == StaleParams().bound
    with pytest.raises(ConfigError, match="^train.stale_correction.bound is a setting of train.stale_correction.kind "
                                          "m2po, not of the selected 'tis'$"):
        load_config(overrides={"train.stale_correction.bound": 0.1})
    with pytest.raises(ConfigError, match="^train.stale_correction.bound must be > 0, got 0.0$"):
        load_config(overrides={"train.stale_correction.kind": "m2po", "train.stale_correction.bound": 0.0})


# ---- in the trainer ----

def _trainer(tiny_model_dir: Path, kind: str, sampling: SamplerConfig | None = None, **train: object) -> Trainer:
    model, tok = load_model(tiny_model_dir)
    cfg = load_config(overrides={"train.stale_correction.kind": kind}).train
    for key, value in train.items():
        cfg = cfg.__class__(**{**cfg.__dict__, key: value})
    return Trainer(model, cfg, sampling or SamplerConfig(), tok.pad_token_id, seed=3)


def _current(trainer: Trainer, prompt: list[int], completion: list[int]) -> list[float]:
    probe = collate([TrainSample(prompt, completion, [0.0] * len(completion), 0.0)], trainer.pad_id)
    with torch.no_grad():
        logp, _ = trainer.token_log_probs(trainer.model, probe)
    return logp[0, probe.mask[0].bool()].tolist()


def _mixed_rows(trainer: Trainer, seed: int = 1) -> list[TrainSample]:
    """On-policy rows, own stale rows (behaviour off by up to e^2.5 per token) and an external row with its own cap,
    two prompts in groups of three."""
    rng = random.Random(seed)
    prompts = [[3, 4, 5], [6, 7]]
    rows = []
    for g, prompt in enumerate(prompts):
        for k, comp in enumerate([[10, 1], [11, 12, 1], [13, 14, 15, 1]]):
            cur = _current(trainer, prompt, comp)
            mu = [c + rng.uniform(-2.5, 2.5) for c in cur]
            adv = [1.0, -0.5, -0.5][k] * (1 if g == 0 else -1)
            if g == 0 and k == 0:
                rows.append(TrainSample(prompt, comp, cur, adv))
            elif g == 1 and k == 2:
                rows.append(TrainSample(prompt, comp, mu, adv, off_policy=True, is_cap=1.0))
            else:
                rows.append(TrainSample(prompt, comp, mu, adv, off_policy=True))
    return rows


def _loss_before_the_registry(trainer: Trainer, batch: Batch) -> torch.Tensor:
    """The trainer's micro-batch loss as it was written before the stale-correction registry (a copy, kept as the
    reference of the parity test)."""
    logp, _ = trainer.token_log_probs(trainer.model, batch)
    old_logp, is_weights = batch.behaviour, None
    if bool(batch.off_policy.any()):
        rows = batch.off_policy.unsqueeze(-1)
        proximal = logp.detach()
        cap: float | torch.Tensor = trainer.cfg.is_cap
        if batch.is_cap is not None:
            cap = torch.nan_to_num(batch.is_cap, nan=trainer.cfg.is_cap).to(proximal.dtype).unsqueeze(-1)
        w = truncated_is_weights(proximal, batch.behaviour, cap)
        is_weights = torch.where(rows, w, torch.ones_like(w))
        old_logp = torch.where(rows, proximal, batch.behaviour)
    if batch.token_weights is not None:
        tw = batch.token_weights.to(logp.dtype)
        is_weights = tw if is_weights is None else is_weights * tw
    return trainer.loss_fn(LossInputs(logp, old_logp, batch.advantages, batch.mask, is_weights, None),
                           trainer.loss_cfg).loss


def _grads(trainer: Trainer) -> list[torch.Tensor]:
    return [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in trainer.params]


def test_tis_is_the_trainer_before_the_registry_bit_for_bit(tiny_model_dir: Path) -> None:
    trainer = _trainer(tiny_model_dir, "tis")
    batch = collate(_mixed_rows(trainer), trainer.pad_id)
    trainer.optimizer.zero_grad(set_to_none=True)
    new = trainer._micro_loss(batch).loss
    new.backward()
    new_grads = _grads(trainer)
    trainer.optimizer.zero_grad(set_to_none=True)
    old = _loss_before_the_registry(trainer, batch)
    old.backward()
    assert torch.equal(new.detach(), old.detach())
    for a, b in zip(new_grads, _grads(trainer), strict=True):
        assert torch.equal(a, b)


def test_none_takes_the_plain_ratio_against_the_behaviour_policy(tiny_model_dir: Path) -> None:
    trainer = _trainer(tiny_model_dir, "none")
    rows = _mixed_rows(trainer)
    batch = collate(rows, trainer.pad_id)
    logp, _ = trainer.token_log_probs(trainer.model, batch)
    capped = torch.tensor([s.is_cap is not None for s in rows]).unsqueeze(-1)
    # only the external row with its own cap keeps the decoupled objective
    old_logp = torch.where(capped, logp.detach(), batch.behaviour)
    weights = torch.where(capped, truncated_is_weights(logp.detach(), batch.behaviour, 1.0),
                          torch.ones_like(logp))
    want = trainer.loss_fn(LossInputs(logp, old_logp, batch.advantages, batch.mask, weights), trainer.loss_cfg)
    got = trainer._micro_loss(batch)
    assert float(got.loss.detach()) == pytest.approx(float(want.loss.detach()), rel=1e-6)
    assert got.clip_frac == pytest.approx(want.clip_frac) and got.clip_frac > 0  # stale tokens leave the clip band


@pytest.mark.parametrize("kind", ["m2po", "vcpo"])
def test_whole_minibatch_corrections_do_not_depend_on_the_micro_batches(tiny_model_dir: Path, kind: str) -> None:
    """Every row its own micro-batch (the no-gradient forward pass first) or one micro-batch: the same gradient,
    statistics and learning-rate factor."""
    results = []
    for budget in (8192, 1):
        trainer = _trainer(tiny_model_dir, kind, minibatches=1, microbatch_tokens=budget)
        batches = trainer.microbatches(_mixed_rows(trainer))
        assert len(batches) == (1 if budget > 1 else 6)
        result = trainer.accumulate(batches)
        assert result is not None
        results.append((result, trainer.lr_scale, _grads(trainer)))
    (whole, scale_whole, grads_whole), (split, scale_split, grads_split) = results
    stat = {"m2po": "masked_frac", "vcpo": "ess"}[kind]
    assert split[stat] == pytest.approx(whole[stat], rel=1e-6) and split["loss"] == pytest.approx(whole["loss"])
    assert scale_split == pytest.approx(scale_whole, rel=1e-6)
    assert (scale_whole < 1) == (kind == "vcpo")
    for a, b in zip(grads_whole, grads_split, strict=True):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-6)


def test_m2po_reports_the_masked_fraction_and_vcpo_scales_the_learning_rate(tiny_model_dir: Path) -> None:
    trainer = _trainer(tiny_model_dir, "m2po", minibatches=1, warmup_steps=0)
    rows = _mixed_rows(trainer)
    batch = collate(rows, trainer.pad_id)
    with torch.no_grad():
        logp, _ = trainer.token_log_probs(trainer.model, batch)
    stale_rows = torch.tensor([s.off_policy and s.is_cap is None for s in rows]).unsqueeze(-1)
    mask = batch.mask * stale_rows
    keep = m2po_keep((logp - batch.behaviour) * mask, mask, M2PO_BOUND)
    expected = 1 - float(keep.sum()) / float(mask.sum())
    assert expected > 0  # behaviour off by up to e^2.5: some tokens are masked
    assert trainer.train_step(rows).correction == {"masked_frac": pytest.approx(expected)}

    trainer = _trainer(tiny_model_dir, "vcpo", lr=1e-3, minibatches=1, warmup_steps=0)
    stats = trainer.train_step(_mixed_rows(trainer))
    assert 0 < stats.correction["ess"] < 1
    assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(1e-3 * math.sqrt(stats.correction["ess"]))
    on_policy = [s for s in _mixed_rows(trainer) if not s.off_policy]
    assert trainer.train_step(on_policy).correction == {}  # no stale rows: nothing to report, the plain step
    assert trainer.optimizer.param_groups[0]["lr"] == 1e-3


def test_external_rows_with_their_own_cap_are_not_stale_rows(tiny_model_dir: Path) -> None:
    """Only rows with their own cap (external decoupled completions): no correction runs, nothing is reported and
    the learning rate is the plain one."""
    trainer = _trainer(tiny_model_dir, "vcpo", lr=1e-3, minibatches=1, warmup_steps=0)
    capped = [s for s in _mixed_rows(trainer) if s.is_cap is not None]
    assert len(capped) == 1
    stats = trainer.train_step(capped)
    assert stats.minibatches == 1 and stats.correction == {}
    assert trainer.optimizer.param_groups[0]["lr"] == 1e-3


def test_trainable_log_probs_by_hand() -> None:
    lp = t([-float("inf"), -1.5, -float("inf")], [-0.25, -float("inf"), -3.0])
    mask = t([1, 1, 0], [1, 1, 1])
    want = t([EXCLUDED_LOG_PROB, -1.5, 0.0], [-0.25, EXCLUDED_LOG_PROB, -3.0])
    assert torch.equal(trainable_log_probs(lp, mask), want)
    # a kept value keeps its gradient, a replaced one (and one outside the mask) gets none
    x = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    y = torch.where(torch.tensor([[True, False]]), x, torch.tensor(-float("inf")))
    trainable_log_probs(y, t([1, 1])).sum().backward()
    assert torch.equal(x.grad, t([1.0, 0.0]))
    # the k3 estimator against a behaviour log-prob in [EXCLUDED_LOG_PROB, 0] stays finite in fp32
    assert math.isfinite(float((0.0 - torch.tensor(EXCLUDED_LOG_PROB)).exp()))


@pytest.mark.parametrize("kind", ["none", "tis", "m2po", "vcpo"])
def test_every_correction_trains_a_padded_minibatch_with_targets_outside_the_nucleus(tiny_model_dir: Path,
                                                                                     kind: str) -> None:
    """top_p 0.3 (the default model's is 0.8): the tiny model's nucleus excludes some completion targets, and rows of
    different lengths are padded. Before trainable_log_probs, -inf log-probs met masks (0 * -inf = NaN) and every
    minibatch with a stale row, or with a peer's token outside the nucleus, was skipped: nothing trained."""
    trainer = _trainer(tiny_model_dir, kind, SamplerConfig(temperature=1.0, top_p=0.3), lr=1e-3, minibatches=1,
                       warmup_steps=0)
    # behaviour log-probs as a sampler's (or a peer's) are: finite, though the trainer's nucleus excludes the token
    rows = [dataclasses.replace(s, behaviour_logprobs=[max(b, -5.0) for b in s.behaviour_logprobs])
            for s in _mixed_rows(trainer)]
    batch = collate(rows, trainer.pad_id)
    with torch.no_grad():  # the precondition: excluded targets inside the completions, and padding
        hidden = trainer.model.get_decoder()(input_ids=batch.input_ids,
                                             attention_mask=batch.attention).last_hidden_state[:, :-1]
        raw, _ = chunked_token_log_probs(hidden.reshape(-1, hidden.shape[-1]), trainer.model.get_output_embeddings(),
                                         batch.targets.reshape(-1), 1.0, 0.3)
    raw = raw.view(batch.mask.shape)
    assert bool(torch.isneginf(raw[batch.mask.bool()]).any()) and bool((batch.mask == 0).any())
    before = [p.detach().clone() for p in trainer.params]
    stats = trainer.train_step(rows)
    assert (stats.minibatches, stats.skipped_minibatches) == (1, 0)
    assert all(math.isfinite(v) for v in (stats.loss, stats.kl, stats.grad_norm)) and stats.grad_norm > 0
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.params, strict=True))


def test_a_token_its_behaviour_policy_excluded_trains_with_weight_zero(tiny_model_dir: Path) -> None:
    """A peer's token scored outside our nucleus has behaviour log-prob EXCLUDED_LOG_PROB; once the policy includes
    it, pi / mu is ~e^80. It trains as a dropped token (weight 0, in the denominator): the loss and gradient equal
    those of the same row with that token's weight 0 and a finite behaviour."""
    trainer = _trainer(tiny_model_dir, "tis")
    prompt, completion = [3, 4, 5], [11, 12, 13, 1]
    current = _current(trainer, prompt, completion)
    excluded = TrainSample(prompt, completion, [current[0], EXCLUDED_LOG_PROB, *current[2:]], -1.0)
    dropped = TrainSample(prompt, completion, current, -1.0, token_weights=[1.0, 0.0, 1.0, 1.0])
    other = TrainSample([6, 7], [10, 1], _current(trainer, [6, 7], [10, 1]), 1.0)
    results = []
    for row in (excluded, dropped):
        trainer.optimizer.zero_grad(set_to_none=True)
        loss = trainer._micro_loss(collate([row, other], trainer.pad_id)).loss
        loss.backward()
        results.append((loss.detach(), _grads(trainer)))
    (loss_excluded, grads_excluded), (loss_dropped, grads_dropped) = results
    assert torch.isfinite(loss_excluded) and torch.equal(loss_excluded, loss_dropped)
    for a, b in zip(grads_excluded, grads_dropped, strict=True):
        assert torch.isfinite(a).all() and torch.equal(a, b)
