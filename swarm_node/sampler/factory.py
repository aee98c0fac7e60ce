"""Choose and build a sampler by name (registry `SAMPLERS`): `auto` (vLLM when it imports and starts, else
transformers), `vllm`, `hf`.

Under `auto` a vLLM failure is one notice line and the HF fallback; under `vllm` it is an error.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from swarm_node import variants
from swarm_node.errors import UserError
from swarm_node.sampler.base import Sampler, SamplerSettings
from swarm_node.sampler.hf import HFSampler

LogFn = Callable[[str], None]


@dataclass(frozen=True)
class SamplerRequest:
    """Everything a sampler kind may need to start."""

    model_dir: Path
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    settings: SamplerSettings
    version: int
    log: LogFn


SamplerFactory = Callable[[SamplerRequest], Sampler]
SAMPLERS: variants.Registry[SamplerFactory] = variants.Registry("sampler", variants.SAMPLER_KINDS)


def make_sampler(kind: str, model_dir: Path, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase,
                 settings: SamplerSettings = SamplerSettings(), version: int = 0, log: LogFn = print) -> Sampler:
    if kind not in SAMPLERS:
        raise UserError(f"unknown sampler {kind!r}; choose one of {', '.join(variants.SAMPLER_KINDS)}")
    return SAMPLERS[kind](SamplerRequest(model_dir, model, tokenizer, settings, version, log))


@SAMPLERS.register("hf")
def _hf(req: SamplerRequest) -> Sampler:
    return HFSampler(req.model, req.tokenizer, req.version, log=req.log, dtype=req.settings.dtype)


@SAMPLERS.register("vllm")
def _vllm(req: SamplerRequest) -> Sampler:
    return _start_vllm(req, fallback=False)


@SAMPLERS.register("auto")
def _auto(req: SamplerRequest) -> Sampler:
    return _start_vllm(req, fallback=True)


def _start_vllm(req: SamplerRequest, fallback: bool) -> Sampler:
    try:
        from swarm_node.sampler.vllm_sampler import VLLMSampler
    # A broken install fails at import with more than ImportError (e.g. torchvision's "operator
    # torchvision::nms does not exist" is a RuntimeError).
    except (ImportError, RuntimeError, OSError) as exc:
        if not fallback:
            raise UserError(f"--sampler vllm: vLLM is not importable ({_first_line(exc)})") from exc
        req.log(f"sampler: vLLM not available ({_first_line(exc)}); using the transformers sampler")
        return _hf(req)
    try:
        sampler = VLLMSampler(req.model_dir, req.tokenizer, req.settings, req.version)
    except Exception as exc:  # noqa: BLE001 - any engine start failure means "fall back" under auto
        if not fallback:
            raise UserError(f"--sampler vllm: the vLLM engine failed to start: {_first_line(exc)}") from exc
        req.log(f"sampler: vLLM failed to start ({_first_line(exc)}); using the transformers sampler")
        return _hf(req)
    req.log(f"sampler: {sampler.summary()}")
    return sampler


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
