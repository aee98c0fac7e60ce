"""The sampler interface every node uses, and the value types it returns.

Contract: `generate(prompts, n, params)` returns, for each prompt (a list of token ids), `n` completions with
their sampled token ids (ending with EOS when the model stopped), decoded text (without EOS), and the processed
log-prob of each sampled token (`rl.logprobs`: the distribution actually sampled from). `load_weights` installs
a new policy version; every completion reports the version that produced it. `weights` says which tensors
`load_weights` takes from a model trained with LoRA adapters: "full" (its whole state dict, adapters included),
"base" (the base model's names, adapters merged in: `lora.merged_state`), "adapter" (the adapters alone).
`resume(prompts, partials, params)` continues unfinished completions (APRIL, train/partial.py) from their prompt
plus the tokens so far, re-prefilled under the weights loaded now, by at most `params.max_new_tokens` more tokens;
the result appends a span of the current version (`Completion.spans`). A sampler that cannot (another engine than
the one that started them, token ids the weights no longer have) raises `ResumeError`: the caller discards them.
`engine_id` names the engine a partial completion was started on (a restarted engine has another).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from swarm_node.types import Completion

__all__ = ["Completion", "PromptTooLongError", "ResumeError", "Sampler", "SamplerSettings", "SamplingParams",
           "check_prompt_lengths", "extend_completion"]


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 8
    seed: int | None = None


@dataclass(frozen=True)
class SamplerSettings:
    """vLLM engine settings; 0 means "derive from the model and the machine" (rules in `vllm_sampler`).

    threads: torch/OpenMP threads while sampling (0: all usable cores). max_model_len: context (0: the model's; a
    node passes the prompt budget + max_new_tokens). kv_cache_gb: KV cache size (0: what max_num_seqs full-length
    sequences need, capped at 1/4 of free memory; a node passes one step's need, train/memory_estimate.py).
    max_num_seqs: sequences decoded together (0: 256). dtype: the weights' (and the transformers sampler's);
    float32 gives exact parity with the trainer, a node passes the checkpoint's bf16 where the device computes in
    it (model/device.sampler_dtype).
    compile: torch.compile the model (~10 s more start-up, ~10% more tokens/s).
    """

    threads: int = 0
    max_model_len: int = 0
    kv_cache_gb: float = 0.0
    max_num_seqs: int = 0
    dtype: str = "float32"
    compile: bool = False


class PromptTooLongError(ValueError):
    """A prompt plus the requested new tokens does not fit the model's context."""


class ResumeError(RuntimeError):
    """Partial completions that this sampler cannot continue; they are discarded, never trained."""


def extend_completion(partial: Completion, token_ids: list[int], logprobs: list[float], version: int,
                      text: str) -> Completion:
    """`partial` continued by `token_ids` (and their log-probs) sampled by `version`; `text` decodes the whole.
    A new span starts where the version changes; the same version extends the last span."""
    spans = partial.version_spans()
    if token_ids and spans[-1][1] != version:
        spans = (*spans, (len(partial.token_ids), version))
    single = len(spans) == 1
    return Completion(partial.token_ids + tuple(token_ids), text, partial.logprobs + tuple(logprobs),
                      version if token_ids else partial.version, () if single else spans)


class Sampler(ABC):
    """Generates completions with one policy version at a time."""

    version: int = 0
    weights: str = "full"  # "full" | "base" | "adapter": see the module header

    @abstractmethod
    def generate(self, prompts: list[list[int]], n: int, params: SamplingParams) -> list[list[Completion]]:
        """n completions for each prompt, in prompt order."""

    @abstractmethod
    def load_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        """Install new policy weights; later completions report `version`."""

    def resume(self, prompts: list[list[int]], partials: list[Completion],
               params: SamplingParams) -> list[Completion]:
        """Each partial completion continued from its prompt + tokens by at most params.max_new_tokens tokens: one
        row of prompt + tokens each (`generate` with n = 1: a fresh prefill under the weights loaded now)."""
        rows = [list(p) + list(c.token_ids) for p, c in zip(prompts, partials, strict=True)]
        try:
            pieces = self.generate(rows, 1, params)
        except (ValueError, IndexError) as exc:  # token ids the weights do not have, a context they do not fit
            raise ResumeError(f"cannot resume {len(rows)} partial completions: {exc}") from exc
        return [extend_completion(c, list(piece.token_ids), list(piece.logprobs), self.version,
                                  self.decode(c.token_ids + piece.token_ids))
                for c, (piece,) in zip(partials, pieces, strict=True)]

    def decode(self, token_ids: tuple[int, ...] | list[int]) -> str:
        """A completion's text: its ids decoded without EOS (a sampler that resumes defines it)."""
        raise ResumeError(f"{type(self).__name__} cannot resume partial completions")

    @property
    def engine_id(self) -> int:
        """The engine partial completions were started on: a restarted engine has another id."""
        return id(self)

    def close(self) -> None:  # noqa: B027 - optional hook, most samplers hold nothing to release
        """Release engine resources."""

    def limit_rows(self, rows: int) -> None:  # noqa: B027 - optional hook: only a sampler that takes the limit
        """At most `rows` rows per generation pass (0: no limit), as the node's memory sizing chose
        (sampler/kinds.py says which kinds take it); a sampler that sizes itself (an engine) ignores it."""


def check_prompt_lengths(prompts: list[list[int]], max_new_tokens: int, max_len: int) -> None:
    for i, prompt in enumerate(prompts):
        if len(prompt) + max_new_tokens > max_len:
            raise PromptTooLongError(
                f"prompt {i} has {len(prompt)} tokens; with {max_new_tokens} new tokens it exceeds the model's "
                f"context of {max_len}")
