"""What a node is built from, as plain functions of its config (shared by the node, the simulations, the bench).

- `sampler_settings(cfg.sampler, sizes)`: the `SamplerSettings` a `[sampler]` table asks for (the one place it is
  built): the sampler kind's engine settings (`SamplerConfig.engine_knobs`), the KV cache the node's memory sizing
  chose (`Hardware.sizes`, node/hardware.py) in place of the configured one when there is one.
- `model_dir_for(cfg, override, progress)`: the HF model dir a node loads: a simulation's override, else
  `model.path`, else the embedded default model (built on first use, reporting progress).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from swarm_node.config import NodeConfig, SamplerConfig
from swarm_node.sampler.base import SamplerSettings
from swarm_node.train.sizing import Sizes


def sampler_settings(cfg: SamplerConfig, sizes: Sizes | None = None) -> SamplerSettings:
    settings = SamplerSettings(**cfg.engine_knobs())
    if sizes is not None and sizes.kv_cache_bytes:
        settings = dataclasses.replace(settings, kv_cache_gb=sizes.kv_cache_bytes / 2**30)
    return settings


def model_dir_for(cfg: NodeConfig, override: Path | None = None,
                  progress: Callable[[int, int, str], None] | None = None) -> Path:
    if override is not None:
        return override
    if cfg.model.path:
        return Path(cfg.model.path)
    from swarm_node.model.default_model import ensure_default_model

    return ensure_default_model(progress)
