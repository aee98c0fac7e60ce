"""Corrections for external completions: weights against hand-computed numbers, the cap of 1 whatever a sender
claims, the trainer's token-weight and per-row-cap paths against a torch reference, registry and config."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
import torch

from swarm_node import variants
from swarm_node.config import SamplerConfig, TrainConfig, load_config
from swarm_node.errors import ConfigError
from swarm_node.model.default_model import load_model
from swarm_node.rl.loss import truncated_is_weights
from swarm_node.sharing.corrections import (
    CORRECTIONS,
    DEFAULT_BAND,
    CorrectionParams,
    ftis_token_weights,
    sequence_is_weight,
)
from swarm_node.train.batching import collate
from swarm_node.train.trainer import Trainer
from swarm_node.types import TrainSample
from swarm_node.variants import UnknownVariant

LN2, LN4 = math.log(2.0), math.log(4.0)
PARAMS = CorrectionParams()  # cap 1, band [0.125, 8]


def sample(local: list[float], adv: float = 1.0) -> TrainSample:
    return TrainSample([3, 4], [5 + i for i in range(len(local))], list(local), adv)


# ---- weights, by hand ----

def test_ftis_weights_inside_and_outside_the_band() -> None:
    local = [-1.0] * 6
    # log r = local - sender:   0      ln2      just under ln8          3 (r=20.1)  -ln4 (r=0.25)  -3 (r=0.0498)
    sender = [-1.0, -1.0 - LN2, -1.0 - math.log(8.0) + 1e-9, -4.0, -1.0 + LN4, 2.0]
    assert ftis_token_weights(local, sender, PARAMS) == pytest.approx([1.0, 1.0, 1.0, 0.0, 0.25, 0.0])
    narrow = CorrectionParams(cap=1.0, band_low=0.5, band_high=2.5)
    assert ftis_token_weights(local, sender, narrow) == pytest.approx([1.0, 1.0, 0.0, 0.0, 0.0, 0.0])
    # a cap below 1 truncates the kept tokens at it
    assert ftis_token_weights([-1.0, -1.0], [-1.0, -0.1], CorrectionParams(cap=0.5)) == pytest.approx(
        [0.5, math.exp(-0.9)])
    # no lower filter with band_low 0
    assert ftis_token_weights([-9.0], [-0.01], CorrectionParams(band_low=0.0)) == pytest.approx([math.exp(-8.99)])


def test_each_correction_on_one_sample() -> None:
    local = [-1.0, -2.0]
    sender = [-1.0 - LN4, -2.0 + LN2]  # r = 4, 0.5
    base = sample(local, adv=-1.5)
    assert CORRECTIONS["none"](base, sender, PARAMS) == base
    is_ = CORRECTIONS["is"](base, sender, PARAMS)
    # mean log r = (ln4 - ln2) / 2 = ln2 / 2 -> sqrt(2) > 1 -> capped at 1
    assert is_.advantage == -1.5 and is_.token_weights is None and not is_.off_policy
    shrunk = CORRECTIONS["is"](base, [-1.0 + LN4, -2.0], PARAMS)  # mean log r = -ln4 / 2 -> 0.5
    assert shrunk.advantage == pytest.approx(-0.75)
    ftis = CORRECTIONS["ftis"](base, sender, PARAMS)
    assert ftis.token_weights == pytest.approx([1.0, 0.5])
    assert (ftis.advantage, ftis.behaviour_logprobs, ftis.off_policy) == (-1.5, tuple(local), False)
    dec = CORRECTIONS["decoupled"](base, sender, PARAMS)
    assert (dec.behaviour_logprobs, dec.off_policy, dec.is_cap, dec.advantage) == (tuple(sender), True, 1.0, -1.5)
    assert dec.token_weights is None
    for name in variants.CORRECTIONS:  # another tokenizer: no sender log-probs, the on-policy sample as it is
        assert CORRECTIONS[name](base, None, PARAMS) == base


def effective_weights(name: str, local: list[float], sender: list[float], params: CorrectionParams) -> list[float]:
    """The factor each token's loss term gets from the correction, at the first minibatch (proximal = local)."""
    s = sample(local)
    out = CORRECTIONS[name](s, sender, params)
    if out.off_policy:
        assert out.is_cap is not None
        cap = torch.tensor([[out.is_cap]], dtype=torch.float64)
        w = truncated_is_weights(torch.tensor([local], dtype=torch.float64),
                                 torch.tensor([out.behaviour_logprobs], dtype=torch.float64), cap)
        return w[0].tolist()
    seq = out.advantage / s.advantage
    return [seq * tw for tw in (out.token_weights or [1.0] * len(local))]


