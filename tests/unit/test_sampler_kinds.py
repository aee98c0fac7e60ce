"""Each sampler kind answers the memory sizing's questions itself (sampler/kinds.py); hand-computed numbers."""

from __future__ import annotations

import importlib.util

import pytest

from swarm_node.config import load_config
from swarm_node.sampler import kinds
from swarm_node.sampler.kinds import SamplerPlan, plan_for
from swarm_node.train.sizing import VLLM_RUNTIME_BYTES


def sampler(**overrides: object) -> object:
    return load_config(None, {f"sampler.{k}": v for k, v in overrides.items()}).sampler


def test_hf_generates_in_passes() -> None:
    assert plan_for(sampler(kind="hf")) == SamplerPlan("hf", row_limited=True)


def test_vllm_leaves_what_the_user_did_not_fix_to_the_sizing() -> None:
    # Context and KV cache at 0: the node derives them from one step (train/memory_estimate.py), not from the
    # model's max_position_embeddings or a share of the budget.
    assert plan_for(sampler(kind="vllm")) == SamplerPlan(
        "vllm", row_limited=False, context=0, kv_cache_bytes=0, kv_block_tokens=32,
        engine_runtime_bytes=VLLM_RUNTIME_BYTES)
    fixed = plan_for(sampler(kind="vllm", max_model_len=64, kv_cache_gb=0.5))
    assert (fixed.context, fixed.kv_cache_bytes) == (64, 2**29)


@pytest.mark.parametrize(("installed", "kind"), [(False, "hf"), (True, "vllm")])
def test_auto_is_vllm_when_it_is_installed(monkeypatch: pytest.MonkeyPatch, installed: bool, kind: str) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(kinds.importlib.util, "find_spec",
                        lambda name: (real("json") if installed else None) if name == "vllm" else real(name))
    plan = plan_for(sampler(kind="auto", max_model_len=64))
    assert plan.kind == kind and plan.row_limited == (kind == "hf")
    assert plan == plan_for(sampler(kind=kind, **({"max_model_len": 64} if kind == "vllm" else {})))
