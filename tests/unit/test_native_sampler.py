"""The native sampler: greedy tokens identical to the transformers sampler's (rows of different lengths ending at
different steps, so the batch compacts), behaviour log-probs equal to the trainer's, the sampled distribution, seeds,
and the models it refuses."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config

from swarm_node.config import SamplerConfig, TrainConfig
from swarm_node.errors import UserError
from swarm_node.model.default_model import load_model
from swarm_node.model.lora import attach_lora, lora_modules
from swarm_node.rl.logprobs import processed_log_softmax
from swarm_node.sampler.base import SamplerSettings, SamplingParams
from swarm_node.sampler.factory import SamplerRequest, fallback_kind, fallback_sampler, make_sampler
from swarm_node.sampler.hf import HFSampler
from swarm_node.sampler.kv_decoder import unsupported
from swarm_node.sampler.native import NativeSampler
from swarm_node.train.batching import collate
from swarm_node.train.trainer import Trainer
from swarm_node.types import TrainSample


def _prompts(tok: object) -> list[list[int]]:
    return [tok.encode("1 + 2 =\nAnswer: "), tok.encode("13 + 24 - 5 =\nAnswer: "), tok.encode("7")]


def _frequent_eos(sampler: HFSampler, ids: list[int]) -> HFSampler:
    """Many ids end a completion, so rows of one batch end at many different steps."""
    sampler.eos_ids = ids
    return sampler


def _enders(model: torch.nn.Module, tok: object, max_new: int) -> list[int]:
    """EOS plus, for each prompt, the token its greedy completion has at step 4, 8, 12...: the rows then end at
    different steps."""
    rows = NativeSampler(model, tok).generate(_prompts(tok), 1, SamplingParams(temperature=0.0,
                                                                               max_new_tokens=max_new))
    picks = [g[0].token_ids[min(4 * (i + 1), len(g[0].token_ids) - 1)] for i, g in enumerate(rows)]
    return [tok.eos_token_id, *picks]


def _greedy_pairs(model: torch.nn.Module, tok: object, n: int, max_new: int) -> tuple[list, list]:
    eos = _enders(model, tok, max_new)
    params = SamplingParams(temperature=0.0, max_new_tokens=max_new)
    hf = _frequent_eos(HFSampler(model, tok), eos).generate(_prompts(tok), n, params)
    native = _frequent_eos(NativeSampler(model, tok), eos).generate(_prompts(tok), n, params)
    return hf, native


def _noisy(model: torch.nn.Module) -> None:
    """The seeded random model repeats one character; noise on its weights makes its greedy text vary."""
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=gen))


def test_greedy_tokens_equal_the_transformers_samplers(tiny_model_dir: Path) -> None:
    model, tok = load_model(tiny_model_dir)
    _noisy(model)
    hf, native = _greedy_pairs(model, tok, n=2, max_new=24)
    lengths = {len(c.token_ids) for g in native for c in g}
    assert len(lengths) >= 3, "rows should end at different steps (the batch compacts)"
    for hf_group, native_group in zip(hf, native, strict=True):
        for a, b in zip(hf_group, native_group, strict=True):
            assert b.token_ids == a.token_ids
            assert b.text == a.text
            assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < 1e-4


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (bench.gpu_check runs it)")
def test_greedy_parity_on_cuda(tiny_model_dir: Path) -> None:
    """On a GPU the decoder's cache, masks and draws live on the device: the same tokens as the transformers
    sampler there (fp32), and the completions come back as CPU lists."""
    model, tok = load_model(tiny_model_dir)
    _noisy(model)
    hf, native = _greedy_pairs(model.to("cuda"), tok, n=2, max_new=24)
    assert [[c.token_ids for c in g] for g in native] == [[c.token_ids for c in g] for g in hf]
    sampled = NativeSampler(model, tok).generate(_prompts(tok), 4, SamplingParams(1.0, max_new_tokens=12, seed=3))
    assert all(isinstance(x, float) for g in sampled for c in g for x in c.logprobs)


def test_greedy_parity_on_a_llama_shape_with_grouped_heads(tiny_model_dir: Path) -> None:
    _, tok = load_model(tiny_model_dir)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=256,
                         rope_theta=500000.0, tie_word_embeddings=False, initializer_range=0.2)
    model = LlamaForCausalLM(config).eval()
    hf, native = _greedy_pairs(model, tok, n=3, max_new=20)
    assert [[c.token_ids for c in g] for g in native] == [[c.token_ids for c in g] for g in hf]


def test_greedy_parity_with_lora_adapters(tiny_model_dir: Path) -> None:
    """A node training LoRA samples its adapted projections: the native loop calls the wrapped modules."""
    model, tok = load_model(tiny_model_dir)
    _noisy(model)
    attach_lora(model, rank=4, alpha=8.0)
    with torch.no_grad():
        for adapter in lora_modules(model).values():
            adapter.lora_B.weight.normal_(0.0, 0.3, generator=torch.Generator().manual_seed(1))
    hf, native = _greedy_pairs(model, tok, n=2, max_new=16)
    assert [[c.token_ids for c in g] for g in native] == [[c.token_ids for c in g] for g in hf]
    plain, _ = load_model(tiny_model_dir)
    _noisy(plain)
    greedy = SamplingParams(0.0, max_new_tokens=16)
    adapted = NativeSampler(model, tok).generate(_prompts(tok), 1, greedy)
    unadapted = NativeSampler(plain, tok).generate(_prompts(tok), 1, greedy)
    assert [g[0].token_ids for g in unadapted] != [g[0].token_ids for g in adapted]  # the adapters count


@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.7, 0.9)])
def test_behaviour_logprobs_match_trainer(tiny_model_dir: Path, temperature: float, top_p: float) -> None:
    model, tok = load_model(tiny_model_dir)
    _noisy(model)
    sampler = _frequent_eos(NativeSampler(model, tok), _enders(model, tok, 10))
    prompts = _prompts(tok)
    out = sampler.generate(prompts, 3, SamplingParams(temperature, top_p, max_new_tokens=10, seed=3))
    assert len({len(c.token_ids) for g in out for c in g}) >= 2
    trainer = Trainer(model, TrainConfig(), SamplerConfig(temperature=temperature, top_p=top_p), tok.pad_token_id)
    samples = [TrainSample(p, c.token_ids, c.logprobs, 0.0) for p, group in zip(prompts, out, strict=True)
               for c in group]
    batch = collate(samples, tok.pad_token_id)
    with torch.no_grad():
        logp, _ = trainer.token_log_probs(model, batch)
    assert torch.allclose(logp[batch.mask.bool()], batch.behaviour[batch.mask.bool()], atol=1e-4)


def test_first_tokens_follow_the_processed_distribution(tiny_model_dir: Path) -> None:
    """4,000 first tokens of one prompt at T 0.7, top-p 0.9: each token's share is within 0.03 of its probability,
    and no token outside the nucleus is ever drawn."""
    model, tok = load_model(tiny_model_dir)
    prompt = tok.encode("12 + 7 =")
    out = NativeSampler(model, tok).generate([prompt], 4000, SamplingParams(0.7, 0.9, max_new_tokens=1, seed=5))
    with torch.no_grad():
        logits = model(torch.tensor([prompt])).logits[0, -1]
    probs = processed_log_softmax(logits, 0.7, 0.9, len(tok)).exp()
    counts = torch.bincount(torch.tensor([c.token_ids[0] for c in out[0]]), minlength=probs.shape[0]).float()
    assert (counts[probs == 0] == 0).all()
    assert (counts / 4000 - probs).abs().max() < 0.03


def test_seeded_sampling_is_reproducible_and_weights_update(tiny_model_dir: Path) -> None:
    model, tok = load_model(tiny_model_dir)
    sampler = NativeSampler(model, tok, version=2)
    params = SamplingParams(max_new_tokens=8, seed=11)
    first = [c.token_ids for c in sampler.generate([tok.encode("x")], 4, params)[0]]
    assert first == [c.token_ids for c in sampler.generate([tok.encode("x")], 4, params)[0]]
    greedy = SamplingParams(temperature=0.0, max_new_tokens=6)
    before = sampler.generate([tok.encode("hello")], 1, greedy)[0][0]
    assert before.version == 2
    sampler.load_weights({k: v + 0.5 * torch.randn_like(v) for k, v in model.state_dict().items()}, version=3)
    after = sampler.generate([tok.encode("hello")], 1, greedy)[0][0]
    assert after.version == 3 and after.token_ids != before.token_ids


def test_a_model_it_does_not_run_is_refused_by_name_and_auto_falls_back(tiny_model_dir: Path) -> None:
    assert unsupported(LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32,
                                                    num_hidden_layers=1, num_attention_heads=2,
                                                    rope_scaling={"rope_type": "dynamic", "factor": 2.0}))) \
        == "rope type 'dynamic'"
    sliding = Qwen2Config(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                          num_attention_heads=2, use_sliding_window=True, sliding_window=8, max_window_layers=0)
    assert unsupported(type("M", (), {"config": sliding})()) == "sliding-window attention"
    model, tok = load_model(tiny_model_dir)
    model.config.model_type = "gpt2"  # what the check reads: a family it does not reproduce
    with pytest.raises(UserError, match=r"sampler native does not run this model \(model type 'gpt2'"):
        make_sampler("native", tiny_model_dir, model, tok)
    lines: list[str] = []
    request = SamplerRequest(tiny_model_dir, model, tok, SamplerSettings(), 0, lines.append)
    fallback = fallback_sampler(request, "vLLM failed to start (x)")
    assert type(fallback) is HFSampler
    assert lines == ["sampler: vLLM failed to start (x); using the transformers sampler"]
    model.config.model_type = "qwen2"
    assert type(fallback_sampler(request, "vLLM not available (y)")) is NativeSampler
    assert lines[-1] == "sampler: vLLM not available (y); using the native sampler"
    assert fallback_kind(model) == "native"
    model.to("meta")  # any device but the CPU: the native loop does not pay there (factory docstring)
    assert fallback_kind(model) == "hf"
