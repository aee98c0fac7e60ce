"""LoRA adapters (swarm_node/model/lora.py): attach, train, merge, write; and the shared vLLM engine serving several
policies as adapters, token-identical to the transformers sampler on the same adapter."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import torch
from safetensors.torch import load_file

from swarm_node.config import NodeConfig, SamplerConfig, TrainConfig
from swarm_node.errors import ConfigError
from swarm_node.model import lora
from swarm_node.model.char_recipe import CharRecipe, random_qwen2
from swarm_node.model.tokenizer import build_char_tokenizer
from swarm_node.sampler.base import SamplingParams
from swarm_node.sampler.hf import HFSampler
from swarm_node.train.trainer import Trainer
from swarm_node.types import TrainSample

if TYPE_CHECKING:
    from swarm_node.sampler.shared_lora import SharedLoRAEngine

# Head size 32: vLLM's CPU attention has no kernel for 16.
RECIPE = CharRecipe(hidden_size=64, layers=2, heads=2, kv_heads=1, intermediate_size=128, max_positions=128)
PROMPTS = ["12+34=", "7+8=", "What is 3+4?", "a", "99+1=", "5*6-2="]
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=24)
TOKENIZER = build_char_tokenizer()


def scaled_model(seed: int = 0) -> torch.nn.Module:
    """A random Qwen2 whose layers matter next to the residual stream (outputs depend on the prompt)."""
    model = random_qwen2(TOKENIZER, RECIPE, seed=seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() == 2 and "embed" not in name:
                param.mul_(10.0)
        model.model.norm.weight.mul_(16.0)
    return model.eval()


def randomise_adapters(model: torch.nn.Module, seed: int, scale: float = 0.5) -> None:
    """Give every B a non-zero value, so the adapter changes the outputs."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in lora.lora_modules(model).values():
            m.lora_B.weight.copy_(torch.randn(m.lora_B.weight.shape, generator=g) * scale)


def test_attach_keeps_the_model_and_its_weight_names() -> None:
    model = scaled_model()
    ids = torch.tensor([[3, 4, 5, 6, 7]])
    before = model(input_ids=ids).logits
    base_names = set(model.state_dict())
    wrapped = lora.attach_lora(model, rank=4, alpha=8.0, seed=1)
    assert len(wrapped) == RECIPE.layers * len(lora.TARGET_MODULES)
    assert torch.equal(model(input_ids=ids).logits, before)  # B = 0: exactly the base model
    names = set(model.state_dict())
    assert base_names <= names
    assert names - base_names == {f"{w}.lora_{ab}.weight" for w in wrapped for ab in "AB"}
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == names - base_names
    with pytest.raises(ValueError, match="already has LoRA"):
        lora.attach_lora(model, rank=4, alpha=8.0)
    with pytest.raises(ValueError, match="rank"):
        lora.attach_lora(scaled_model(), rank=0, alpha=8.0)


def test_training_moves_only_the_adapters_and_merging_reproduces_the_model() -> None:
    model = scaled_model()
    lora.attach_lora(model, rank=4, alpha=8.0, seed=1)
    base = {k: v.clone() for k, v in model.state_dict().items() if ".lora_" not in k}
    trainer = Trainer(model, TrainConfig(lr=1e-2, warmup_steps=0, minibatches=1), SamplerConfig(), pad_id=0)
    prompt = [3, 4, 5]
    samples = [TrainSample(prompt, [6, 7], [-1.0, -1.0], 1.0), TrainSample(prompt, [8, 9], [-1.0, -1.0], -1.0)]
    stats = trainer.train_step(samples)
    assert stats.minibatches == 1 and stats.skipped_minibatches == 0
    state = model.state_dict()
    assert all(torch.equal(state[k], v) for k, v in base.items())  # base frozen
    assert any(m.lora_B.weight.abs().sum() > 0 for m in lora.lora_modules(model).values())  # adapters moved
    merged_model = scaled_model()
    merged = lora.merged_state(model)
    assert set(merged) == set(merged_model.state_dict())
    merged_model.load_state_dict(merged)
    ids = torch.tensor([[3, 4, 5, 6, 7, 8]])
    torch.testing.assert_close(merged_model(input_ids=ids).logits, model(input_ids=ids).logits, atol=1e-4, rtol=1e-4)


