"""Each sampler kind answers the memory sizing's questions itself (sampler/kinds.py); hand-computed numbers."""

from __future__ import annotations

import importlib.util

import pytest

from swarm_node.config import load_config
from swarm_node.sampler import kinds
from swarm_node.sampler.kinds import SamplerPlan, plan_for
from swarm_node.train.sizing import VLLM_RUNTIME_BYTES, Footprint

# K and V of 2 layers x 2 kv heads x 16 dims in fp32: 2 * 2 * 2 * 16 * 4 = 512 bytes per token
FP = Footprint(params=1000, trainable=1000, layers=2, hidden=64, intermediate=128, heads=4, kv_heads=2, head_dim=16,
               vocab=50)
BUDGET = 40 * 2**20


def sampler(**overrides: object) -> object:
    return load_config(None, {f"sampler.{k}": v for k, v in overrides.items()}).sampler


def test_hf_generates_in_passes_on_its_fp32_copy() -> None:
    assert plan_for(sampler(kind="hf"), FP, 100, BUDGET) == SamplerPlan("hf", 100, row_limited=True, dtype_bytes=4)


def test_vllm_derives_its_kv_cache_as_the_engine_would() -> None:
    # 256 sequences x 100 tokens x 512 = 13,107,200 bytes, capped at a quarter of the budget (10,485,760); the floor
    # is one sequence in whole 32-token blocks: 128 x 512 = 65,536.
    assert plan_for(sampler(kind="vllm"), FP, 100, BUDGET) == SamplerPlan(
        "vllm", 100, row_limited=False, dtype_bytes=4, kv_cache_bytes=10_485_760, kv_floor_bytes=65_536,
        engine_runtime_bytes=VLLM_RUNTIME_BYTES)
    # 8 sequences of max_model_len 64: 8 x 64 x 512 = 262,144, under the cap; the floor 64 x 512 = 32,768
    small = plan_for(sampler(kind="vllm", max_model_len=64, max_num_seqs=8), FP, 100, BUDGET)
    assert (small.context, small.kv_cache_bytes, small.kv_floor_bytes) == (64, 262_144, 32_768)
    fixed = plan_for(sampler(kind="vllm", kv_cache_gb=0.5), FP, 100, BUDGET)
    assert fixed.kv_cache_bytes == 2**29


@pytest.mark.parametrize(("installed", "kind"), [(False, "hf"), (True, "vllm")])
def test_auto_is_vllm_when_it_is_installed(monkeypatch: pytest.MonkeyPatch, installed: bool, kind: str) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(kinds.importlib.util, "find_spec",
                        lambda name: (real("json") if installed else None) if name == "vllm" else real(name))
    plan = plan_for(sampler(kind="auto", max_num_seqs=8), FP, 100, BUDGET)
    assert plan.kind == kind and plan.row_limited == (kind == "hf")
    assert plan == plan_for(sampler(kind=kind, **({"max_num_seqs": 8} if kind == "vllm" else {})), FP, 100, BUDGET)
