"""Memory measurement: /proc parsing, the CPU peak meter, the default budget, the soak's growth figure, and the
node's sizing at start (a budget below the model is one line; the chosen sizes reach the config)."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from pathlib import Path

import pytest

from bench.memory import growth
from swarm_node.config import load_config
from swarm_node.model import device_memory
from swarm_node.model.device import Found
from swarm_node.model.device_memory import MIB, PeakMeter, default_budget_bytes, machine_memory_bytes, status_kib
from swarm_node.node.build import sampler_settings
from swarm_node.node.hardware import Hardware, footprint, longest_prompt
from swarm_node.train.sizing import SizingError

STATUS = "Name:\tpython\nVmPeak:\t  900 kB\nVmHWM:\t  512000 kB\nVmRSS:\t  256000 kB\nThreads:\t4\n"


def test_status_kib() -> None:
    assert (status_kib(STATUS, "VmHWM"), status_kib(STATUS, "VmRSS"), status_kib(STATUS, "VmSwap")) == (
        512000, 256000, None)
    assert status_kib(STATUS, "Threads") == 4


def test_cpu_meter_reads_the_high_water_mark_and_never_lowers_it(monkeypatch: pytest.MonkeyPatch,
                                                                  tmp_path: Path) -> None:
    status = tmp_path / "status"
    status.write_text(STATUS)
    monkeypatch.setattr(device_memory, "PROC_STATUS", status)
    meter = PeakMeter.for_device("cpu")
    assert (meter.peak(), meter.current()) == (512000 * 1024, 256000 * 1024)
    meter.reset()  # a no-op: the kernel's mark is what an outside measurement (ru_maxrss) reads too
    assert meter.peak() == 512000 * 1024


def test_real_cpu_meter_reports_at_least_what_was_touched() -> None:
    meter = PeakMeter.for_device("cpu")
    before = meter.current()
    block = bytearray(64 * MIB)  # zero-filled: every page touched
    assert meter.peak() >= before + 60 * MIB
    del block


def test_default_budget_is_a_fraction_of_ram() -> None:
    assert default_budget_bytes("cpu") == int(machine_memory_bytes() * 0.75)


def test_soak_growth_over_first_and_last_windows() -> None:
    start = [{"t": 0.0, "rss_mib": 100.0, "phase": "start"}]  # loading: not counted
    train = [{"t": 60.0 * i, "rss_mib": rss, "phase": "train"} for i, rss in
             enumerate([500, 510, 505, 520, 515, 530, 525, 540], start=1)]
    # 7 minutes of training (t 60..480): windows of 3.5 min; first: t <= 270 -> 500, 510, 505, 520 (median 507.5);
    # last: t >= 270 -> 515, 530, 525, 540 (median 527.5); 527.5 / 507.5 - 1 = 0.0394
    hours, frac = growth(start + train)
    assert (hours, frac) == (0.1167, 0.0394)
    assert growth(start) == (0.0, None)


def test_hardware_returns_the_chosen_sizes_and_records_them(tiny_model_dir: Path, tmp_path: Path) -> None:
    cfg = load_config(overrides={"model.path": str(tiny_model_dir), "sampler.kind": "hf", "run.memory_guard": False,
                                 "run.memory_budget_mib": 460, "run.prompts_per_step": 16, "run.group_size": 8})
    before = cfg.to_dict()
    lines: list[str] = []
    hw = Hardware.prepare(cfg, tiny_model_dir, cfg.task.build_source(size=64), lines.append, Found(),
                          run_dir=tmp_path)
    assert lines[0] == "device: auto picked cpu (no CUDA or MPS device found)"
    assert lines[1].startswith("memory: budget 460 MiB, one step ~")
    assert hw.sizing.estimate.total <= 460 * MIB and hw.sizing.reasons  # the runtime alone is 450 MiB
    assert hw.sizes == hw.sizing.sizes and hw.sizes.microbatch_tokens < 8192
    assert cfg.to_dict() == before  # sizing does not touch the config
    assert (cfg.train.microbatch_tokens, cfg.run.prompts_per_step) == (8192, 16)
    recorded = json.loads((tmp_path / "sizes.json").read_text())
    assert recorded["sizes"] == dataclasses.asdict(hw.sizes) and recorded["budget_mib"] == 460
    # The estimate part by part, for a benchmark to hold against the measured peak.
    assert recorded["estimate_mib"] == hw.sizing.estimate.mib_parts() and recorded["sampler_dtype"] == "float32"
    assert list(recorded["estimate_mib"]) == ["runtime", "weights", "optimizer", "reference", "sampler",
                                              "generation", "activations", "logits", "kv_cache", "total"]
    assert recorded["reasons"] == list(hw.sizing.reasons) and recorded["shrinks"] == []
    assert hw.meter is None and hw.after_step(1, None, None) == {}  # type: ignore[arg-type]


def test_footprint_of_the_tiny_model(tiny_model_dir: Path) -> None:
    fp = footprint(tiny_model_dir, lora_rank=0)
    assert (fp.layers, fp.hidden, fp.intermediate, fp.heads, fp.kv_heads, fp.head_dim) == (2, 64, 128, 4, 2, 16)
    # LoRA rank 2 on q, k, v, o (64->64, 64->32, 64->32, 64->64) and gate, up, down (64->128 x2, 128->64):
    # 2 * (128 + 96 + 96 + 128 + 192 + 192 + 192) = 2048 per layer, 2 layers.
    assert footprint(tiny_model_dir, lora_rank=2).trainable == 4096


def test_budget_below_the_model_is_one_line_before_anything_loads(tiny_model_dir: Path) -> None:
    cfg = load_config(overrides={"model.path": str(tiny_model_dir), "sampler.kind": "hf", "run.memory_guard": False,
                                 "run.memory_budget_mib": 100})
    with pytest.raises(SizingError, match=r"^memory budget 100 MiB is too small: this run needs at least \d+ MiB "
                                          r"\(runtime 450, .*\); raise --memory-budget or use a smaller model$"):
        Hardware.prepare(cfg, tiny_model_dir, cfg.task.build_source(size=64), print, Found())


def test_guard_shrinks_the_next_step_instead_of_dying(tiny_model_dir: Path) -> None:
    from swarm_node.model.default_model import load_model
    from swarm_node.sampler.hf import HFSampler
    from swarm_node.train.sizing import MemoryGuard
    from swarm_node.train.trainer import Trainer

    cfg = load_config(overrides={"model.path": str(tiny_model_dir), "sampler.kind": "hf", "run.memory_guard": False,
                                 "run.prompts_per_step": 4, "run.group_size": 4, "train.microbatch_tokens": 1024})
    lines: list[str] = []
    hw = Hardware.prepare(cfg, tiny_model_dir, cfg.task.build_source(size=64), lines.append, Found())
    assert hw.sizing.sizes.microbatch_tokens == 1024 and not hw.sizing.reasons  # the default budget: all fits
    model, tokenizer = load_model(tiny_model_dir)
    trainer = Trainer(model, cfg.train, cfg.sampler, pad_id=0)
    sampler = HFSampler(model, tokenizer)
    hw.attach(trainer, sampler)
    assert trainer.microbatch_tokens == 1024 and sampler.max_rows == 0
    peaks = iter([800, 950, 955, 990])  # MiB, against a 1000 MiB budget
    hw.meter = PeakMeter(lambda: next(peaks) * MIB, lambda: 0, lambda: None)
    hw.guard = MemoryGuard(1000 * MIB)
    fixed_threshold: list[int] = []  # glibc's mmap threshold, fixed on the guard's first trigger only
    hw.return_freed = lambda: fixed_threshold.append(1) is None
    seq = hw.floor.microbatch_tokens  # one full-length row: the micro-batch floor
    assert hw.after_step(1, trainer, sampler) == {"mem_peak_mib": 800.0}
    assert trainer.microbatch_tokens == 1024 and len(lines) == 2
    hw.after_step(2, trainer, sampler)  # 950 >= 90%: halve the micro-batches
    assert trainer.microbatch_tokens == hw.sizes.microbatch_tokens == max(512, seq)
    assert cfg.train.microbatch_tokens == 1024  # the config holds still
    assert lines[-1] == (f"memory: step 2 peaked at 950 MiB of a 1000 MiB budget; freed tensors now go back to the OS "
                         f"(slower steps, lower RSS); next steps: microbatch_tokens {max(512, seq)} (asked 1024; "
                         f"the same gradient in more passes)")
    hw.after_step(3, trainer, sampler)  # 955: not 1% above the last trigger
    assert len(lines) == 3
    hw.after_step(4, trainer, sampler)  # 990: a new high, shrink again
    assert trainer.microbatch_tokens == max(256, seq) and len(lines) == 4
    assert fixed_threshold == [1] and "freed tensors" not in lines[-1]
    assert hw.sizes.prompts_per_step == cfg.run.prompts_per_step == 4 and sampler.max_rows == 0


def test_a_bf16_checkpoint_with_vllm_gets_its_context_cache_and_dtype_from_the_step(tiny_model_dir: Path,
                                                                                     tmp_path: Path) -> None:
    """vLLM's context is the prompt budget + max_new_tokens (not the model's 256 positions), its KV cache one
    step's rows with 25% headroom, in bf16 on a CPU with avx512_bf16; the settings the sampler gets say so."""
    model_dir = tmp_path / "bf16-model"
    shutil.copytree(tiny_model_dir, model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps({**config, "dtype": "bfloat16"}))
    cfg = load_config(overrides={"model.path": str(model_dir), "sampler.kind": "vllm", "run.memory_guard": False,
                                 "run.prompts_per_step": 4, "run.group_size": 2, "sampler.max_new_tokens": 16})
    source = cfg.task.build_source(size=64)
    lines: list[str] = []
    hw = Hardware.prepare(cfg, model_dir, source, lines.append, Found(cpu_flags=frozenset({"avx512_bf16"})))
    assert lines[1] == "sampler dtype: bfloat16, the model's (cpu computes in it)" and hw.sampler_dtype == "bfloat16"
    context = math.ceil(longest_prompt(model_dir, source) * 1.25) + 16
    assert context < 256 and hw.sizes.max_model_len == context
    # K and V of 2 layers x 2 kv heads x 16 dims in bf16: 256 bytes per token; 8 rows at full length, x 1.25.
    assert hw.sizes.kv_cache_bytes == math.ceil(8 * context * 256 * 1.25)
    settings = sampler_settings(cfg.sampler, hw.sizes, hw.sampler_dtype)
    assert (settings.max_model_len, settings.kv_cache_gb * 2**30, settings.dtype) == (
        context, pytest.approx(hw.sizes.kv_cache_bytes), "bfloat16")
    fixed = cfg.with_values({"sampler.max_model_len": 200})  # the user's context wins
    assert Hardware.prepare(fixed, model_dir, source, print, Found()).sizes.max_model_len == 200
