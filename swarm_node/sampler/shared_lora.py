"""One vLLM engine serving many policies, each a LoRA adapter on one frozen base model (simulated swarms).

Contract: `SharedLoRAEngine(model_dir, tokenizer, settings, policies, rank, alpha, adapter_dir)` starts one
engine on the base weights with room for `policies` adapters of rank <= `rank`; `engine.sampler(name)` returns
the `Sampler` of one policy. Its `load_weights(tensors, version)` takes adapter tensors (`lora.adapter_tensors`:
`Sampler.weights == "adapter"`), writes them under `adapter_dir/<name>/v<version>` and serves them from the next
`generate` on under a fresh adapter id, then releases the previous adapter. A fresh id per version, not an
in-place reload: vLLM keys its prefix cache by adapter id, so an old version's KV blocks can never be reused.
Before its first load a policy samples from the base model, which is what a fresh adapter (B = 0) computes.
Completions report the version of the policy's adapter. `close()` on a policy's sampler releases its adapter;
the engine itself is closed by `SharedLoRAEngine.close()`.

Why: one vLLM engine per simulated node does not fit a small machine (each holds its weights, KV cache and
kernels); one engine holds the base once plus ~1-10% of its size per adapter.
"""

from __future__ import annotations

import dataclasses
import itertools
import shutil
import threading
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerBase

from swarm_node import lora
from swarm_node.sampler.base import Completion, Sampler, SamplingParams
from swarm_node.sampler.factory import SamplerSettings
from swarm_node.sampler.vllm_sampler import LoRARequest, LoRASlots, VLLMSampler


class SharedLoRAEngine:
    def __init__(self, model_dir: Path, tokenizer: PreTrainedTokenizerBase, settings: SamplerSettings,
                 policies: int, rank: int, alpha: float, adapter_dir: Path) -> None:
        if rank < 1:
            raise ValueError(f"a shared LoRA engine serves adapters of rank >= 1, got {rank}")
        self.rank, self.alpha = rank, alpha
        self.adapter_dir = Path(adapter_dir)
        self.engine = VLLMSampler(model_dir, tokenizer, settings, lora=LoRASlots(policies, rank))
        self._ids = itertools.count(1)  # adapter ids are never reused (see the module header)
        self._ids_lock = threading.Lock()
        self._names: set[str] = set()

    def sampler(self, name: str) -> LoRAPolicySampler:
        if not name.isalnum() or name in self._names:
            raise ValueError(f"policy name {name!r} must be alphanumeric and unique")
        self._names.add(name)
        return LoRAPolicySampler(self, name)

    def next_id(self) -> int:
        with self._ids_lock:
            return next(self._ids)

    def summary(self) -> str:
        return f"shared {self.engine.summary()}, LoRA rank {self.rank} x {len(self._names)} policies"

    def close(self) -> None:
        self.engine.close()


class LoRAPolicySampler(Sampler):
    """One policy of a `SharedLoRAEngine`."""

    weights = "adapter"

    def __init__(self, shared: SharedLoRAEngine, name: str) -> None:
        self.shared = shared
        self.name = name
        self.version = 0
        self.request: LoRARequest | None = None  # None: the base model

    def generate(self, prompts: list[list[int]], n: int, params: SamplingParams) -> list[list[Completion]]:
        groups = self.shared.engine.generate(prompts, n, params, lora_request=self.request)
        return [[dataclasses.replace(c, version=self.version) for c in group] for group in groups]

    def load_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        path = lora.write_adapter(self.shared.adapter_dir / self.name / f"v{version}", state_dict,
                                  self.shared.rank, self.shared.alpha)
        previous = self.request
        adapter_id = self.shared.next_id()
        request = LoRARequest(f"{self.name}-v{version}-{adapter_id}", adapter_id, str(path))
        # Load now, not lazily at the next generate: a bad adapter fails here, at the update that made it.
        self.shared.engine.add_lora(request)
        self.request, self.version = request, version
        if previous is not None:
            self.shared.engine.remove_lora(previous.lora_int_id)
            if previous.lora_path != request.lora_path:
                shutil.rmtree(previous.lora_path, ignore_errors=True)

    def close(self) -> None:
        if self.request is not None:
            self.shared.engine.remove_lora(self.request.lora_int_id)
            self.request = None
