"""Memory sizing (train/sizing.py): the estimate part by part, the choices for given budgets, the minimum, the
run-time guard, and sizes as typed on the command line. Every number is worked out by hand in the comments."""

from __future__ import annotations

import pytest

from swarm_node.errors import UserError
from swarm_node.train.sizing import (
    MIB,
    VLLM_RUNTIME_BYTES,
    Estimate,
    Footprint,
    MemoryGuard,
    Sizes,
    SizingError,
    StepRequest,
    choose,
    estimate,
    floors,
    parse_mib,
    requested,
    shrink,
)

# kv bytes per token (fp32): 2 (K, V) * 2 layers * 1 kv head * 4 head dim * 4 bytes = 64
FP = Footprint(params=1000, trainable=1000, layers=2, hidden=8, intermediate=16, heads=2, kv_heads=1, head_dim=4,
               vocab=10)
# 4 prompts x 2 completions = 8 rows of at most 10 tokens (6 prompt + 4 new)
REQ = StepRequest(prompts_per_step=4, group_size=2, seq_tokens=10, max_new_tokens=4, microbatch_tokens=64,
                  runtime_bytes=0)
FIXED = 4600 + 13800 + 4600  # weights ceil(4000 * 1.15), Adam ceil(12000 * 1.15), the HF sampler's copy 4600


def test_estimate_part_by_part() -> None:
    est = estimate(FP, REQ, requested(FP, REQ))
    # generation: KV 8 rows * 10 * 64 = 5120; scores 8 * 4 new * 10 vocab * 4 B * 2 = 2560;
    # prefill 8 * 6 * (4*8 + 2*16 + 2 heads*6 + 10) * 4 = 16512; (5120 + 2560 + 16512) * 1.15 = 27820.8 -> 27821
    # training: min(64 micro-batch tokens, 4 groups * 2 * 10 = 80) = 64 positions; logits 64 * 10 * 4 * 6 = 15360;
    # layers 2 * 64 * (10*8 + 4*16 + 2*10) * 4 = 83968; 99328 * 1.15 = 114227.2 -> 114228
    assert est == Estimate(runtime=0, weights=4600, optimizer=13800, reference=0, sampler=4600, generation=27821,
                           training=114228)
    assert est.total == FIXED + 114228  # sequential: the larger of generation and training
    overlapped = estimate(FP, StepRequest(**{**REQ.__dict__, "overlapped": True, "reference": True}),
                          requested(FP, REQ))
    assert overlapped.reference == 4600 and overlapped.total == FIXED + 4600 + 27821 + 114228


def test_lora_trains_few_parameters() -> None:
    fp = Footprint(**{**FP.__dict__, "trainable": 100})
    assert estimate(fp, REQ, requested(fp, REQ)).optimizer == 1380  # 100 * 12 * 1.15


@pytest.mark.parametrize(("budget", "sizes", "total", "reasons"), [
    # The request fits.
    (FIXED + 114228, Sizes(4, 64, 0, 0), FIXED + 114228, ()),
    # One byte less: micro-batches of 32 tokens: logits 7680 + layers 41984 = 49664 * 1.15 -> 57114.
    (FIXED + 114227, Sizes(4, 32, 0, 0), FIXED + 57114,
     ("microbatch_tokens 32 (asked 64; the same gradient in more passes)",)),
    # 16 tokens: (3840 + 20992) * 1.15 = 28556.8 -> 28557, above generation's 27821.
    (60_000, Sizes(4, 16, 0, 0), FIXED + 28557,
     ("microbatch_tokens 16 (asked 64; the same gradient in more passes)",)),
    # At one row (10 tokens) training is 17848 and generation (27821) dominates: 50821 > 50000, so generation
    # in passes of 4 rows: (2560 + 1280 + 8256) * 1.15 = 13910.4 -> 13911; training 17848 is the peak.
    (50_000, Sizes(4, 10, 4, 0), FIXED + 17848,
     ("microbatch_tokens 10 (asked 64; the same gradient in more passes)",
      "generation in passes of 4 rows (asked one pass; other random draws)")),
])
def test_choices_for_budgets(budget: int, sizes: Sizes, total: int, reasons: tuple[str, ...]) -> None:
    chosen = choose(FP, REQ, budget)
    assert (chosen.sizes, chosen.estimate.total, chosen.reasons) == (sizes, total, reasons)


