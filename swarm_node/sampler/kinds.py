"""What each sampler kind asks of the node's memory sizing, answered by the kind itself (registry `SAMPLER_PLANS`,
names `variants.SAMPLER_KINDS`): no caller branches on a kind's name.

Contract: `SAMPLER_PLANS[kind](cfg)` returns a `SamplerPlan`: the kind that will run ("auto" is vLLM when it is
installed, else transformers: the factory tries vLLM first and falls back, to the native loop where it runs the
model on a CPU, whose plan is transformers' own), whether it generates in passes of a rows limit (transformers, native;
`Sampler.limit_rows`) or is an engine that allocates a context and a KV cache up front
(vLLM: in blocks of `KV_BLOCK_TOKENS`, beside `sizing.VLLM_RUNTIME_BYTES` of its own), and what of those the user
fixed (`max_model_len`, `kv_cache_gb`); what they left at 0 the node's sizing derives from one step
(train/memory_estimate.py: the prompt budget + max_new_tokens, one step's rows with headroom). The dtype is not
the kind's: every kind runs in the one the node picks (model/device.sampler_dtype). The vLLM constants live here,
where no vLLM import is needed; the vLLM sampler reads them from here.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

from swarm_node import variants
from swarm_node.config import SamplerConfig, VLLMSamplerConfig
from swarm_node.train import sizing

DEFAULT_MAX_NUM_SEQS = 256  # vLLM's max_num_seqs when the config leaves it at 0
# A vLLM engine started without the node's sizing (a benchmark, a test) and without kv_cache_gb: what
# max_num_seqs sequences of its context need, at most this share of the memory available at start.
KV_CACHE_MAX_FRACTION = 0.25
KV_BLOCK_TOKENS = 32  # the smallest block vLLM's CPU attention takes; the cache is allocated in whole blocks
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class SamplerPlan:
    kind: str  # the kind expected to run
    row_limited: bool  # generates in passes of at most a rows limit (transformers)
    context: int = 0  # an engine's context the user fixed (vLLM max_model_len); 0: derived
    kv_cache_bytes: int = 0  # an engine's KV cache the user fixed (vLLM kv_cache_gb); 0: derived
    kv_block_tokens: int = 1  # an engine's KV cache allocation unit
    engine_runtime_bytes: int = 0  # an engine's memory beyond its weights and KV cache


PlanFn = Callable[[SamplerConfig], SamplerPlan]
SAMPLER_PLANS: variants.Registry[PlanFn] = variants.Registry("sampler plan", variants.SAMPLER_KINDS)


@SAMPLER_PLANS.register("hf")
def _hf(cfg: SamplerConfig) -> SamplerPlan:
    return SamplerPlan("hf", row_limited=True)


@SAMPLER_PLANS.register("native")
def _native(cfg: SamplerConfig) -> SamplerPlan:
    return SamplerPlan("native", row_limited=True)  # transformers' passes, its cache preallocated per pass


@SAMPLER_PLANS.register("vllm")
def _vllm(cfg: SamplerConfig) -> SamplerPlan:
    engine = cast(VLLMSamplerConfig, cfg)  # "vllm" and "auto" are built as VLLMSamplerConfig (config/sampler.py)
    return SamplerPlan("vllm", row_limited=False, context=engine.max_model_len,
                       kv_cache_bytes=int(engine.kv_cache_gb * 2**30), kv_block_tokens=KV_BLOCK_TOKENS,
                       engine_runtime_bytes=sizing.VLLM_RUNTIME_BYTES)


@SAMPLER_PLANS.register("auto")
def _auto(cfg: SamplerConfig) -> SamplerPlan:
    kind = "vllm" if importlib.util.find_spec("vllm") is not None else "hf"
    return SAMPLER_PLANS[kind](cfg)


def plan_for(cfg: SamplerConfig) -> SamplerPlan:
    return SAMPLER_PLANS[cfg.kind](cfg)
