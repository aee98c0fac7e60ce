"""`[sampler]`: one class per sampler kind, chosen by `kind` (registry `SAMPLER_CONFIGS`, names
`variants.SAMPLER_KINDS`).

Every kind has the sampling settings (`SamplerConfig`: temperature, top_p, max_new_tokens; each left unset is the
model's own: node/build.with_model_defaults); the vLLM engine's
sizes belong to `VLLMSamplerConfig` ("vllm"), and to "auto", which starts vLLM when it can. Setting a vLLM key
with `kind = "hf"` or `"native"` is one ConfigError line (config/schema.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from swarm_node import variants
from swarm_node.config.checks import non_negative, one_of
from swarm_node.errors import ConfigError

NEUTRAL_SAMPLING = {"temperature": 1.0, "top_p": 1.0}  # for a model whose generation config sets neither
SAMPLING_RANGES = {"temperature": (0.0, 10.0), "top_p": (0.0, 1.0)}  # (low, high]: what [sampler] accepts


@dataclass(frozen=True)
class SamplerConfig:
    """The settings every sampler kind reads (the trainer reads them too: it computes the same processed
    log-probs). Built alone it is the transformers sampler's config."""

    section: ClassVar[str] = "sampler"
    by_kind: ClassVar[variants.Registry[type[SamplerConfig]]]

    kind: str = "hf"
    # None: the model's own, as transformers and vLLM sample a model by default (node/build.with_model_defaults: its
    # generation_config.json's temperature and top_p when it samples, else 1.0 and 1.0)
    temperature: float | None = None
    top_p: float | None = None
    # 0: the model's own (node/build.with_model_defaults: an embedded model's recipe declares it; any other model
    # gets 8)
    max_new_tokens: int = 0

    def validate(self) -> None:
        one_of(self, "kind", variants.SAMPLER_KINDS)
        for key, (low, high) in SAMPLING_RANGES.items():
            value = getattr(self, key)
            if value is not None and not low < value <= high:
                raise ConfigError(f"sampler.{key} must be in ({low:g}, {high:g}], got {value}")
        non_negative(self, "max_new_tokens")

    def temperature_top_p(self) -> tuple[float, float]:
        """Temperature and top-p, each left unset (a config not resolved against a model: tests, tools) the neutral
        1.0 that a model declaring neither gets."""
        return (NEUTRAL_SAMPLING["temperature"] if self.temperature is None else self.temperature,
                NEUTRAL_SAMPLING["top_p"] if self.top_p is None else self.top_p)

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


@SAMPLER_CONFIGS.register("native")
@dataclass(frozen=True)
class NativeSamplerConfig(SamplerConfig):
    """The native decoding loop (sampler/native.py): the transformers sampler's settings, nothing more."""

    kind: str = "native"


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
    """vLLM when it imports and starts, else the native sampler for a model it runs, else transformers: it takes
    vLLM's settings, used when vLLM runs."""

    kind: str = "auto"
