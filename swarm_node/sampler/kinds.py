"""What each sampler kind asks of the node's memory sizing, answered by the kind itself (registry `SAMPLER_PLANS`,
names `variants.SAMPLER_KINDS`): no caller branches on a kind's name.

Contract: `SAMPLER_PLANS[kind](cfg, fp, model_context, budget)` returns a `SamplerPlan`: the kind that will run
("auto" is vLLM when it is installed, else transformers: the factory tries vLLM first and falls back), its context,
whether it generates in passes of a rows limit (transformers; `Sampler.limit_rows`), its weight dtype, and the
KV cache an engine asks for and its floor. vLLM's KV cache, unless `kv_cache_gb` fixes it, is what the engine
would derive (`max_num_seqs` full-length sequences, capped at `KV_CACHE_MAX_FRACTION` of the budget), at least one
full-length sequence in whole blocks. The vLLM constants live here, where no vLLM import is needed; the vLLM
sampler reads them from here.
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
KV_CACHE_MAX_FRACTION = 0.25  # of the memory available at start: the trainer, its optimizer and peers need the rest
KV_BLOCK_TOKENS = 32  # the smallest block vLLM's CPU attention takes; the cache is allocated in whole blocks
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
ENGINE_DTYPE = "float32"  # SamplerSettings.dtype's default: exact parity with the trainer


@dataclass(frozen=True)
class SamplerPlan:
    kind: str  # the kind expected to run
    context: int  # tokens of one sequence at most
    row_limited: bool  # generates in passes of at most a rows limit (transformers)
    dtype_bytes: int  # its copy of the weights
    kv_cache_bytes: int = 0  # an engine's KV cache asked for (0 for transformers)
    kv_floor_bytes: int = 0  # an engine's smallest KV cache: one full-length sequence
    engine_runtime_bytes: int = 0  # an engine's memory beyond its weights and KV cache


PlanFn = Callable[[SamplerConfig, sizing.Footprint, int, int], SamplerPlan]
SAMPLER_PLANS: variants.Registry[PlanFn] = variants.Registry("sampler plan", variants.SAMPLER_KINDS)


@SAMPLER_PLANS.register("hf")
def _hf(cfg: SamplerConfig, fp: sizing.Footprint, model_context: int, budget: int) -> SamplerPlan:
    return SamplerPlan("hf", model_context, row_limited=True, dtype_bytes=sizing.FLOAT)


@SAMPLER_PLANS.register("vllm")
def _vllm(cfg: SamplerConfig, fp: sizing.Footprint, model_context: int, budget: int) -> SamplerPlan:
    engine = cast(VLLMSamplerConfig, cfg)  # "vllm" and "auto" are built as VLLMSamplerConfig (config/sampler.py)
    context = min(model_context, engine.max_model_len or model_context)
    dtype = DTYPE_BYTES[ENGINE_DTYPE]
    per_token = fp.kv_bytes_per_token(dtype)
    floor = per_token * -(-context // KV_BLOCK_TOKENS) * KV_BLOCK_TOKENS
    kv = int(engine.kv_cache_gb * 2**30)
    if not kv:
        kv = max(floor, min(per_token * context * (engine.max_num_seqs or DEFAULT_MAX_NUM_SEQS),
                            int(budget * KV_CACHE_MAX_FRACTION)))
    return SamplerPlan("vllm", context, row_limited=False, dtype_bytes=dtype, kv_cache_bytes=kv, kv_floor_bytes=floor,
                       engine_runtime_bytes=sizing.VLLM_RUNTIME_BYTES)


@SAMPLER_PLANS.register("auto")
def _auto(cfg: SamplerConfig, fp: sizing.Footprint, model_context: int, budget: int) -> SamplerPlan:
    kind = "vllm" if importlib.util.find_spec("vllm") is not None else "hf"
    return SAMPLER_PLANS[kind](cfg, fp, model_context, budget)


def plan_for(cfg: SamplerConfig, fp: sizing.Footprint, model_context: int, budget: int) -> SamplerPlan:
    return SAMPLER_PLANS[cfg.kind](cfg, fp, model_context, budget)
