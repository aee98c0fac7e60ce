"""What a node is built from, as plain functions of its config (shared by the node, the simulations, the bench).

- `sampler_settings(cfg.sampler)`: the `SamplerSettings` a `[sampler]` table asks for (the one place it is built).
- `model_dir_for(cfg, override, progress)`: the HF model dir a node loads: a simulation's override, else
  `model.path`, else the embedded default model (built on first use, reporting progress).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from swarm_node.config import NodeConfig, SamplerConfig
from swarm_node.sampler.base import SamplerSettings


def sampler_settings(cfg: SamplerConfig) -> SamplerSettings:
    return SamplerSettings(cfg.threads, cfg.max_model_len, cfg.kv_cache_gb, cfg.max_num_seqs)


def model_dir_for(cfg: NodeConfig, override: Path | None = None,
                  progress: Callable[[int, int, str], None] | None = None) -> Path:
    if override is not None:
        return override
    if cfg.model.path:
        return Path(cfg.model.path)
    from swarm_node.model.default_model import ensure_default_model

    return ensure_default_model(progress)
