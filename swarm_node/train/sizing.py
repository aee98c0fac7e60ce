"""Memory-aware sizing of one training step: pick the largest step whose estimate fits a budget.

Contract (pure: no I/O, no torch; tests/unit/test_sizing.py checks hand-computed numbers; docs/SIZING.md says why):
- The estimate is train/memory_estimate.py (`Footprint`, `StepRequest`, `Sizes`, `Estimate`, `estimate`; the names
  are re-exported here). The sizes are the node's to hand to its trainer and sampler (node/hardware.py); the
  config is never changed.
- `choose(fp, req, budget)`: the requested sizes when they fit, else the first fit going down one notch at a time
  (`shrink`, in `SHRINK_ORDER`, the cheapest first): the vLLM KV cache's headroom (down to one step's need: every
  row still decoded at once), then micro-batch tokens halved down to one full-length row (the same gradient in
  more passes), then the vLLM KV cache halved down to one full-length sequence (fewer sequences decoded at once:
  slower generation), then HF rows per pass halved down to one group (other random draws), then prompts per step
  lowered by a quarter (at least 1) down to 1 (fewer groups per step); once it fits, the KV cache gets back its
  headroom (or one step's need) when what the later notches freed makes room. Returns a `Sizing` (sizes, estimate, one
  reason per change). When even the floors do not fit, `SizingError`: one line stating the minimum and the knobs
  that would fit it (`fitting_knobs`: LoRA rank, max_model_len, max_new_tokens, group size, each with the value
  that fits).
- `MemoryGuard.observe(peak)`: after a step, True when the next step should shrink: the peak reached `NEAR` of
  the budget and exceeds the peak that caused the previous shrink by more than `RISE` of the budget (a CPU peak is
  the process's high-water mark, which never comes down: only a new high says the smaller step is still too big).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from swarm_node.errors import UserError
from swarm_node.train.memory_estimate import (
    ADAM_BYTES,
    FLOAT,
    GIB,
    KV_HEADROOM,
    LOGIT_COPIES,
    LOGIT_COPIES_PLAIN,
    LOGIT_COPIES_TOP_P,
    MARGIN,
    MIB,
    RUNTIME_BYTES,
    VLLM_RUNTIME_BYTES,
    Estimate,
    Footprint,
    Sizes,
    StepRequest,
    estimate,
    floors,
    kv_floor,
    kv_need,
    max_model_len,
    mib,
    requested,
    training_parts,
)

__all__ = ["ADAM_BYTES", "FLOAT", "GIB", "KV_HEADROOM", "LOGIT_COPIES", "LOGIT_COPIES_PLAIN", "LOGIT_COPIES_TOP_P",
           "MARGIN", "MIB", "RUNTIME_BYTES", "VLLM_RUNTIME_BYTES", "Estimate", "Footprint", "MemoryGuard", "Sizes",
           "Sizing", "SizingError", "StepRequest", "choose", "estimate", "fitting", "fitting_knobs", "floors",
           "kv_floor", "kv_need", "max_model_len", "mib", "parse_mib", "requested", "shrink", "training_parts"]

NEAR = 0.9  # of the budget: a step peaking above this shrinks the next one
RISE = 0.01  # of the budget: how far a peak must pass the one that last shrank the step to shrink it again
LORA_RANKS = (64, 32, 16, 8, 4, 2, 1)  # the ranks a too-small budget may suggest, largest first


class SizingError(UserError):
    """The run cannot fit the memory budget at its smallest sizes (one line, with the minimum and what fits)."""


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


def _kv_headroom(sizes: Sizes, floor: Sizes, need: int) -> Sizes | None:
    lower = max(need, floor.kv_cache_bytes)
    return replace(sizes, kv_cache_bytes=lower) if need and sizes.kv_cache_bytes > lower else None


def _kv_sequences(sizes: Sizes, floor: Sizes, need: int) -> Sizes | None:
    if sizes.kv_cache_bytes <= floor.kv_cache_bytes:
        return None
    return replace(sizes, kv_cache_bytes=max(sizes.kv_cache_bytes // 2, floor.kv_cache_bytes))


def _microbatch(sizes: Sizes, floor: Sizes, need: int) -> Sizes | None:
    if sizes.microbatch_tokens <= floor.microbatch_tokens:
        return None
    return replace(sizes, microbatch_tokens=max(sizes.microbatch_tokens // 2, floor.microbatch_tokens))


def _gen_rows(sizes: Sizes, floor: Sizes, need: int) -> Sizes | None:
    if not floor.gen_rows:  # an engine: no rows limit
        return None
    rows = sizes.gen_rows or sizes.prompts_per_step * floor.gen_rows  # 0: every row of the step in one pass
    return replace(sizes, gen_rows=max(rows // 2, floor.gen_rows)) if rows > floor.gen_rows else None


def _prompts(sizes: Sizes, floor: Sizes, need: int) -> Sizes | None:
    if sizes.prompts_per_step <= floor.prompts_per_step:
        return None
    fewer = sizes.prompts_per_step - max(1, sizes.prompts_per_step // 4)
    return replace(sizes, prompts_per_step=max(fewer, floor.prompts_per_step))


# The notches, in the order they are taken: the one that costs the run least first (docs/SIZING.md).
SHRINK_ORDER: tuple[Callable[[Sizes, Sizes, int], Sizes | None], ...] = (
    _kv_headroom, _microbatch, _kv_sequences, _gen_rows, _prompts)


def shrink(sizes: Sizes, floor: Sizes, kv_step_need: int = 0) -> Sizes | None:
    """One notch down (see the module contract), or None when every size is at its floor. `kv_step_need`: one
    step's KV cache without headroom (0: none known, the cache is only halved)."""
    for notch in SHRINK_ORDER:
        lower = notch(sizes, floor, kv_step_need)
        if lower is not None:
            return lower
    return None


