"""The vLLM sampler against the transformers reference: greedy parity before and after weight updates, processed
log-probs, seeds, bad input, engine sizing and the `auto|vllm|hf` choice. One engine for the whole module.

The model is a small seeded random Qwen2 whose weights are scaled so that it is not degenerate: greedy outputs vary
with the prompt and some stop at EOS while others run to the token limit, and the T=0.7 / top-p 0.9 nucleus holds a
handful of tokens (an unscaled random model is near-uniform, where parity and top-p would prove little). Its head
size is 32: vLLM's CPU attention has no kernel for the head size 16 of conftest's `tiny_model_dir`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

vllm = pytest.importorskip("vllm")

from swarm_node.errors import UserError  # noqa: E402
from swarm_node.model.char_recipe import CharRecipe, random_qwen2  # noqa: E402
from swarm_node.model.tokenizer import build_char_tokenizer  # noqa: E402
from swarm_node.rl.logprobs import processed_log_softmax  # noqa: E402
from swarm_node.sampler.base import PromptTooLongError, ResumeError, SamplerSettings, SamplingParams  # noqa: E402
from swarm_node.sampler.factory import make_sampler  # noqa: E402
from swarm_node.sampler.hf import HFSampler  # noqa: E402
from swarm_node.sampler.native import NativeSampler  # noqa: E402
from swarm_node.sampler.vllm_sampler import EngineSizes, ModelShape, VLLMSampler, derive_engine_sizes  # noqa: E402

pytestmark = pytest.mark.vllm

RECIPE = CharRecipe(hidden_size=64, layers=2, heads=2, kv_heads=1, intermediate_size=128, max_positions=128)
PROMPTS = ["12+34=", "7+8=", "What is 3+4?", "a", "99+1=", "5*6-2=", "Q: 2+2\nA:", "x"]
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=32)
EOS = 1


def scaled_model(seed: int) -> torch.nn.Module:
    model = random_qwen2(build_char_tokenizer(), RECIPE, seed=seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() == 2 and "embed" not in name:
                param.mul_(10.0)  # layers that matter next to the residual stream: outputs depend on context
        model.model.norm.weight.mul_(16.0)  # peaked logits: a nucleus of a few tokens at T=0.7, top-p 0.9
        model.model.embed_tokens.weight[EOS].mul_(1.5)  # some greedy completions stop at EOS
    return model.eval()


@pytest.fixture(scope="module")
def tokenizer():
    return build_char_tokenizer()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory, tokenizer) -> Path:
    path = tmp_path_factory.mktemp("vllm-model")
    scaled_model(0).save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def sampler(model_dir: Path, tokenizer) -> Iterator[VLLMSampler]:
    s = VLLMSampler(model_dir, tokenizer, SamplerSettings(threads=2), version=0)
    yield s
    s.close()


@pytest.fixture(scope="module")
def prompts(tokenizer) -> list[list[int]]:
    return [tokenizer.encode(p) for p in PROMPTS]


def test_greedy_equals_hf_token_for_token(sampler: VLLMSampler, prompts: list[list[int]], tokenizer) -> None:
    hf = HFSampler(scaled_model(0), tokenizer, version=0)
    ours = sampler.generate(prompts, 2, GREEDY)
    ref = hf.generate(prompts, 2, GREEDY)
    assert [[c.token_ids for c in g] for g in ours] == [[c.token_ids for c in g] for g in ref]
    assert [[c.text for c in g] for g in ours] == [[c.text for c in g] for g in ref]
    for group, ref_group in zip(ours, ref, strict=True):
        assert len(group) == 2 and group[0].token_ids == group[1].token_ids
        for c, r in zip(group, ref_group, strict=True):
            assert c.version == 0
            assert len(c.logprobs) == len(c.token_ids)
            assert max(abs(a - b) for a, b in zip(c.logprobs, r.logprobs, strict=True)) < 1e-4
    firsts = [g[0] for g in ours]
    stopped = [c for c in firsts if c.token_ids[-1] == EOS]
    # Both ways a completion ends are exercised: EOS kept in the ids and left out of the text; or the limit.
    assert stopped and any(len(c.token_ids) == GREEDY.max_new_tokens and EOS not in c.token_ids for c in firsts)
    for c in stopped:
        assert EOS not in c.token_ids[:-1]
        assert c.text == tokenizer.decode(c.token_ids[:-1], skip_special_tokens=True)


def test_seeded_batch_larger_than_one_prefill_step(sampler: VLLMSampler) -> None:
    """More distinct prompt tokens than one engine step takes (vLLM's default budget is 4096 tokens): vLLM 0.32
    split such a prefill across steps and then crashed on seeded requests ("CPU Generator does not use offset");
    the sampler schedules whole prefills only, so a large seeded batch completes, and reproducibly."""
    rng = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 60, (100,), generator=rng).tolist() for _ in range(64)]  # 6,400 distinct tokens
    params = SamplingParams(temperature=1.0, max_new_tokens=4, seed=3)
    first = sampler.generate(prompts, 2, params)
    assert [len(g) for g in first] == [2] * 64
    assert [[c.token_ids for c in g] for g in sampler.generate(prompts, 2, params)] == \
        [[c.token_ids for c in g] for g in first]


def test_sampled_logprobs_are_the_processed_distribution(sampler: VLLMSampler, prompts: list[list[int]]) -> None:
    params = SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=24, seed=11)
    groups = sampler.generate(prompts, 4, params)
    hf_model = scaled_model(0)
    far_from_raw = total = 0
    for prompt, group in zip(prompts, groups, strict=True):
        assert len(group) == 4
        for c in group:
            ids = torch.tensor([[*prompt, *c.token_ids]])
            with torch.no_grad():
                logits = hf_model(ids).logits[0, len(prompt) - 1: -1]  # [new tokens, V]: logits that drew each token
            sampled = torch.tensor(c.token_ids)[:, None]
            expected = processed_log_softmax(logits, 0.7, 0.9).gather(-1, sampled)[:, 0]
            raw = logits.log_softmax(-1).gather(-1, sampled)[:, 0]
            assert torch.isfinite(expected).all()  # every sampled token lies inside the nucleus
            assert (expected - torch.tensor(c.logprobs)).abs().max().item() < 1e-3
            far_from_raw += int(((expected - raw).abs() > 0.05).sum())
            total += len(c.token_ids)
    assert far_from_raw > total // 2  # the check tells processed from raw log-probs apart


def test_seed_reproduces_and_samples_differ(sampler: VLLMSampler, prompts: list[list[int]]) -> None:
    params = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=16, seed=3)
    first = [[c.token_ids for c in g] for g in sampler.generate(prompts[:3], 4, params)]
    again = [[c.token_ids for c in g] for g in sampler.generate(prompts[:3], 4, params)]
    other = [[c.token_ids for c in g] for g in sampler.generate(prompts[:3], 4, SamplingParams(1.0, 1.0, 16, seed=4))]
    assert first == again
    assert first != other
    assert all(len({tuple(ids) for ids in g}) > 1 for g in first)  # the n samples of a prompt are not copies


def test_weight_update_changes_output_and_keeps_parity(sampler: VLLMSampler, prompts: list[list[int]],
                                                       tokenizer) -> None:
    before = [g[0].token_ids for g in sampler.generate(prompts, 1, GREEDY)]
    new_model = scaled_model(1)
    # Tied embeddings: a state dict without lm_head must do (vLLM's reload alone would keep the old head).
    new_state = {k: v for k, v in new_model.state_dict().items() if k != "lm_head.weight"}
    torch.set_num_threads(1)
    sampler.load_weights(new_state, version=1)
    assert torch.get_num_threads() == 1  # the sampler's 2 threads were for the update only
    hf = HFSampler(new_model, tokenizer, version=1)
    after = sampler.generate(prompts, 1, GREEDY)
    assert [g[0].token_ids for g in after] == [g[0].token_ids for g in hf.generate(prompts, 1, GREEDY)]
    assert sum(g[0].token_ids != b for g, b in zip(after, before, strict=True)) >= len(prompts) // 2
    assert all(g[0].version == 1 for g in after)
    sampler.load_weights(scaled_model(0).state_dict(), version=2)  # back to the start weights, lm_head included
    restored = sampler.generate(prompts, 1, GREEDY)
    assert [g[0].token_ids for g in restored] == before
    assert restored[0][0].version == 2


def test_resume_continues_partial_completions_as_one_greedy_generation(sampler: VLLMSampler,
                                                                        prompts: list[list[int]]) -> None:
    """APRIL: prompt + tokens so far re-prefilled; with the weights unchanged (a new version after a load that reset
    the prefix cache), the resumed completions are the uninterrupted ones token for token."""
    weights = scaled_model(0).state_dict()
    sampler.load_weights(weights, version=5)
    whole = [g[0] for g in sampler.generate(prompts, 1, GREEDY)]
    chunk = SamplingParams(temperature=0.0, max_new_tokens=8)
    parts = [g[0] for g in sampler.generate(prompts, 1, chunk)]
    resumed_at: dict[int, int] = {}
    for round_ in range(3):
        if round_ == 1:
            sampler.load_weights(weights, version=6)
        todo = [i for i, c in enumerate(parts) if c.token_ids[-1] != EOS and len(c.token_ids) < 32]
        if round_ == 1:
            resumed_at = {i: len(parts[i].token_ids) for i in todo}
        for i, c in zip(todo, sampler.resume([prompts[i] for i in todo], [parts[i] for i in todo], chunk),
                        strict=True):
            parts[i] = c
    assert [c.token_ids for c in parts] == [c.token_ids for c in whole]
    assert [c.text for c in parts] == [c.text for c in whole]
    assert resumed_at  # some completion ran past the first chunk and crossed the version change
    for i, start in resumed_at.items():
        assert parts[i].spans == ((0, 5), (start, 6))
    with pytest.raises(ResumeError):
        sampler.resume([prompts[0]], [parts[0].__class__((10**6,), "", (-1.0,), 5)], chunk)


def test_prompt_too_long_is_rejected_before_the_engine(sampler: VLLMSampler, prompts: list[list[int]]) -> None:
    long_prompt = [5] * 120
    with pytest.raises(PromptTooLongError, match="prompt 1 has 120 tokens; with 16 new tokens it exceeds the "
                                                 "model's context of 128"):
        sampler.generate([prompts[0], long_prompt], 2, SamplingParams(1.0, 1.0, 16))
    assert len(sampler.generate([long_prompt], 1, SamplingParams(0.0, 1.0, 8))[0][0].token_ids) <= 8  # 128 fits


def test_partial_or_foreign_state_dict_is_rejected(sampler: VLLMSampler, prompts: list[list[int]]) -> None:
    version = sampler.version
    state = scaled_model(1).state_dict()
    partial = {k: v for k, v in state.items() if k != "model.norm.weight"}
    with pytest.raises(ValueError, match=r"missing \['model.norm.weight'\] \(1\), unknown \[\] \(0\)"):
        sampler.load_weights(partial, version=9)
    with pytest.raises(ValueError, match=r"missing \[\] \(0\), unknown \['extra.weight'\] \(1\)"):
        sampler.load_weights({**state, "extra.weight": torch.zeros(1)}, version=9)
    assert sampler.version == version  # nothing was installed
    assert sampler.generate(prompts[:1], 1, GREEDY)[0][0].version == version


@pytest.mark.parametrize(("batch", "n", "message"), [
    ([[5, 99]], 1, r"prompt 0 has token ids outside the vocabulary of 99: \[99\]"),
    ([[5], []], 1, "prompt 1 is empty"),
    ([[5]], 0, "n must be >= 1, got 0"),
])
def test_bad_input_is_rejected(sampler: VLLMSampler, batch: list[list[int]], n: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        sampler.generate(batch, n, GREEDY)


def test_engine_leaves_the_thread_count_to_the_caller(sampler: VLLMSampler, prompts: list[list[int]]) -> None:
    assert torch.set_num_threads is torch._C.set_num_threads  # vLLM's no-op patch was undone
    torch.set_num_threads(1)
    sampler.generate(prompts[:1], 1, GREEDY)
    assert torch.get_num_threads() == 1


def test_engine_sizes_follow_the_model_and_the_machine() -> None:
    shape = ModelShape.from_config({"num_hidden_layers": 4, "num_attention_heads": 6, "num_key_value_heads": 2,
                                    "hidden_size": 192, "max_position_embeddings": 256, "vocab_size": 99})
    assert shape == ModelShape(layers=4, kv_heads=2, head_dim=32, max_positions=256, vocab_size=99,
                               tied_embeddings=False)
    assert shape.kv_bytes_per_token("float32") == 2 * 4 * 2 * 32 * 4 == 2048
    gib = 2**30
    # 256 sequences x 256 tokens x 2 KiB = 128 MiB, well under a quarter of 8 GiB.
    assert derive_engine_sizes(SamplerSettings(), shape, cores=2, available_bytes=8 * gib) == EngineSizes(
        threads=2, max_model_len=256, max_num_seqs=256, kv_cache_bytes=128 * 2**20)
    # Capped at a quarter of 256 MiB ...
    assert derive_engine_sizes(SamplerSettings(), shape, 2, 256 * 2**20).kv_cache_bytes == 64 * 2**20
    # ... but never below one full-length sequence (eight 32-token blocks of 2 KiB per token).
    assert derive_engine_sizes(SamplerSettings(), shape, 2, 2**20).kv_cache_bytes == 256 * 2048
    sized = derive_engine_sizes(SamplerSettings(threads=1, max_model_len=100, max_num_seqs=8, dtype="bfloat16"),
                                shape, cores=16, available_bytes=8 * gib)
    assert sized == EngineSizes(threads=1, max_model_len=100, max_num_seqs=8, kv_cache_bytes=8 * 100 * 1024)
    # One sequence of 100 tokens takes four 32-token blocks: the floor when only 1 MiB is free.
    assert derive_engine_sizes(SamplerSettings(max_model_len=100), shape, 2, 2**20).kv_cache_bytes == 128 * 2048
    assert derive_engine_sizes(SamplerSettings(kv_cache_gb=0.5), shape, 2, gib).kv_cache_bytes == gib // 2
    # No head_dim or kv-head entries: derived from hidden size and attention heads.
    assert ModelShape.from_config({"num_hidden_layers": 1, "num_attention_heads": 4, "hidden_size": 256,
                                   "vocab_size": 10}) == ModelShape(1, 4, 64, 2048, 10)


@pytest.mark.parametrize(("settings", "message"), [
    (SamplerSettings(max_model_len=512), "max_model_len 512 exceeds the model's context of 256 tokens"),
    (SamplerSettings(kv_cache_gb=0.0001), "kv_cache_gb 0.0001 is too small: one sequence of 256 tokens needs"),
    (SamplerSettings(dtype="int8"), "sampler dtype 'int8' is not one of float32, bfloat16, float16"),
])
def test_impossible_engine_settings_are_user_errors(settings: SamplerSettings, message: str) -> None:
    shape = ModelShape(layers=4, kv_heads=2, head_dim=32, max_positions=256, vocab_size=99)
    with pytest.raises(UserError, match=message):
        derive_engine_sizes(settings, shape, cores=2, available_bytes=2**30)


def test_factory_falls_back_only_under_auto(tiny_model_dir: Path, tokenizer) -> None:
    # conftest's tiny model has head size 16, which vLLM's CPU attention cannot run: a start failure.
    hf_model = random_qwen2(tokenizer, CharRecipe(hidden_size=64, layers=2, heads=4, kv_heads=2,
                                                          intermediate_size=128, max_positions=256), seed=0)
    with pytest.raises(UserError, match="--sampler vllm: the vLLM engine failed to start: vLLM's CPU backend "
                                        "does not support attention head size 16"):
        make_sampler("vllm", tiny_model_dir, hf_model, tokenizer, log=lambda line: None)
    lines: list[str] = []
    fallback = make_sampler("auto", tiny_model_dir, hf_model, tokenizer, log=lines.append)
    assert type(fallback) is NativeSampler  # a Qwen2: the native loop runs it
    assert lines == ["sampler: vLLM failed to start (vLLM's CPU backend does not support attention head size 16 "
                     "(supported: 32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)); using the native "
                     "sampler"]
    with pytest.raises(UserError, match="has no config.json"):
        make_sampler("vllm", tiny_model_dir / "missing", hf_model, tokenizer, log=lambda line: None)
    assert type(make_sampler("hf", tiny_model_dir, hf_model, tokenizer, log=lines.append)) is HFSampler
    assert len(lines) == 1  # `hf` says nothing


def test_factory_auto_starts_vllm_and_keeps_the_callers_rng(model_dir: Path, tokenizer,
                                                            sampler: VLLMSampler) -> None:
    lines: list[str] = []
    hf_model = scaled_model(0)
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    second = make_sampler("auto", model_dir, hf_model, tokenizer, SamplerSettings(threads=1, max_num_seqs=4),
                          version=5, log=lines.append)
    try:
        assert torch.equal(torch.rand(3), expected)  # vLLM reseeds the global RNG at start; we undo it
        assert isinstance(second, VLLMSampler)
        # KV: 4 sequences x 128 tokens x (2 x 2 layers x 1 kv head x 32 x 4 bytes) = 256 KiB.
        assert lines == [f"sampler: vLLM {vllm.__version__} in-process, 1 threads, float32, max_model_len 128, "
                         "max_num_seqs 4, KV cache 0.25 MiB"]
        out = second.generate([[5, 6, 7]], 1, SamplingParams(0.0, 1.0, 8))[0][0]
        assert out.version == 5
        assert out.token_ids == sampler.generate([[5, 6, 7]], 1, SamplingParams(0.0, 1.0, 8))[0][0].token_ids
    finally:
        second.close()