@pytest.mark.parametrize("name", variants.CORRECTIONS)
def test_a_sender_claiming_tiny_logprobs_never_gets_a_weight_above_1(name: str) -> None:
    local = [-0.01, -3.0, -0.7]
    for claim in (-1e30, -60000.0, -50.0, -5.0):  # "my sampler found these tokens nearly impossible"
        weights = effective_weights(name, local, [claim] * 3, PARAMS)
        assert all(0.0 <= w <= 1.0 for w in weights), (claim, weights)
    rng = random.Random(0)
    for _ in range(200):
        n = rng.randint(1, 6)
        loc = [rng.uniform(-8, 0) for _ in range(n)]
        snd = [rng.uniform(-40, 0) for _ in range(n)]
        params = CorrectionParams(cap=rng.choice([1.0, 0.5]), band_low=rng.uniform(0, 1), band_high=rng.uniform(1, 20))
        bound = 1.0 if name == "none" else params.cap  # "none" weighs nothing: 1, never more
        assert all(0.0 <= w <= bound + 1e-12 for w in effective_weights(name, loc, snd, params))
    if name == "ftis":  # far outside the band: dropped, not merely truncated
        assert effective_weights(name, local, [-1e30] * 3, PARAMS) == [0.0, 0.0, 0.0]


def test_sequence_is_weight_caps_at_1() -> None:
    assert sequence_is_weight([-0.1], [-1e30], 1.0) == 1.0
    assert sequence_is_weight([-2.0, -2.0], [-1.0, -1.0], 1.0) == pytest.approx(math.exp(-1.0))


# ---- the trainer's paths ----

def _current_logprobs(trainer: Trainer, prompt: list[int], completion: list[int]) -> list[float]:
    probe = collate([TrainSample(prompt, completion, [0.0] * len(completion), 0.0)], trainer.pad_id)
    with torch.no_grad():
        logp, _ = trainer.token_log_probs(trainer.model, probe)
    return logp[0, probe.mask[0].bool()].tolist()


def test_decoupled_rows_take_their_own_cap_beside_own_stale_rows(tiny_model_dir: Path) -> None:
    """One batch: an external decoupled row (cap 1) and an own stale row (train.is_cap 2), same behaviour."""
    model, tok = load_model(tiny_model_dir)
    trainer = Trainer(model, TrainConfig(lr=1e-3, minibatches=1, is_cap=2.0), SamplerConfig(), tok.pad_token_id)
    prompt, completion = tok.encode("1 + 2 ="), [10, 1]
    current = _current_logprobs(trainer, prompt, completion)
    behaviour = [current[0] - LN4, current[1] + LN2]  # pi/mu = 4, 0.5
    external = CORRECTIONS["decoupled"](TrainSample(prompt, completion, current, 1.0), behaviour, PARAMS)
    own = TrainSample(prompt, completion, behaviour, 1.0, off_policy=True)
    stats = trainer.train_step([external, own])
    assert stats.clip_frac == 0.0
    # token mean over 4 tokens of -A * w: external min(4, 1) + min(0.5, 1), own min(4, 2) + min(0.5, 2)
    assert stats.loss == pytest.approx(-((1.0 + 0.5) + (2.0 + 0.5)) / 4, rel=1e-5)


def test_ftis_dropped_token_adds_nothing_but_counts_in_the_mean(tiny_model_dir: Path) -> None:
    model, tok = load_model(tiny_model_dir)
    trainer = Trainer(model, TrainConfig(lr=1e-3, minibatches=1), SamplerConfig(), tok.pad_token_id)
    prompt, completion = tok.encode("1 + 2 ="), [10, 11, 1]
    current = _current_logprobs(trainer, prompt, completion)
    s = TrainSample(prompt, completion, current, -2.0, token_weights=[1.0, 0.0, 0.25])
    stats = trainer.train_step([s])
    assert stats.loss == pytest.approx(2.0 * (1.0 + 0.0 + 0.25) / 3, rel=1e-5)