def fitting(fp: Footprint, req: StepRequest, budget: int) -> Sizing | None:
    """The largest sizes (in `shrink`'s order) whose estimate fits `budget` bytes, or None."""
    asked = requested(fp, req)
    floor = floors(fp, req)
    need = 0 if req.row_limited else kv_need(fp, req, req.prompts_per_step)
    sizes = asked
    est = estimate(fp, req, sizes)
    while est.total > budget:
        lower = shrink(sizes, floor, need)
        if lower is None:
            return None
        sizes = lower
        est = estimate(fp, req, sizes)
    # The KV cache went first; what later notches freed may give it back (its headroom, or one step's need).
    for kv in (asked.kv_cache_bytes, need):
        grown = replace(sizes, kv_cache_bytes=kv)
        if kv > sizes.kv_cache_bytes and estimate(fp, req, grown).total <= budget:
            sizes, est = grown, estimate(fp, req, grown)
            break
    return Sizing(sizes, est, budget, changes(asked, sizes))


def choose(fp: Footprint, req: StepRequest, budget: int) -> Sizing:
    """`fitting`, or SizingError: the minimum, and the knobs that would fit the budget."""
    chosen = fitting(fp, req, budget)
    if chosen is not None:
        return chosen
    least = estimate(fp, req, floors(fp, req))
    knobs = fitting_knobs(fp, req, budget)
    advice = (f"to fit, use {_either(knobs)}, or raise --memory-budget" if knobs
              else "raise --memory-budget or use a smaller model")
    raise SizingError(f"memory budget {mib(budget)} MiB is too small: this run needs at least {mib(least.total)} "
                      f"MiB ({least.parts()} MiB); {advice}")


def _either(options: list[str]) -> str:
    return options[0] if len(options) == 1 else f"{', '.join(options[:-1])} or {options[-1]}"


def _largest_fitting(values: range, fits: Callable[[int], bool]) -> int | None:
    """The largest of ascending `values` for which `fits` holds, given that it holds for all below one that does."""
    lo, hi, best = 0, len(values) - 1, None
    while lo <= hi:
        mid = (lo + hi) // 2
        if fits(values[mid]):
            best, lo = values[mid], mid + 1
        else:
            hi = mid - 1
    return best


def fitting_knobs(fp: Footprint, req: StepRequest, budget: int) -> list[str]:
    """Each setting that alone would make the run fit `budget`, as the flag to give with the mildest value that
    does: a LoRA rank (with the GiB it saves), a max_model_len down to the rows' need, fewer max_new_tokens
    (rounded down to a multiple of 64 from 64 up), a smaller group (at least 2)."""
    def fits(f: Footprint, r: StepRequest) -> bool:
        return fitting(f, r, budget) is not None

    knobs = []
    rank = (fp.trainable // fp.lora_per_rank if fp.lora_per_rank and fp.trainable < fp.params else None)
    if fp.lora_per_rank:
        for r in LORA_RANKS:
            lora = replace(fp, trainable=r * fp.lora_per_rank)
            if (rank is None or r < rank) and fits(lora, req):
                saved = estimate(fp, req, floors(fp, req)).total - estimate(lora, req, floors(lora, req)).total
                knobs.append(f"--lora-rank {r} (-{saved / GIB:.1f} GiB)")
                break
    if not req.row_limited and req.context > req.seq_tokens and fits(fp, replace(req, context=0)):
        knobs.append(f"--max-model-len {req.seq_tokens}")

    def new_tokens(n: int) -> StepRequest:
        return replace(req, max_new_tokens=n, seq_tokens=req.seq_tokens - req.max_new_tokens + n)

    n = _largest_fitting(range(1, req.max_new_tokens), lambda n: fits(fp, new_tokens(n)))
    if n is not None:
        knobs.append(f"--max-new-tokens {n - n % 64 if n >= 64 else n}")
    g = _largest_fitting(range(2, req.group_size), lambda g: fits(fp, replace(req, group_size=g)))
    if g is not None:
        knobs.append(f"--group-size {g}")
    return knobs

def changes(asked: Sizes, chosen: Sizes) -> tuple[str, ...]:
    """One line per size lowered, saying what it costs (in `SHRINK_ORDER`)."""
    out = []
    if chosen.kv_cache_bytes < asked.kv_cache_bytes:
        out.append(f"vLLM KV cache {mib(chosen.kv_cache_bytes)} MiB (asked {mib(asked.kv_cache_bytes)}; less "
                   "headroom, or fewer sequences decoded at once)")
    if chosen.microbatch_tokens < asked.microbatch_tokens:
        out.append(f"microbatch_tokens {chosen.microbatch_tokens} (asked {asked.microbatch_tokens}; the same "
                   "gradient in more passes)")
    if chosen.gen_rows and (not asked.gen_rows or chosen.gen_rows < asked.gen_rows):
        was = f"{asked.gen_rows} rows" if asked.gen_rows else "one pass"
        out.append(f"generation in passes of {chosen.gen_rows} rows (asked {was}; other random draws)")
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
