"""A node's hardware: its device, precision and memory sizing at start, and the memory guard after each step.

Contract (the config is read, never written: the sizes live here):
- `Hardware.prepare(cfg, model_dir, task_source, log, run_dir=None)`, before any weights load: resolves
  `run.device` (model/device.py: one line saying what it picked; a device that is not there is a UserError), the
  precision (`train.precision`), the budget (`run.memory_budget_mib`, else `device_memory.default_budget_bytes`),
  the sampler's dtype (`devices.sampler_dtype`: the checkpoint's bf16 where the device computes in it, one line
  saying which and why; `hw.sampler_dtype`), the model's footprint (built on the meta device: no weights read),
  what the sampler kind expects (sampler/kinds.py: the kind "auto" becomes, the context and KV cache the user
  fixed, whether it takes a rows limit) and one step's request (the prompt budget: the longest of 32 drawn prompts
  + 25%; the context: `sampler.max_model_len`, else the prompt budget + max_new_tokens, at most the model's), then
  `sizing.choose`. `hw.sizes` are the chosen sizes: prompts per step (the local groups: `share.local_groups` when
  set, else `run.prompts_per_step`), micro-batch tokens, HF rows per pass, the vLLM KV cache and context; one line
  says what was chosen and why. With `run_dir` they are recorded in RUN_DIR/sizes.json with the estimate part by
  part in MiB (`estimate_mib`: weights, optimizer, sampler, kv_cache, activations, logits, ..., total: what a
  benchmark compares with the measured peak), again at each guard change. A run that cannot fit is a
  `SizingError` line (the knobs that would fit it) before anything loads.
- `place(model)` moves the model to the device; `attach(trainer, sampler)` hands the sizes to the trainer
  (micro-batch tokens) and the sampler (`Sampler.limit_rows`), and starts the peak meter.
- `after_step(step, trainer, sampler)` (run.memory_guard on): the step's measured peak (`device_memory.PeakMeter`);
  when `sizing.MemoryGuard` says so, the next step is one `sizing.shrink` notch smaller (the vLLM KV cache, fixed
  once the engine runs, is left alone), said in one line. The first time, on a CPU, it also fixes glibc's mmap
  threshold (`device_memory.return_freed_memory`): RSS then follows the live memory (~12% lower on the default
  model) but every large tensor is a fresh mapping, which made the default model's training steps 70% slower
  (docs/MEASUREMENTS.md), so it is a measure for memory pressure, not a default.
  Returns {"mem_peak_mib": ...} for the step's metrics ({} when off).
With run.memory_guard off (a node sharing its process: simulations) the runtime is `sizing.RUNTIME_BYTES`, not
the process's measured memory, and nothing is watched.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from swarm_node import tasks
from swarm_node.config import NodeConfig
from swarm_node.model import device as devices
from swarm_node.model.default_model import load_tokenizer, model_config
from swarm_node.model.device_memory import PeakMeter, default_budget_bytes, return_freed_memory
from swarm_node.model.lora import TARGET_MODULES
from swarm_node.model.prompting import build_prompter
from swarm_node.node.build import with_model_defaults
from swarm_node.rl.logprobs import logprob_chunk
from swarm_node.sampler.base import Sampler
from swarm_node.sampler.kinds import DTYPE_BYTES, SamplerPlan, plan_for
from swarm_node.train import sizing
from swarm_node.train.trainer import Trainer

PROMPT_PROBES = 32  # problems drawn to measure prompt lengths
PROMPT_MARGIN = 1.25
SIZES_FILE = "sizes.json"  # in the run dir: the sizes chosen at start and at each guard change

LogFn = Callable[[str], None]


def footprint(model_dir: Path, lora_rank: int) -> sizing.Footprint:
    """The model's parameter counts and shapes, from a copy built on the meta device (no weights read). A path
    that is not a model is the UserError line model_config gives for it."""
    config = model_config(model_dir)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    params = sum(p.numel() for p in model.parameters())  # parameters() yields a tied pair once
    per_rank = sum(m.in_features + m.out_features for name, m in model.named_modules()
                   if isinstance(m, torch.nn.Linear) and name.rsplit(".", 1)[-1] in TARGET_MODULES)
    trainable = lora_rank * per_rank if lora_rank else params
    heads = int(config.num_attention_heads)
    hidden = int(config.hidden_size)
    return sizing.Footprint(params=params, trainable=trainable, layers=int(config.num_hidden_layers), hidden=hidden,
                            intermediate=int(getattr(config, "intermediate_size", 4 * hidden)), heads=heads,
                            kv_heads=int(getattr(config, "num_key_value_heads", None) or heads),
                            head_dim=int(getattr(config, "head_dim", None) or hidden // heads),
                            vocab=int(config.vocab_size), lora_per_rank=per_rank,
                            attention_scores=model.config._attn_implementation == "eager")


def checkpoint_dtype(model_dir: Path) -> str:
    """The dtype the checkpoint's config.json declares (`dtype`, formerly `torch_dtype`; float32 when absent). A
    directory that is not a model is the loader's one-line error (`model_config`), not a traceback."""
    model_config(model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    return str(config.get("dtype") or config.get("torch_dtype") or "float32").removeprefix("torch.")


def longest_prompt(model_dir: Path, source: tasks.TaskSource, prompt_format: str = "",
                   budget: int | None = None) -> int:
    """Tokens of the longest of PROMPT_PROBES drawn prompts in the node's prompt format (its own RNG; the source's
    turn is put back). A format that does not fit `budget` fails here, before any weights load."""
    prompter = build_prompter(prompt_format, load_tokenizer(model_dir), budget)
    turn = source.turn
    try:
        refs = source.draw(random.Random(0x5EED), PROMPT_PROBES, turn=0)
    finally:
        source.turn = turn
    return max(len(prompter.ids(tasks.instance(r))) for r in refs)


@dataclass
class Hardware:
    cfg: NodeConfig
    choice: devices.DeviceChoice
    autocast: torch.dtype | None
    sizing: sizing.Sizing
    floor: sizing.Sizes
    log: LogFn
    sampler_dtype: str = "float32"  # what the sampler runs in (devices.sampler_dtype)
    meter: PeakMeter | None = None
    guard: sizing.MemoryGuard | None = None
    at_floor_said: bool = field(default=False)
    returning_freed: bool = field(default=False)  # glibc's mmap threshold fixed (after the guard's first trigger)
    return_freed: Callable[[], bool] = field(default=return_freed_memory)  # tests pass a recorder
    run_dir: Path | None = None
    shrinks: list[dict[str, object]] = field(default_factory=list)  # the guard's changes, as recorded

    @classmethod
    def prepare(cls, cfg: NodeConfig, model_dir: Path, source: tasks.TaskSource, log: LogFn,
                found: devices.Found | None = None, run_dir: Path | None = None) -> Hardware:
        cfg = with_model_defaults(cfg, model_dir)  # sampling settings left unset: the model's own
        found = found or devices.Found.probe()
        choice = devices.resolve_device(cfg.run.device, found)
        log(choice.line)
        autocast = devices.PRECISIONS[cfg.train.precision](choice, found)
        if autocast is not None:
            log(devices.precision_line(autocast))
        budget = cfg.run.memory_budget_mib * sizing.MIB or default_budget_bytes(choice.device)
        meter = PeakMeter.for_device(choice.device) if cfg.run.memory_guard else None
        dtype = devices.sampler_dtype(checkpoint_dtype(model_dir), choice, found)
        if dtype.line is not None:
            log(dtype.line)
        fp = footprint(model_dir, cfg.train.lora_rank)
        req = replace(step_request(cfg, model_dir, source, choice, meter, DTYPE_BYTES[dtype.name]),
                      autocast_bytes=autocast.itemsize if autocast is not None else 0)
        chosen = sizing.choose(fp, req, budget)
        floor = replace(sizing.floors(fp, req), kv_cache_bytes=chosen.sizes.kv_cache_bytes)
        hw = cls(cfg, choice, autocast, chosen, floor, log, dtype.name, meter,
                 sizing.MemoryGuard(budget) if meter is not None else None, run_dir=run_dir)
        log(chosen.line())
        hw.record()
        return hw

    @property
    def sizes(self) -> sizing.Sizes:
        """The sizes the node runs with now (the guard may lower them between steps)."""
        return self.sizing.sizes

    def record(self) -> None:
        """RUN_DIR/sizes.json: the budget, the sizes chosen at start with their reasons, the guard's changes."""
        if self.run_dir is None:
            return
        data = {"budget_mib": sizing.mib(self.sizing.budget), "sizes": dataclasses.asdict(self.sizing.sizes),
                "reasons": list(self.sizing.reasons), "estimate_mib": self.sizing.estimate.mib_parts(),
                "sampler_dtype": self.sampler_dtype, "shrinks": self.shrinks}
        path = self.run_dir / SIZES_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1) + "\n")
        tmp.replace(path)

    def place(self, model: torch.nn.Module) -> torch.nn.Module:
        return devices.place(model, self.choice.device)

    def attach(self, trainer: Trainer, sampler: Sampler) -> None:
        """Hand the sizes to the trainer and the sampler; start watching the memory."""
        trainer.microbatch_tokens = self.sizes.microbatch_tokens
        sampler.limit_rows(self.sizes.gen_rows)
        if self.meter is not None:
            self.meter.reset()

    def after_step(self, step: int, trainer: Trainer, sampler: Sampler | None) -> dict[str, float]:
        if self.meter is None or self.guard is None:
            return {}
        peak = self.meter.peak()
        self.meter.reset()
        if self.guard.observe(peak):
            lower = sizing.shrink(self.sizing.sizes, self.floor)
            budget = sizing.mib(self.guard.budget)
            head = f"memory: step {step} peaked at {sizing.mib(peak)} MiB of a {budget} MiB budget"
            if not self.returning_freed and self.choice.kind == "cpu" and self.return_freed():
                self.returning_freed = True
                head += "; freed tensors now go back to the OS (slower steps, lower RSS)"
            if lower is None:
                if not self.at_floor_said:
                    self.log(f"{head}; every size is at its floor already")
                    self.at_floor_said = True
            else:
                said = sizing.changes(self.sizing.sizes, lower)
                self.sizing = replace(self.sizing, sizes=lower)
                trainer.microbatch_tokens = lower.microbatch_tokens
                if sampler is not None:
                    sampler.limit_rows(lower.gen_rows)
                self.shrinks.append({"step": step, "peak_mib": sizing.mib(peak), **dataclasses.asdict(lower)})
                self.record()
                self.log(f"{head}; next steps: {'; '.join(said)}")
        return {"mem_peak_mib": round(peak / sizing.MIB, 1)}


