"""Choose and build a sampler by name: `auto` (vLLM when it imports and starts, else transformers), `vllm`, `hf`.

Under `auto` a vLLM failure is one notice line and the HF fallback; under `vllm` it is an error.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from swarm_node.errors import UserError
from swarm_node.sampler.base import Sampler, SamplerSettings
from swarm_node.sampler.hf import HFSampler

SAMPLER_KINDS = ("auto", "vllm", "hf")


def make_sampler(kind: str, model_dir: Path, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase,
                 settings: SamplerSettings = SamplerSettings(), version: int = 0,
                 log: Callable[[str], None] = print) -> Sampler:
    if kind not in SAMPLER_KINDS:
        raise UserError(f"unknown sampler {kind!r}; choose one of {', '.join(SAMPLER_KINDS)}")
    if kind == "hf":
        return HFSampler(model, tokenizer, version)
    try:
        from swarm_node.sampler.vllm_sampler import VLLMSampler
    # A broken install fails at import with more than ImportError (e.g. torchvision's "operator
    # torchvision::nms does not exist" is a RuntimeError).
    except (ImportError, RuntimeError, OSError) as exc:
        if kind == "vllm":
            raise UserError(f"--sampler vllm: vLLM is not importable ({_first_line(exc)})") from exc
        log(f"sampler: vLLM not available ({_first_line(exc)}); using the transformers sampler")
        return HFSampler(model, tokenizer, version)
    try:
        sampler = VLLMSampler(model_dir, tokenizer, settings, version)
    except Exception as exc:  # noqa: BLE001 - any engine start failure means "fall back" under auto
        if kind == "vllm":
            raise UserError(f"--sampler vllm: the vLLM engine failed to start: {_first_line(exc)}") from exc
        log(f"sampler: vLLM failed to start ({_first_line(exc)}); using the transformers sampler")
        return HFSampler(model, tokenizer, version)
    log(f"sampler: {sampler.summary()}")
    return sampler


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
