"""The sampler interface every node uses, and the value types it returns.

Contract: `generate(prompts, n, params)` returns, for each prompt (a list of token ids), `n` completions with
their sampled token ids (ending with EOS when the model stopped), decoded text (without EOS), and the processed
log-prob of each sampled token (`rl.logprobs`: the distribution actually sampled from). `load_weights` installs
a new policy version; every completion reports the version that produced it. `weights` says which tensors
`load_weights` takes from a model trained with LoRA adapters: "full" (its whole state dict, adapters included),
"base" (the base model's names, adapters merged in: `lora.merged_state`), "adapter" (the adapters alone).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 8
    seed: int | None = None


@dataclass(frozen=True)
class Completion:
    token_ids: list[int]
    text: str
    logprobs: list[float]
    version: int


class PromptTooLongError(ValueError):
    """A prompt plus the requested new tokens does not fit the model's context."""


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

    def close(self) -> None:  # noqa: B027 - optional hook, most samplers hold nothing to release
        """Release engine resources."""


def check_prompt_lengths(prompts: list[list[int]], max_new_tokens: int, max_len: int) -> None:
    for i, prompt in enumerate(prompts):
        if len(prompt) + max_new_tokens > max_len:
            raise PromptTooLongError(
                f"prompt {i} has {len(prompt)} tokens; with {max_new_tokens} new tokens it exceeds the model's "
                f"context of {max_len}")
