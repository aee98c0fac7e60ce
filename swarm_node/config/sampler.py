"""`[sampler]`: one class per sampler kind, chosen by `kind` (registry `SAMPLER_CONFIGS`, names
`variants.SAMPLER_KINDS`).

Every kind has the sampling settings (`SamplerConfig`: temperature, top_p, max_new_tokens); the vLLM engine's
sizes belong to `VLLMSamplerConfig` ("vllm"), and to "auto", which starts vLLM when it can. Setting a vLLM key
with `kind = "hf"` is one ConfigError line (config/schema.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from swarm_node import variants
from swarm_node.config.checks import non_negative, one_of
from swarm_node.errors import ConfigError


@dataclass(frozen=True)
class SamplerConfig:
    """The settings every sampler kind reads (the trainer reads them too: it computes the same processed
    log-probs). Built alone it is the transformers sampler's config."""

    section: ClassVar[str] = "sampler"
    by_kind: ClassVar[variants.Registry[type[SamplerConfig]]]

    kind: str = "hf"
    temperature: float = 1.0
    top_p: float = 1.0
    # 0: the model's own (node/build.budgeted: an embedded model's recipe declares it; any other model gets 8)
    max_new_tokens: int = 0

    def validate(self) -> None:
        one_of(self, "kind", variants.SAMPLER_KINDS)
        if not 0 < self.temperature <= 10:
            raise ConfigError(f"sampler.temperature must be in (0, 10], got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"sampler.top_p must be in (0, 1], got {self.top_p}")
        non_negative(self, "max_new_tokens")

    def engine_knobs(self) -> dict[str, float]:
        """This kind's engine settings, as sampler/base.SamplerSettings names them (none for transformers)."""
        return {}


SAMPLER_CONFIGS: variants.Registry[type[SamplerConfig]] = variants.Registry("sampler config", variants.SAMPLER_KINDS)
SamplerConfig.by_kind = SAMPLER_CONFIGS


@SAMPLER_CONFIGS.register("hf")
@dataclass(frozen=True)
class HFSamplerConfig(SamplerConfig):
    """transformers' generate(): nothing beyond the sampling settings (its rows per pass come from sizing)."""

    kind: str = "hf"


@SAMPLER_CONFIGS.register("vllm")
@dataclass(frozen=True)
class VLLMSamplerConfig(SamplerConfig):
    """The vLLM engine; 0 means "derived" (sampler/vllm_sampler.py, sampler/kinds.py)."""

    kind: str = "vllm"
    threads: int = 0  # 0: derived from the machine (see sampler/vllm_sampler.py)
    max_model_len: int = 0  # 0: the prompt budget + max_new_tokens, at most the model's context (docs/SIZING.md)
    kv_cache_gb: float = 0.0  # 0: one step's rows at full length x 1.25, then the node's memory sizing
    max_num_seqs: int = 0  # 0: vLLM's default (sampler/kinds.py)

    def validate(self) -> None:
        super().validate()
        non_negative(self, "threads", "max_model_len", "kv_cache_gb", "max_num_seqs")

    def engine_knobs(self) -> dict[str, float]:
        return {"threads": self.threads, "max_model_len": self.max_model_len, "kv_cache_gb": self.kv_cache_gb,
                "max_num_seqs": self.max_num_seqs}


@SAMPLER_CONFIGS.register("auto")
@dataclass(frozen=True)
class AutoSamplerConfig(VLLMSamplerConfig):
    """vLLM when it imports and starts, else transformers: it takes vLLM's settings, used when vLLM runs."""

    kind: str = "auto"