def test_decoupled_and_ftis_gradients_match_a_torch_reference(tiny_model_dir: Path) -> None:
    """The trainer's gradient for a mix of rows (on-policy local, own stale, decoupled external, ftis external)
    equals autograd of the loss written out by hand: token mean of -A * w * exp(logp - old), at ratio 1 (no clip)."""
    model, tok = load_model(tiny_model_dir)
    trainer = Trainer(model, TrainConfig(lr=1e-3, minibatches=1, is_cap=2.0), SamplerConfig(), tok.pad_token_id)
    prompts = [tok.encode("1 + 2 ="), tok.encode("3 + 4 =")]
    comps = [[10, 1], [11, 12, 1], [13, 1], [14, 15, 16, 1]]
    rng = random.Random(1)
    rows: list[TrainSample] = []
    ref_weights: list[list[float]] = []
    for k, comp in enumerate(comps):
        prompt = prompts[k % 2]
        cur = _current_logprobs(trainer, prompt, comp)
        mu = [c + rng.uniform(-2.5, 2.5) for c in cur]
        adv = [1.0, -0.5, 0.75, -1.25][k]
        base = TrainSample(prompt, comp, cur, adv)
        if k == 0:  # local, on-policy
            rows.append(base)
            ref_weights.append([1.0] * len(comp))
        elif k == 1:  # own stale rollout: min(pi/mu, train.is_cap = 2)
            rows.append(TrainSample(prompt, comp, mu, adv, off_policy=True))
            ref_weights.append([min(math.exp(c - m), 2.0) for c, m in zip(cur, mu, strict=True)])
        elif k == 2:  # external, decoupled: min(pi/mu, 1)
            rows.append(CORRECTIONS["decoupled"](base, mu, PARAMS))
            ref_weights.append([min(math.exp(c - m), 1.0) for c, m in zip(cur, mu, strict=True)])
        else:  # external, ftis with a narrow band so that some token is dropped
            narrow = CorrectionParams(band_low=0.5, band_high=2.0)
            mu[0] = cur[0] + 1.5  # r = e^-1.5 = 0.22: dropped
            rows.append(CORRECTIONS["ftis"](base, mu, narrow))
            ref_weights.append([min(math.exp(c - m), 1.0) if 0.5 <= math.exp(c - m) <= 2.0 else 0.0
                                for c, m in zip(cur, mu, strict=True)])
    assert ref_weights[3][0] == 0.0
    batches = trainer.microbatches(rows)
    result = trainer.accumulate(batches)
    assert result is not None
    got = [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in trainer.params]

    trainer.optimizer.zero_grad(set_to_none=True)
    terms, count = [], 0
    for s, w in zip(rows, ref_weights, strict=True):
        b = collate([s], trainer.pad_id)
        logp, _ = trainer.token_log_probs(model, b)
        lp = logp[0, b.mask[0].bool()]
        terms.append((-s.advantage * torch.tensor(w) * torch.exp(lp - lp.detach())).sum())
        count += len(s.completion_ids)
    reference = torch.stack(terms).sum() / count
    reference.backward()
    assert result["loss"] == pytest.approx(float(reference.detach()), rel=1e-5, abs=1e-7)
    for g, p in zip(got, trainer.params, strict=True):
        want = p.grad if p.grad is not None else torch.zeros_like(p)
        assert torch.allclose(g, want, rtol=1e-4, atol=1e-7)


def test_unit_token_weights_leave_the_loss_unchanged(tiny_model_dir: Path) -> None:
    model, tok = load_model(tiny_model_dir)
    trainer = Trainer(model, TrainConfig(minibatches=1), SamplerConfig(), tok.pad_token_id)
    prompt, comp = tok.encode("1 + 2 ="), [10, 11, 1]
    cur = _current_logprobs(trainer, prompt, comp)
    plain = [TrainSample(prompt, comp, cur, 1.0), TrainSample(prompt, [12, 1], cur[:2], -1.0)]
    weighted = [plain[0], TrainSample(prompt, [12, 1], cur[:2], -1.0, token_weights=[1.0, 1.0])]
    losses = []
    for rows in (plain, weighted):
        result = trainer.accumulate(trainer.microbatches(rows))
        assert result is not None
        losses.append(result["loss"])
    assert losses[0] == pytest.approx(losses[1], rel=1e-6)


# ---- registry and config ----

def test_registry_holds_every_declared_correction() -> None:
    assert set(CORRECTIONS) == set(variants.CORRECTIONS) >= {"none", "is", "ftis", "decoupled"}
    with pytest.raises(UnknownVariant, match="unknown share.correction.kind 'tis'; choose one of none, is"):
        CORRECTIONS["tis"]


def test_share_config_caps_external_weights_at_1() -> None:
    cfg = load_config()
    assert cfg.share.correction.kind == "is" and cfg.share.correction.knobs() == {"cap": 1.0}
    ftis = load_config(overrides={"share.correction.kind": "ftis"}).share.correction
    assert ftis.knobs() == {"cap": 1.0, "band_low": DEFAULT_BAND[0], "band_high": DEFAULT_BAND[1]}
    assert CorrectionParams(**ftis.knobs()) == CorrectionParams()
    assert cfg.train.is_cap == 2.0  # own stale rollouts (trusted) keep theirs
    for name in variants.CORRECTIONS:
        assert load_config(overrides={"share.correction.kind": name}).share.correction.kind == name
    with pytest.raises(ConfigError, match=r"^share.correction.cap must be <= 1 \(peers' log-probs may only shrink"):
        load_config(overrides={"share.correction.cap": 1.5})
    with pytest.raises(ConfigError, match="share.correction.cap must be > 0"):
        load_config(overrides={"share.correction.cap": 0.0})
    assert load_config(overrides={"share.correction.cap": 0.5}).share.correction.knobs() == {"cap": 0.5}
    for low, high in ((1.5, 8.0), (0.5, 0.9), (-0.1, 2.0)):
        with pytest.raises(ConfigError, match="need 0 <= low <= 1 <= high"):
            load_config(overrides={"share.correction.kind": "ftis", "share.correction.band_low": low,
                                   "share.correction.band_high": high})
    with pytest.raises(ValueError, match="cap must be in"):
        CorrectionParams(cap=2.0)
    with pytest.raises(ValueError, match="band needs"):
        CorrectionParams(band_low=2.0)