def test_written_adapter_is_peft_layout(tmp_path: Path) -> None:
    model = scaled_model()
    lora.attach_lora(model, rank=4, alpha=8.0, seed=1)
    randomise_adapters(model, 2)
    tensors = lora.adapter_tensors(model)
    out = lora.write_adapter(tmp_path / "a", tensors, 4, 8.0)
    config = json.loads((out / lora.ADAPTER_CONFIG).read_text())
    assert config["r"] == 4 and config["lora_alpha"] == 8.0 and config["peft_type"] == "LORA"
    assert config["target_modules"] == sorted(lora.TARGET_MODULES)
    loaded = load_file(str(out / lora.ADAPTER_WEIGHTS))
    assert loaded.keys() == tensors.keys()
    assert all(torch.equal(loaded[k], tensors[k]) for k in tensors)
    assert "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" in loaded
    assert loaded["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"].shape == (4, RECIPE.hidden_size)
    with pytest.raises(ValueError, match="not LoRA adapter tensors"):
        lora.write_adapter(tmp_path / "b", model.state_dict(), 4, 8.0)
    assert not (tmp_path / "b").exists()


def test_lora_config_is_for_peers_only() -> None:
    with pytest.raises(ConfigError, match="lora_rank"):
        NodeConfig().with_values({"train.lora_rank": -1})
    with pytest.raises(ConfigError, match="lora_rank must be 0 for role 'learner'"):
        NodeConfig().with_values({"train.lora_rank": 8, "network.role": "learner"})


def shared_engine(tmp_path: Path, policies: int, **settings: float) -> SharedLoRAEngine:
    """A shared LoRA engine (rank 4, alpha 8) on `scaled_model()`, saved under tmp_path."""
    from swarm_node.sampler.base import SamplerSettings
    from swarm_node.sampler.shared_lora import SharedLoRAEngine

    base_dir = tmp_path / "base"
    scaled_model().save_pretrained(base_dir, safe_serialization=True)
    TOKENIZER.save_pretrained(base_dir)
    return SharedLoRAEngine(base_dir, TOKENIZER, SamplerSettings(threads=1, **settings), policies=policies, rank=4,
                            alpha=8.0, adapter_dir=tmp_path / "adapters")


@pytest.mark.vllm
def test_shared_engine_serves_each_policy_like_the_transformers_sampler(tmp_path: Path) -> None:
    pytest.importorskip("vllm")
    prompts = [TOKENIZER.encode(p) for p in PROMPTS]
    policies = []
    for seed in (1, 2):
        model = scaled_model()
        lora.attach_lora(model, rank=4, alpha=8.0, seed=seed)
        randomise_adapters(model, seed)
        policies.append(model)
    expected = [[g[0].token_ids for g in HFSampler(m, TOKENIZER).generate(prompts, 1, GREEDY)] for m in policies]
    base_expected = [g[0].token_ids for g in HFSampler(scaled_model(), TOKENIZER).generate(prompts, 1, GREEDY)]
    assert expected[0] != expected[1] != base_expected  # the adapters matter

    engine = shared_engine(tmp_path, 2, max_num_seqs=16, kv_cache_gb=0.01)
    try:
        a, b = engine.sampler("node0"), engine.sampler("node1")
        assert [g[0].token_ids for g in a.generate(prompts, 1, GREEDY)] == base_expected  # no adapter yet
        a.load_weights(lora.adapter_tensors(policies[0]), 3)
        b.load_weights(lora.adapter_tensors(policies[1]), 5)
        out_a, out_b = a.generate(prompts, 2, GREEDY), b.generate(prompts, 1, GREEDY)
        assert [g[0].token_ids for g in out_a] == expected[0]
        assert [g[0].token_ids for g in out_b] == expected[1]
        assert {c.version for g in out_a for c in g} == {3} and {c.version for g in out_b for c in g} == {5}
        # A new version replaces the adapter: node1 now serves node0's weights, and only the newest dir is kept.
        b.load_weights(lora.adapter_tensors(policies[0]), 6)
        assert [g[0].token_ids for g in b.generate(prompts, 1, GREEDY)] == expected[0]
        assert sorted(p.name for p in (tmp_path / "adapters" / "node1").iterdir()) == ["v6"]
        with pytest.raises(ValueError, match="unique"):
            engine.sampler("node0")
        with pytest.raises(ValueError, match="not LoRA adapter tensors"):
            a.load_weights(policies[0].state_dict(), 7)
        assert a.version == 3
    finally:
        engine.close()