def step_request(cfg: NodeConfig, model_dir: Path, source: tasks.TaskSource, choice: devices.DeviceChoice,
                 meter: PeakMeter | None, sampler_dtype_bytes: int = sizing.FLOAT) -> sizing.StepRequest:
    config = json.loads((model_dir / "config.json").read_text())
    model_context = int(config.get("max_position_embeddings", 2048))
    plan: SamplerPlan = plan_for(cfg.sampler)
    longest = longest_prompt(model_dir, source, cfg.task.prompt_format, cfg.sampler.max_new_tokens)
    prompt = math.ceil(longest * PROMPT_MARGIN)
    context = sizing.max_model_len(prompt, cfg.sampler.max_new_tokens, model_context, plan.context)
    runtime = sizing.RUNTIME_BYTES
    if choice.kind != "cpu":
        runtime = 0  # the budget is the card's; the process's host memory is not in it
    elif meter is not None:
        runtime = meter.current()
    return sizing.StepRequest(
        prompts_per_step=cfg.share.local_groups or cfg.run.prompts_per_step, group_size=cfg.run.group_size,
        seq_tokens=min(context, prompt + cfg.sampler.max_new_tokens), max_new_tokens=cfg.sampler.max_new_tokens,
        microbatch_tokens=cfg.train.microbatch_tokens, minibatches=cfg.train.minibatches,
        external_groups=cfg.share.external_groups, reference=cfg.train.kl_coef > 0,
        overlapped=cfg.train.max_staleness > 0, runtime_bytes=runtime, row_limited=plan.row_limited,
        kv_cache_bytes=plan.kv_cache_bytes, context=plan.context, kv_block_tokens=plan.kv_block_tokens,
        sampler_dtype_bytes=sampler_dtype_bytes, engine_runtime_bytes=plan.engine_runtime_bytes,
        logprob_chunk=logprob_chunk(int(config["vocab_size"])),
        logit_copies=sizing.LOGIT_COPIES_TOP_P if cfg.sampler.temperature_top_p()[1] < 1 else sizing.LOGIT_COPIES_PLAIN)
