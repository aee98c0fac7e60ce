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

Batching across policies: inside `with engine.gather(k) as leave:`, the `generate` calls of k threads (one call
each) are held until every one of them has called or left (`leave()`, which each thread calls when its work
is over, whether or not it generated), then run as one engine batch; each caller gets its own results, the same
tokens it would get alone (seeds are per prompt), or the batch's exception. Outside a gather, calls run alone.
`batches_policies` says whether that pays: on vLLM's CPU backend LoRA runs as reference torch ops that gather
each token's adapter weights, and one batch of 8 policies x 64 sequences took 1.13 s against 0.87 s as 8 calls
(0.28 s without adapters; vLLM 0.32, default model, 1 thread), so simulations batch policies on GPUs only.

Why: one vLLM engine per simulated node does not fit a small machine (each holds its weights, KV cache and
kernels); one engine holds the base once plus ~1-10% of its size per adapter.
"""

from __future__ import annotations

import dataclasses
import itertools
import shutil
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerBase
from vllm.platforms import current_platform

from swarm_node.model import lora
from swarm_node.sampler.base import Completion, Sampler, SamplerSettings, SamplingParams
from swarm_node.sampler.vllm_sampler import GenerateRequest, LoRARequest, LoRASlots, VLLMSampler


class SharedLoRAEngine:
    def __init__(self, model_dir: Path, tokenizer: PreTrainedTokenizerBase, settings: SamplerSettings,
                 policies: int, rank: int, alpha: float, adapter_dir: Path) -> None:
        if rank < 1:
            raise ValueError(f"a shared LoRA engine serves adapters of rank >= 1, got {rank}")
        self.rank, self.alpha, self.policies = rank, alpha, policies
        self.adapter_dir = Path(adapter_dir)
        self.engine = VLLMSampler(model_dir, tokenizer, settings, lora=LoRASlots(policies, rank))
        self._ids = itertools.count(1)  # adapter ids are never reused (see the module header)
        self._ids_lock = threading.Lock()
        self._names: set[str] = set()
        self._gather: _Gather | None = None
        self.batches_policies = not current_platform.is_cpu()  # see the module header

    @contextmanager
    def gather(self, participants: int) -> Iterator[Callable[[], None]]:
        """Batch the next generate call of each of `participants` threads; yields their `leave` (see header)."""
        if self._gather is not None:
            raise RuntimeError("a gather is already open on this engine")
        gather = _Gather(self.engine, participants)
        self._gather = gather
        try:
            yield gather.leave
        finally:
            self._gather = None

    def run(self, request: GenerateRequest) -> list[list[Completion]]:
        gather = self._gather
        if gather is None or not gather.joins():
            return self.engine.generate_many([request])[0]
        return gather.submit(request)

    def sampler(self, name: str) -> LoRAPolicySampler:
        if not name.isalnum() or name in self._names:
            raise ValueError(f"policy name {name!r} must be alphanumeric and unique")
        self._names.add(name)
        return LoRAPolicySampler(self, name)

    def next_id(self) -> int:
        with self._ids_lock:
            return next(self._ids)

    def summary(self) -> str:
        return f"shared {self.engine.summary()}, LoRA adapters of rank {self.rank} for {self.policies} policies"

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
        groups = self.shared.run(GenerateRequest(prompts, n, params, self.request))
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


class _Gather:
    """One engine batch from the next generate call of each participating thread (see the module header)."""

    def __init__(self, engine: VLLMSampler, participants: int) -> None:
        self.engine = engine
        self.outstanding = participants  # participants that may still submit
        self.pending: list[GenerateRequest] = []
        self.results: dict[int, list[list[Completion]] | Exception] = {}
        self.submitted: set[int] = set()  # thread ids
        self.cond = threading.Condition()

    def joins(self) -> bool:
        """Whether the calling thread's generate belongs to this batch (its first call, while it is open)."""
        with self.cond:
            return self.outstanding > 0 and threading.get_ident() not in self.submitted

    def submit(self, request: GenerateRequest) -> list[list[Completion]]:
        self.engine.check_request(request)  # a bad request fails its caller alone, not the whole batch
        with self.cond:
            self.submitted.add(threading.get_ident())
            slot = len(self.pending)
            self.pending.append(request)
            self.outstanding -= 1
            self._run_if_complete()
            while slot not in self.results:
                self.cond.wait()
            result = self.results[slot]
        if isinstance(result, BaseException):
            raise result
        return result

    def leave(self) -> None:
        with self.cond:
            if threading.get_ident() not in self.submitted:
                self.outstanding -= 1
                self._run_if_complete()

    def _run_if_complete(self) -> None:
        """Called holding the lock: when nobody else can still submit, run the batch and wake the callers."""
        if self.outstanding > 0 or not self.pending or self.results:
            return
        try:
            self.results = dict(enumerate(self.engine.generate_many(self.pending)))
        except Exception as exc:  # noqa: BLE001 - every caller of the batch gets the error
            self.results = dict.fromkeys(range(len(self.pending)), exc)
        self.cond.notify_all()