def test_budget_below_the_floors_is_one_line_with_the_minimum() -> None:
    req = StepRequest(**{**REQ.__dict__, "runtime_bytes": 100 * MIB})
    # At every floor: 100 MiB + 23000 + max(training 17848, generation of 2 rows 6956) bytes -> 101 MiB.
    with pytest.raises(SizingError) as err:
        choose(FP, req, 50 * MIB)
    assert str(err.value) == ("memory budget 50 MiB is too small: this run needs at least 101 MiB (runtime 100, "
                              "weights 1, optimizer 1, sampler 1, generation 1, training 1 MiB); raise "
                              "--memory-budget or use a smaller model")
    assert isinstance(err.value, UserError)


def test_vllm_kv_cache_is_halved_down_to_one_sequence() -> None:
    req = StepRequest(**{**REQ.__dict__, "row_limited": False, "engine_runtime_bytes": VLLM_RUNTIME_BYTES,
                         "kv_cache_bytes": 10_000, "kv_floor_bytes": 2560, "microbatch_tokens": 10})
    assert requested(FP, req) == Sizes(4, 10, 0, 10_000)
    assert floors(req) == Sizes(1, 10, 0, 2560)
    # sampler: (4000 weights + KV + 700 MiB runtime) * 1.15; training at one row 17848; no HF generation.
    def total(kv: int) -> int:
        return 4600 + 13800 + -(-(4000 + kv + VLLM_RUNTIME_BYTES) * 115 // 100) + 17848

    assert choose(FP, req, total(10_000)).sizes.kv_cache_bytes == 10_000
    chosen = choose(FP, req, total(10_000) - 1)
    assert chosen.sizes == Sizes(4, 10, 0, 5000)
    assert chosen.reasons == ("vLLM KV cache 1 MiB (asked 1; fewer sequences decoded at once)",)
    assert choose(FP, req, total(5000) - 1).sizes == Sizes(4, 10, 0, 2560)
    # Below the KV floor only fewer prompts are left, which the estimate does not depend on here: the minimum.
    with pytest.raises(SizingError):
        choose(FP, req, total(2560) - 1)
    # When no KV cache is asked for, one step's rows: 8 rows * 10 tokens * 64 bytes = 5120.
    assert requested(FP, StepRequest(**{**req.__dict__, "kv_cache_bytes": 0})).kv_cache_bytes == 5120


def test_shrink_order_and_floor() -> None:
    floor = Sizes(1, 10, 2, 0)
    steps = [Sizes(4, 40, 0, 0)]
    while (lower := shrink(steps[-1], floor)) is not None:
        steps.append(lower)
    assert steps == [Sizes(4, 40, 0, 0), Sizes(4, 20, 0, 0), Sizes(4, 10, 0, 0), Sizes(4, 10, 4, 0),
                     Sizes(4, 10, 2, 0), Sizes(3, 10, 2, 0), Sizes(2, 10, 2, 0), Sizes(1, 10, 2, 0)]
    assert shrink(Sizes(16, 10, 2, 0), floor) == Sizes(12, 10, 2, 0)  # a quarter of the prompts at a time


def test_guard_shrinks_near_the_budget_and_only_on_a_new_high() -> None:
    guard = MemoryGuard(budget=1000)
    # 900 = 90% of the budget shrinks; then only a peak above the last trigger + 1% (10) does.
    assert [guard.observe(p) for p in (850, 899, 900, 905, 910, 911, 940, 921, 951)] == [
        False, False, True, False, False, True, True, False, True]


@pytest.mark.parametrize(("text", "value"), [("800", 800), ("800MiB", 800), ("6GiB", 6144), ("1.5g", 1536),
                                             ("2 GB", 2048), ("1TiB", 1 << 20), ("1.2", 2)])
def test_parse_mib(text: str, value: int) -> None:
    assert parse_mib(text) == value


@pytest.mark.parametrize(("text", "message"), [
    ("lots", "--memory-budget 'lots' is not a size (e.g. 6GiB, 800MiB, or a number of MiB)"),
    ("6PB", "--memory-budget '6PB' is not a size (e.g. 6GiB, 800MiB, or a number of MiB)"),
    ("0", "--memory-budget '0' must be at least 1 MiB"),
])
def test_parse_mib_rejects(text: str, message: str) -> None:
    with pytest.raises(UserError) as err:
        parse_mib(text)
    assert str(err.value) == message
