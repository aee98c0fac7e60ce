"""Choose and build a sampler by name (registry `SAMPLERS`): `auto` (vLLM when it imports and starts, else the
native decoding loop for a model it runs on a CPU, else transformers), `vllm`, `native`, `hf`.

Why the native loop on a CPU only: there it is ~5x faster than `generate()` on the embedded default (its time goes
to `generate()`'s per-step bookkeeping); on a GPU both are bound by kernel launches, and the native loop ran at
0.88x the transformers sampler's tokens/s (Qwen2.5-0.5B shape, bf16, 8 rows, a lent H200:
bench/results/gpu_check.json `generation`).

Under `auto` a vLLM failure is one notice line and the fallback; under `vllm` it is an error, and so is `native` for
a model that the native decoder does not run (sampler/kv_decoder.unsupported says why).
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
from swarm_node.sampler.native import NativeSampler, unsupported

LogFn = Callable[[str], None]
SAMPLER_WORDS = {"hf": "transformers"}  # how a line names a kind


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


@SAMPLERS.register("native")
def _native(req: SamplerRequest) -> Sampler:
    if (why := unsupported(req.model)) is not None:
        raise UserError(f"sampler native does not run this model ({why}); use sampler.kind = \"hf\"")
    return NativeSampler(req.model, req.tokenizer, req.version, log=req.log, dtype=req.settings.dtype)


def fallback_kind(model: PreTrainedModel) -> str:
    """`auto`'s sampler without vLLM: `native` for a model it runs on a CPU, else `hf` (module docstring)."""
    on_cpu = next(model.parameters()).device.type == "cpu"
    return "native" if on_cpu and unsupported(model) is None else "hf"


def fallback_sampler(req: SamplerRequest, reason: str) -> Sampler:
    """`auto` without vLLM: `fallback_kind`'s sampler, named in one line."""
    kind = fallback_kind(req.model)
    req.log(f"sampler: {reason}; using the {SAMPLER_WORDS.get(kind, kind)} sampler")
    return SAMPLERS[kind](req)


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
        return fallback_sampler(req, f"vLLM not available ({_first_line(exc)})")
    try:
        sampler = VLLMSampler(req.model_dir, req.tokenizer, req.settings, req.version)
    except Exception as exc:  # noqa: BLE001 - any engine start failure means "fall back" under auto
        if not fallback:
            raise UserError(f"--sampler vllm: the vLLM engine failed to start: {_first_line(exc)}") from exc
        return fallback_sampler(req, f"vLLM failed to start ({_first_line(exc)})")
    req.log(f"sampler: {sampler.summary()}")
    return sampler


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