@pytest.mark.vllm
def test_gathered_batch_gives_each_thread_its_own_results(tmp_path: Path) -> None:
    """Four threads' generate calls run as one engine batch and get exactly what they get alone: sampled (seeded)
    and greedy; a thread that leaves without generating does not hold the batch; a bad request fails alone."""
    pytest.importorskip("vllm")
    from concurrent.futures import ThreadPoolExecutor

    prompts = [TOKENIZER.encode(p) for p in PROMPTS]
    engine = shared_engine(tmp_path, 3, max_num_seqs=64, kv_cache_gb=0.02)
    try:
        samplers = [engine.sampler(f"node{i}") for i in range(3)]
        for i, s in enumerate(samplers[1:], start=1):
            model = scaled_model()
            lora.attach_lora(model, rank=4, alpha=8.0, seed=i)
            randomise_adapters(model, i)
            s.load_weights(lora.adapter_tensors(model), i)
        calls = [(samplers[0], SamplingParams(0.7, 0.9, 12, seed=5), 4), (samplers[1], GREEDY, 2),
                 (samplers[2], SamplingParams(1.0, 1.0, 12, seed=9), 3)]
        alone = [s.generate(prompts, n, p) for s, p, n in calls]
        batches: list[int] = []
        real_many = engine.engine.generate_many
        engine.engine.generate_many = lambda reqs: batches.append(len(reqs)) or real_many(reqs)  # type: ignore

        with engine.gather(5) as leave, ThreadPoolExecutor(5) as pool:
            def work(k: int) -> object:
                try:
                    if k == 3:
                        return None  # leaves without generating
                    if k == 4:
                        return samplers[0].generate([[0] * 200], 1, GREEDY)  # too long: fails alone
                    s, p, n = calls[k]
                    return s.generate(prompts, n, p)
                finally:
                    leave()
            futures = [pool.submit(work, k) for k in range(5)]
            together = [f.result() for f in futures[:4]]
            with pytest.raises(ValueError, match="exceeds the model's context"):
                futures[4].result()
        assert batches == [3]  # one engine call for the three generating threads
        assert together[:3] == alone and together[3] is None
    finally:
        engine.close()


class RecordingSampler(HFSampler):
    """The transformers sampler, asking for the weights in a given form and keeping what it was sent."""

    def __init__(self, *args: object, weights: str) -> None:
        super().__init__(*args)  # type: ignore[arg-type]
        self.weights = weights
        self.sent: list[dict[str, torch.Tensor]] = []

    def load_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        self.sent.append(state_dict)
        self.version = version


@pytest.mark.parametrize("form", ["full", "base", "adapter"])
def test_node_pushes_its_lora_policy_in_the_form_its_sampler_takes(form: str, warm_tiny_model_dir: Path,
                                                                   tmp_path: Path) -> None:
    from swarm_node.config import load_config
    from swarm_node.model.default_model import load_model
    from swarm_node.node.core import Node, NodeEvents

    # A model that stops with EOS (warmed up): an untrained one's completions are not well-formed, all score 0,
    # and a step without signal makes no update to push.
    cfg = load_config(None, {"model.path": str(warm_tiny_model_dir), "run.steps": 1, "run.prompts_per_step": 8,
                             "run.group_size": 4, "run.eval_problems": 0, "run.run_dir": str(tmp_path / "run"),
                             "train.threads": 1, "train.lora_rank": 4, "status.port": -1, "task.reward": "score"})
    model, tokenizer = load_model(warm_tiny_model_dir)
    sampler = RecordingSampler(model, tokenizer, weights=form)
    node = Node(cfg, events=NodeEvents(log=lambda _m: None), sampler=sampler)
    node.run()
    assert node.sampler is sampler and node.version == 1 and len(sampler.sent) == 1
    sent = sampler.sent[0]
    if form == "adapter":
        assert sent.keys() == lora.adapter_tensors(node.model).keys()
    else:
        expected = node.model.state_dict() if form == "full" else lora.merged_state(node.model)
        assert sent.keys() == expected.keys() and all(torch.equal(sent[k], expected[k]) for k in sent)
    assert any(".lora_B." in k for k in node.model.state_dict())  # the node trains adapters in every form
