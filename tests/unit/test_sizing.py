"""Memory sizing (train/sizing.py): the estimate part by part, the choices for given budgets, the minimum, the
run-time guard, and sizes as typed on the command line. Every number is worked out by hand in the comments."""

from __future__ import annotations

from dataclasses import replace

import pytest

from swarm_node.errors import UserError
from swarm_node.train.sizing import (
    GIB,
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
    fitting_knobs,
    floors,
    kv_floor,
    kv_need,
    max_model_len,
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
    # training: min(64 micro-batch tokens, 4 groups * 2 * 10 = 80) = 64 positions; logits 64 * 10 * 4 * 6 = 15360
    # * 1.15 = 17664; activations 2 layers * 64 * (10*8 + 4*16 + 2*10) * 4 = 83968 * 1.15 = 96563.2 -> 96564
    assert est == Estimate(runtime=0, weights=4600, optimizer=13800, reference=0, sampler=4600, generation=27821,
                           activations=96564, logits=17664)
    assert est.training == 114228 and est.total == FIXED + 114228  # sequential: the larger of the two
    overlapped = estimate(FP, StepRequest(**{**REQ.__dict__, "overlapped": True, "reference": True}),
                          requested(FP, REQ))
    assert overlapped.reference == 4600 and overlapped.total == FIXED + 4600 + 27821 + 114228


def test_autocast_keeps_activations_in_its_dtype_but_the_norm_inputs() -> None:
    est = estimate(FP, StepRequest(**{**REQ.__dict__, "autocast_bytes": 2}), requested(FP, REQ))
    # per position and layer: the two norms' fp32 inputs 2 * 8 * 4 = 64, the rest in bf16 (8*8 + 4*16 + 2*10) * 2
    # = 296: 2 layers * 64 positions * 360 = 46080 * 1.15 = 52992; logits and every other part unchanged
    assert est == Estimate(runtime=0, weights=4600, optimizer=13800, reference=0, sampler=4600, generation=27821,
                           activations=52992, logits=17664)


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
                              "weights 1, optimizer 1, sampler 1, generation 1, activations 1, logits 1 MiB); raise "
                              "--memory-budget or use a smaller model")
    assert isinstance(err.value, UserError)


# The same model and step with vLLM: its fp32 weights, runtime and a KV cache in blocks of 4 tokens; micro-batches
# of 40 tokens. One step's KV need: 8 rows x 10 tokens x 64 bytes = 5120; asked with headroom ceil(5120 * 1.25) =
# 6400; the floor is one sequence of the context (10 tokens) in whole blocks: 12 tokens x 64 = 768.
ENGINE = StepRequest(**{**REQ.__dict__, "row_limited": False, "engine_runtime_bytes": VLLM_RUNTIME_BYTES,
                        "kv_block_tokens": 4, "microbatch_tokens": 40})
# training at 40 positions: activations 2 * 40 * 164 * 4 = 52480 * 1.15 = 60352, logits 40 * 10 * 24 = 9600 * 1.15
# = 11040; at 20: 30176 + 5520; at one row (10): 15088 + 2760
TRAINING = {40: 60352 + 11040, 20: 30176 + 5520, 10: 15088 + 2760}


