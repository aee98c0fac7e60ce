"""The transformers sampler: behaviour log-probs equal the trainer's definition; EOS handling; seeds."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from swarm_node.config import SamplerConfig, TrainConfig
from swarm_node.model.default_model import load_model
from swarm_node.sampler.base import PromptTooLongError, SamplingParams
from swarm_node.sampler.hf import HFSampler
from swarm_node.train.batching import collate
from swarm_node.train.trainer import Trainer
from swarm_node.types import TrainSample


@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.7, 0.9)])
def test_behaviour_logprobs_match_trainer(tiny_model_dir: Path, temperature: float, top_p: float) -> None:
    model, tok = load_model(tiny_model_dir)
    sampler = HFSampler(model, tok)
    prompts = [tok.encode("1 + 2 =\nAnswer: "), tok.encode("13 + 24 - 5 =\nAnswer: ")]  # different lengths
    out = sampler.generate(prompts, 3, SamplingParams(temperature, top_p, max_new_tokens=6, seed=3))
    trainer = Trainer(model, TrainConfig(), SamplerConfig(temperature=temperature, top_p=top_p), tok.pad_token_id)
    samples = [TrainSample(p, c.token_ids, c.logprobs, 0.0)
               for p, group in zip(prompts, out, strict=True) for c in group]
    batch = collate(samples, tok.pad_token_id)
    with torch.no_grad():
        logp, _ = trainer.token_log_probs(model, batch)
    assert torch.allclose(logp[batch.mask.bool()], batch.behaviour[batch.mask.bool()], atol=1e-4)


def test_completions_stop_at_eos_and_text_excludes_it(tiny_model_dir: Path) -> None:
    model, tok = load_model(tiny_model_dir)
    out = HFSampler(model, tok, version=4).generate([tok.encode("a b")], 8, SamplingParams(max_new_tokens=12,
                                                                                             seed=0))
    assert len(out) == 1 and len(out[0]) == 8
    for c in out[0]:
        assert c.version == 4 and len(c.logprobs) == len(c.token_ids) <= 12
        assert tok.eos_token_id not in c.token_ids[:-1]
        assert c.text == tok.decode(c.token_ids, skip_special_tokens=True)
        assert "<eos>" not in c.text
        assert all(lp <= 0 for lp in c.logprobs)


def test_seeded_sampling_is_reproducible_and_weights_update(tiny_model_dir: Path) -> None:
    model, tok = load_model(tiny_model_dir)
    sampler = HFSampler(model, tok)
    params = SamplingParams(max_new_tokens=6, seed=11)
    first = sampler.generate([tok.encode("x")], 4, params)
    assert [c.token_ids for c in first[0]] == [c.token_ids for c in sampler.generate([tok.encode("x")], 4,
                                                                                        params)[0]]
    noisy = {k: v + 0.5 * torch.randn_like(v) for k, v in model.state_dict().items()}
    sampler.load_weights(noisy, version=1)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=6)
    after = sampler.generate([tok.encode("hello")], 1, greedy)[0][0]
    assert after.version == 1
    assert after.token_ids != HFSampler(model, tok).generate([tok.encode("hello")], 1, greedy)[0][0].token_ids


def test_prompt_too_long_is_a_clear_error(tiny_model_dir: Path) -> None:
    model, tok = load_model(tiny_model_dir)
    with pytest.raises(PromptTooLongError, match="prompt 0 has 300 tokens; with 8 new tokens it exceeds"):
        HFSampler(model, tok).generate([[5] * 300], 1, SamplingParams())


def test_the_models_own_generation_settings_do_not_bend_the_behaviour_logprobs(tiny_model_dir: Path,
                                                                               tmp_path: Path) -> None:
    """A model directory's generation_config.json (Qwen2.5-Instruct ships repetition_penalty 1.1) must not change
    what is sampled behind the trainer's back: sampling settings are ours, set explicitly, and a processor the
    trainer does not reproduce is off (said in one line)."""
    import json
    import shutil

    shaped = tmp_path / "model"
    shutil.copytree(tiny_model_dir, shaped)
    (shaped / "generation_config.json").write_text(json.dumps({
        "repetition_penalty": 1.3, "no_repeat_ngram_size": 2, "top_k": 5, "temperature": 0.3, "top_p": 0.5,
        "do_sample": True}))
    model, tok = load_model(shaped)
    assert model.generation_config.repetition_penalty == 1.3  # the directory's settings did load
    said: list[str] = []
    sampler = HFSampler(model, tok, log=said.append)
    prompts = [tok.encode("1 + 2 =\nAnswer: "), tok.encode("13 + 24 - 5 =\nAnswer: ")]
    out = sampler.generate(prompts, 4, SamplingParams(1.0, 1.0, max_new_tokens=12, seed=5))
    trainer = Trainer(model, TrainConfig(), SamplerConfig(temperature=1.0, top_p=1.0), tok.pad_token_id)
    samples = [TrainSample(p, c.token_ids, c.logprobs, 0.0) for p, group in zip(prompts, out, strict=True)
               for c in group]
    batch = collate(samples, tok.pad_token_id)
    with torch.no_grad():
        logp, _ = trainer.token_log_probs(model, batch)
    gap = (logp[batch.mask.bool()] - batch.behaviour[batch.mask.bool()]).abs().max().item()
    assert gap <= 1e-4, gap
    assert said == ["sampler: off from the model's generation_config.json (the trainer does not reproduce them): "
                    "no_repeat_ngram_size=2, repetition_penalty=1.3, top_k=5"]


def test_every_eos_id_of_the_generation_config_ends_a_completion(tiny_model_dir: Path, tmp_path: Path) -> None:
    import json
    import shutil

    from swarm_node import tasks
    from swarm_node.model.tokenizer import eos_ids

    model, tok = load_model(tiny_model_dir)
    prompt = tok.encode("13 + 24 - 5 =\nAnswer: ")
    greedy = SamplingParams(temperature=0.0, max_new_tokens=8)
    plain = HFSampler(model, tok).generate([prompt], 1, greedy)[0][0].token_ids
    stop = next(t for t in plain[1:] if t != tok.eos_token_id)  # a token greedy decoding reaches, made an EOS
    shaped = tmp_path / "model"
    shutil.copytree(tiny_model_dir, shaped)
    (shaped / "generation_config.json").write_text(json.dumps({"eos_token_id": [tok.eos_token_id, stop]}))
    model, tok = load_model(shaped)
    sampler = HFSampler(model, tok)
    assert sampler.eos_ids == eos_ids(tok, [tok.eos_token_id, stop]) == (tok.eos_token_id, stop)
    out = sampler.generate([prompt], 1, greedy)[0][0]
    assert out.token_ids == plain[: plain.index(stop) + 1] and out.token_ids[-1] == stop
    assert str(stop) not in out.text and tok.decode([stop]) not in out.text
    assert tasks.well_formed((5, 6, stop), "ab", sampler.eos_ids) and tasks.well_formed((5, 6, 1), "ab", (1, stop))
    assert not tasks.well_formed((5, stop, 6, 1), "ab", sampler.eos_ids)  # an EOS inside the body


def test_eos_ids_merge_the_tokenizer_and_the_generation_config(tiny_model_dir: Path) -> None:
    from swarm_node.model.tokenizer import eos_ids

    _, tok = load_model(tiny_model_dir)
    e = tok.eos_token_id
    assert eos_ids(tok) == (e,) and eos_ids(tok, 7) == (e, 7) and eos_ids(tok, [7, e, 9]) == (e, 7, 9)


def test_a_padded_embeddings_spare_rows_are_never_sampled_nor_in_the_trainers_logprobs(tmp_path: Path) -> None:
    """Qwen2.5 pads 151,665 tokens to 151,936 embedding rows: an id past the tokenizer's length must never be
    sampled (a peer's group with one is dropped as token_out_of_vocab), and the trainer's distribution is the same."""
    from swarm_node.model.char_recipe import random_qwen2
    from swarm_node.model.tokenizer import build_char_tokenizer
    from tests.conftest import TINY_RECIPE

    tok = build_char_tokenizer()
    model = random_qwen2(tok, TINY_RECIPE, seed=0)
    model.resize_token_embeddings(len(tok) + 64)  # 64 spare rows
    with torch.no_grad():
        model.lm_head.weight[len(tok):] = 5.0 * model.lm_head.weight[:64].abs()  # the spare rows would win
    path = tmp_path / "padded"
    model.save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    model, tok = load_model(path)
    assert model.config.vocab_size == len(tok) + 64
    sampler = HFSampler(model, tok)
    prompts = [tok.encode("1 + 2 =\nAnswer: ")]
    out = sampler.generate(prompts, 8, SamplingParams(1.0, 1.0, max_new_tokens=6, seed=2))
    assert all(t < len(tok) for c in out[0] for t in c.token_ids)
    trainer = Trainer(model, TrainConfig(), SamplerConfig(temperature=1.0, top_p=1.0), tok.pad_token_id,
                      vocab=len(tok))
    samples = [TrainSample(prompts[0], c.token_ids, c.logprobs, 0.0) for c in out[0]]
    batch = collate(samples, tok.pad_token_id)
    with torch.no_grad():
        logp, _ = trainer.token_log_probs(model, batch)
    assert torch.allclose(logp[batch.mask.bool()], batch.behaviour[batch.mask.bool()], atol=1e-4)
