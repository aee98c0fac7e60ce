"""What a node is built from, as plain functions of its config (shared by the node, the simulations, the bench).

- `sampler_settings(cfg.sampler, sizes, dtype)`: the `SamplerSettings` a `[sampler]` table asks for (the one place
  it is built): the sampler kind's engine settings (`SamplerConfig.engine_knobs`), the KV cache and context the
  node's memory sizing chose (`Hardware.sizes`, node/hardware.py) in place of the configured ones when there are,
  and the dtype the node picked (`Hardware.sampler_dtype`).
- `model_dir_for(cfg, override, progress)`: the HF model dir a node loads: a simulation's override, else
  `model.path`, else the embedded model of `model.recipe` (built on first use, reporting progress).
- `with_model_defaults(cfg, model_dir)`: the config with every sampling setting left to the model filled in: the
  generation budget (`sampler.max_new_tokens` when given, else the model's own: an embedded model's recipe declares
  it, else `FALLBACK_MAX_NEW_TOKENS`), and temperature and top-p (when given, else the model's
  `generation_config.json`'s, as transformers and vLLM sample a model by default, else 1.0). `model_sampling`
  reads those two from the model directory.
- `seeded(cfg, peer_id)`: the config with a run seed: the one given, else one derived from the node's identity
  (`identity_seed`: `join`, so that two peers left at the defaults draw different tasks), else 0.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable
from pathlib import Path

from swarm_node.config import NodeConfig, SamplerConfig
from swarm_node.config.sampler import NEUTRAL_SAMPLING, SAMPLING_RANGES
from swarm_node.sampler.base import SamplerSettings
from swarm_node.train.sizing import Sizes


def sampler_settings(cfg: SamplerConfig, sizes: Sizes | None = None, dtype: str = "float32") -> SamplerSettings:
    settings = SamplerSettings(**cfg.engine_knobs(), dtype=dtype)
    if sizes is not None and sizes.kv_cache_bytes:
        settings = dataclasses.replace(settings, kv_cache_gb=sizes.kv_cache_bytes / 2**30)
    if sizes is not None and sizes.max_model_len:
        settings = dataclasses.replace(settings, max_model_len=sizes.max_model_len)
    return settings


def model_dir_for(cfg: NodeConfig, override: Path | None = None,
                  progress: Callable[[int, int, str], None] | None = None) -> Path:
    if override is not None:
        return override
    if cfg.model.path:
        return Path(cfg.model.path)
    from swarm_node.model.default_model import ensure_default_model

    return ensure_default_model(progress, cfg.model.recipe)


FALLBACK_MAX_NEW_TOKENS = 8  # a model that declares no budget of its own: an answer line and its EOS


def model_sampling(model_dir: Path) -> dict[str, float]:
    """The temperature and top-p the model's `generation_config.json` sets (those it does not, or sets outside what
    `[sampler]` accepts, such as a temperature of 0 for greedy decoding: absent)."""
    path = model_dir / "generation_config.json"
    declared = json.loads(path.read_text()) if path.exists() else {}
    return {key: float(declared[key]) for key, (low, high) in SAMPLING_RANGES.items()
            if isinstance(declared.get(key), int | float) and low < declared[key] <= high}


def with_model_defaults(cfg: NodeConfig, model_dir: Path) -> NodeConfig:
    filled: dict[str, float | int] = {}
    if not cfg.sampler.max_new_tokens:
        from swarm_node.model.default_model import own_budget

        filled["sampler.max_new_tokens"] = own_budget(model_dir) or FALLBACK_MAX_NEW_TOKENS
    unset = [key for key in NEUTRAL_SAMPLING if getattr(cfg.sampler, key) is None]
    if unset:
        own = {**NEUTRAL_SAMPLING, **model_sampling(model_dir)}
        filled.update({f"sampler.{key}": own[key] for key in unset})
    return cfg.with_values(filled, " (the model's own)") if filled else cfg


def identity_seed(peer_id: str) -> int:
    """The run seed a node derives from its identity when none is given (31 bits of sha256(peer id))."""
    return int.from_bytes(hashlib.sha256(peer_id.encode()).digest()[:4], "little") & 0x7FFFFFFF


def seeded(cfg: NodeConfig, peer_id: str | None = None) -> NodeConfig:
    if cfg.run.seed is not None:
        return cfg
    return cfg.with_values({"run.seed": identity_seed(peer_id) if peer_id is not None else 0})