def engine_total(kv: int, microbatch: int) -> int:
    # sampler (4000 weights + runtime) * 1.15; the KV cache as allocated; generation (one decoding step's logits,
    # 8 rows * 10 * 4 * 6 = 1920 * 1.15 = 2208) is below training
    return 4600 + 13800 + -(-(4000 + VLLM_RUNTIME_BYTES) * 115 // 100) + kv + TRAINING[microbatch]


def test_vllm_kv_cache_is_one_steps_need_with_headroom() -> None:
    assert kv_need(FP, ENGINE, 4) == 5120 and kv_floor(FP, ENGINE) == 768
    assert requested(FP, ENGINE) == Sizes(4, 40, 0, 6400, 10)
    assert floors(FP, ENGINE) == Sizes(1, 10, 0, 768, 10)
    est = estimate(FP, ENGINE, requested(FP, ENGINE))
    assert (est.kv_cache, est.generation, est.training) == (6400, 2208, TRAINING[40])
    assert est.total == engine_total(6400, 40)
    # A fixed kv_cache_gb is taken as it is (at least the floor); a fixed context sets the floor: 64 tokens x 64.
    assert requested(FP, replace(ENGINE, kv_cache_bytes=10_000)).kv_cache_bytes == 10_000
    assert requested(FP, replace(ENGINE, kv_cache_bytes=100)).kv_cache_bytes == 768
    assert floors(FP, replace(ENGINE, context=64)) == Sizes(1, 10, 0, 4096, 64)


def test_the_kv_cache_headroom_goes_first_then_micro_batches_then_sequences() -> None:
    assert choose(FP, ENGINE, engine_total(6400, 40)).sizes == Sizes(4, 40, 0, 6400, 10)
    less = choose(FP, ENGINE, engine_total(6400, 40) - 1)  # the headroom goes: every row still decoded at once
    assert (less.sizes, less.reasons) == (Sizes(4, 40, 0, 5120, 10), (
        "vLLM KV cache 1 MiB (asked 1; less headroom, or fewer sequences decoded at once)",))
    # Then micro-batches; halving them freed 35,696 bytes, room for the headroom again (its 1,280 bytes).
    assert choose(FP, ENGINE, engine_total(5120, 40) - 1).sizes == Sizes(4, 20, 0, 6400, 10)
    assert choose(FP, ENGINE, engine_total(5120, 10) - 1).sizes == Sizes(4, 10, 0, 2560, 10)  # then sequences
    assert choose(FP, ENGINE, engine_total(1280, 10) - 1).sizes == Sizes(4, 10, 0, 768, 10)
    # At the floors only fewer prompts are left, which lower generation only (below training here): the minimum.
    with pytest.raises(SizingError):
        choose(FP, ENGINE, engine_total(768, 10) - 1)
    steps = [requested(FP, ENGINE)]
    while (lower := shrink(steps[-1], floors(FP, ENGINE), kv_need(FP, ENGINE, 4))) is not None:
        steps.append(lower)
    assert [(s.kv_cache_bytes, s.microbatch_tokens, s.prompts_per_step) for s in steps] == [
        (6400, 40, 4), (5120, 40, 4), (5120, 20, 4), (5120, 10, 4), (2560, 10, 4), (1280, 10, 4), (768, 10, 4),
        (768, 10, 3), (768, 10, 2), (768, 10, 1)]


def test_max_model_len_is_the_prompt_budget_plus_new_tokens() -> None:
    # Qwen2.5's 32,768 positions are only the cap: a 120-token prompt budget and 1,024 new tokens need 1,144.
    assert max_model_len(120, 1024, 32_768) == 1144
    assert max_model_len(120, 1024, 1000) == 1000  # at most the model's context
    assert max_model_len(120, 1024, 32_768, asked=4096) == 4096  # the user's --max-model-len wins


# Qwen2.5-0.5B: 494,032,768 parameters (tied embedding once), 24 layers, hidden 896, MLP 4864, 14 heads of 64, 2
# KV heads, a 151,936-token vocabulary; LoRA on q,k,v,o,gate,up,down: (1792 + 1024 + 1024 + 1792 + 3 * 5760) x 24
# = 549,888 parameters per unit of rank.
QWEN = Footprint(params=494_032_768, trainable=494_032_768, layers=24, hidden=896, intermediate=4864, heads=14,
                 kv_heads=2, head_dim=64, vocab=151_936, lora_per_rank=549_888, attention_scores=False)
# 16 prompts x G 8 of 76 prompt + 1,024 new tokens, vLLM in bf16 (KV blocks of 32), chunks of 256 positions (4
# copies of their logits: top_p 1), SDPA attention (no scores kept).
QWEN_STEP = StepRequest(prompts_per_step=16, group_size=8, seq_tokens=1100, max_new_tokens=1024,
                        microbatch_tokens=8192, row_limited=False, kv_block_tokens=32, sampler_dtype_bytes=2,
                        engine_runtime_bytes=VLLM_RUNTIME_BYTES, logprob_chunk=256, logit_copies=4)


def test_kv_cache_of_a_qwen_shaped_step() -> None:
    # K and V of 24 layers x 2 heads x 64 dims in bf16: 2 * 24 * 2 * 64 * 2 = 12,288 bytes per token;
    # 128 rows x 1,100 tokens x 12,288 = 1,730,150,400 bytes (1,650 MiB), asked x 1.25 = 2,162,688,000;
    # the floor: one sequence, 1,100 tokens in 35 blocks of 32 = 1,120 x 12,288 = 13,762,560.
    assert QWEN.kv_bytes_per_token(2) == 12_288
    assert kv_need(QWEN, QWEN_STEP, 16) == 1_730_150_400
    assert requested(QWEN, QWEN_STEP).kv_cache_bytes == 2_162_688_000
    assert kv_floor(QWEN, QWEN_STEP) == 13_762_560
    # The logits the trainer holds: 256 positions x 151,936 x 4 bytes x 4 copies = 622,329,856 * 1.15 -> 683 MiB,
    # not those of a micro-batch of 8,192 positions (19 GiB).
    assert estimate(QWEN, QWEN_STEP, requested(QWEN, QWEN_STEP)).mib_parts()["logits"] == 683


def test_a_budget_too_small_names_the_knobs_that_fit_it() -> None:
    # Full fine-tuning at the floors (one prompt, one row per micro-batch, one sequence of KV cache), in MiB:
    # runtime 450; weights 494,032,768 * 4 * 1.15 -> 2168; Adam 494,032,768 * 12 * 1.15 -> 6502; the bf16 sampler
    # (988,065,536 + 300 MiB) * 1.15 -> 1429; generation 8 rows * 151,936 * 24 * 1.15 -> 32; activations of one
    # row 24 * 1100 * (10*896 + 4*4864) * 4 * 1.15 -> 3291; logits 683; the KV floor 14: 14,535 MiB.
    with pytest.raises(SizingError) as err:
        choose(QWEN, QWEN_STEP, 12 * GIB)
    assert str(err.value) == (
        "memory budget 12288 MiB is too small: this run needs at least 14535 MiB (runtime 450, weights 2168, "
        "optimizer 6502, sampler 1429, generation 32, activations 3291, logits 683, kv_cache 14 MiB); to fit, use "
        "--lora-rank 64 (-5.9 GiB) or --max-new-tokens 256, or raise --memory-budget")
    # A fixed context past the rows' need is a knob too: its floor is 32,768 x 12,288 = 384 MiB of KV cache, and the
    # floors' 8,520 MiB (LoRA rank 16) become 8,149 MiB with one sequence of 1,100 tokens.
    lora = replace(QWEN, trainable=16 * 549_888)
    fixed = replace(QWEN_STEP, context=32_768)
    assert fitting_knobs(lora, fixed, 8300 * MIB) == ["--max-model-len 1100", "--max-new-tokens 896"]
    # The HF sampler generates a group per pass at its floor (generation 2,988 MiB of 6,805): a smaller group fits.
    hf = replace(QWEN_STEP, row_limited=True, engine_runtime_bytes=0, max_new_tokens=256, seq_tokens=332)
    assert fitting_knobs(lora, hf, 6 * GIB) == ["--max-new-tokens 192", "--group-size 6"]


def test_qwen_shape_with_lora_16_fits_16_gib() -> None:
    # LoRA rank 16: Adam on 8,798,208 parameters. Micro-batches of 8,192 and 4,096 positions do not fit (activations
    # 4096 * 24 * 28,416 * 4 * 1.15 -> 12,256 MiB); at 2,048 (6,128 MiB) the step fits with room for the KV cache's
    # headroom, which the first notch had taken and gets back.
    chosen = choose(replace(QWEN, trainable=16 * 549_888), QWEN_STEP, 16 * GIB)
    assert chosen.sizes == Sizes(16, 2048, 0, 2_162_688_000, 1100)
    assert chosen.reasons == ("microbatch_tokens 2048 (asked 8192; the same gradient in more passes)",)
    assert chosen.estimate.mib_parts() == {
        "runtime": 450, "weights": 2168, "optimizer": 116, "reference": 0, "sampler": 1429, "generation": 512,
        "activations": 6128, "logits": 683, "kv_cache": 2063, "total": 13034}


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
