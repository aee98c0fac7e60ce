"""Bring your own model: what a Qwen2.5-Instruct- or Llama-3-Instruct-shaped directory gets from the node (issue 29).

Parts (`--parts`; each is written to bench/results/byo_model.json as soon as it is done, and a run keeps the parts
it does not run, so a long measurement resumes part by part):
- one per shape of `model/shapes.SHAPES`, built at size `small-h32` (the embedded default model's dimensions, head
  size 32: vLLM's CPU attention has no kernel for the tiny size's 16; `tiny-h32` learnt the format but answered
  the RL task 0% greedy and its reward did not rise), random weights:
  1. the think-answer supervised warm-up (`model/warmup.py`, `WARMUP` on the RL task's training problems, another
     seed than the RL run's, in `TRACE_STYLE`, the node's own prompts); the warmed-up directory keeps the shape's
     generation_config.json (Qwen's repetition_penalty 1.1);
  2. `sampler_trainer_logprob_gap_max` {hf, vllm}: both samplers in fp32 as the node builds them
     (`make_sampler`), the largest |sampler log-prob - trainer log-prob| over every sampled token of `GAP_PROMPTS`
     prompts x `GAP_SAMPLES` completions, at T 1 / top-p 1 and at the shape's own T / top-p;
     `bf16_logprob_gap_max`: the same with vLLM in bf16 (the transformers sampler's in `details`);
  3. `well_formed_frac_after_sft`: completions sampled at T 1 on held-out problems of the RL task;
  4. the RL run (`RL`): solo through the one assembly on the correctness reward alone (reward mode exact, no
     terms); `reward_first_quarter` / `reward_last_quarter`: the mean of the per-step mean rewards over the first
     and last quarter of the steps; `reward_diff_se`: the standard error of their difference, the steps' means
     taken as independent samples (each step draws new problems).
- `sizing`: `swarm-node solo` in a subprocess on qwen2.5-instruct at size qwen2.5-0.5b (random weights saved in
  bf16, as the real checkpoint ships), LoRA rank 16, 1,024 new tokens, `SIZING` prompts x G, the default sampler;
  `estimate_mib`: RUN_DIR/sizes.json's, part by part; `measured_peak_mib`: the largest `mem_peak_mib` of its
  metrics (the process's VmHWM); `fits_16gib`: the estimate's total within 16 GiB.

    python -m bench.byo_model [--parts qwen2.5-instruct llama-3-instruct sizing] [--rl-steps 200]
                              [--sizing-steps 3] [--loaded]

Models and runs are kept under bench/.runs/byo_model (a warmed-up model is reused when its recipe matches).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from bench import provenance
from bench.load_guard import add_loaded_flag
from swarm_node import tasks
from swarm_node.config import SamplerConfig, TrainConfig, load_config
from swarm_node.errors import UserError
from swarm_node.model.default_model import load_model
from swarm_node.model.prompting import build_prompter
from swarm_node.model.shapes import SHAPES, SIZES, build_shaped_model, save_shaped_model_dir
from swarm_node.model.tokenizer import eos_ids
from swarm_node.model.warmup import WarmupSettings, supervised_warm_up, think_answer_draw
from swarm_node.node.assembly import assemble
from swarm_node.node.run_files import NodeEvents
from swarm_node.sampler.base import SamplerSettings, SamplingParams
from swarm_node.sampler.factory import make_sampler
from swarm_node.train.batching import collate
from swarm_node.train.trainer import Trainer
from swarm_node.types import TrainSample

RESULTS = Path(__file__).parent / "results" / "byo_model.json"
RUNS = Path(__file__).parent / ".runs" / "byo_model"
REPO = Path(__file__).resolve().parents[1]
SIZE = "small-h32"
# 1,200 steps: after 400 the model wrote the format around the wrong operands (greedy 0.14 on fresh draws of the RL
# task), after 1,200 it answered 0.61 (a lent H200, the shape's rope_theta 1e6; docs/DEFAULT_MODEL.md)
WARMUP = WarmupSettings(steps=1200, batch=32, lr=3e-3, seed=0)  # the default model's lr
WARMUP_SOURCE_SEED = 5  # the warm-up's problems: the RL task's training problems, another seed than the RL run's
# The default mix's gcd (Euclid's remainders; RL moved the embedded default model's gcd from 0.14 to 0.40 on test,
# docs/DEFAULT_MODEL.md). Before it, chain_sum with two terms of 1-2 digits: after the warm-up, the RL run's reward
# stayed flat (0.45 over steps 1-10, 0.45 over 91-100 at the node's defaults, 2026-11-27; 0.349 -> 0.292 at 8
# prompts and temperature 1.0); its 1-digit version (200 problems) was memorised by the warm-up (reward 0.92 at RL's
# first step).
RL_TASK = "gcd"
RL_TASK_OPTIONS = {"min_value": 1, "max_value": 1000}
TRACE_STYLE = "digit-columns"  # the default model's: per-operation traces of 2-digit sums were not learnt
# The node's defaults otherwise: lr 1e-4, 32 prompts x 8, the shape's own temperature and top-p (0.7 and 0.8, from its
# generation_config.json). At 8 prompts and temperature 1.0 the reward fell (0.349 -> 0.292, 2026-11-27); at lr 3e-4
# it fell from 0.92 to 0.3 in 40 steps, at 1e-3 to 0.
# the longest of 3,000 training traces: 141 tokens (p95 108) with the qwen shape's tokenizer
# The node's default sampler (vLLM where it runs): the transformers one took ~80 s a step here
RL = {"run.steps": 150, "sampler.max_new_tokens": 160}
RL_CHECKPOINT_EVERY = 10  # steps between the RL run's checkpoints (it resumes from the newest)
GAP_PROMPTS, GAP_SAMPLES = 8, 8
WELL_FORMED_PROBLEMS, WELL_FORMED_SAMPLES = 64, 4
SIZING = {"shape": "qwen2.5-instruct", "size": "qwen2.5-0.5b", "lora_rank": 16, "max_new_tokens": 1024,
          "prompts_per_step": 1, "group_size": 2, "steps": 3}
BUDGET_16GIB_MIB = 16 * 1024


def rl_source() -> tasks.TaskSource:
    return load_config(None, {"task.name": RL_TASK, "task.options": RL_TASK_OPTIONS}).task.build_source()


def warmed_up_dir(shape: str, root: Path) -> tuple[Path, dict[str, Any]]:
    """The shape's think-answer warm-up, saved as a whole model directory (reused when its recipe matches)."""
    path, recipe = root / "sft", {"size": asdict(SIZES[SIZE]), "warmup": asdict(WARMUP),
                                  "source_seed": WARMUP_SOURCE_SEED, "task": RL_TASK, "options": RL_TASK_OPTIONS,
                                  "trace_style": TRACE_STYLE}
    done = path / "bench_recipe.json"
    if done.exists() and json.loads(done.read_text())["recipe"] == recipe:
        return path, json.loads(done.read_text())
    shutil.rmtree(path, ignore_errors=True)
    model, tokenizer = build_shaped_model(shape, SIZE, seed=0)
    prompter = build_prompter("", tokenizer)
    source = load_config(None, {"task.name": RL_TASK, "task.options": RL_TASK_OPTIONS,
                                "task.seed": WARMUP_SOURCE_SEED}).task.build_source()
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    started = time.monotonic()
    def progress(done: int, total: int, what: str) -> None:
        if done % 100 == 0 or done == total:
            print(f"  {shape}: warm-up step {done}/{total}, {what} ({time.monotonic() - started:.0f} s)", flush=True)

    losses = supervised_warm_up(model, think_answer_draw(tokenizer, source, prompter.ids, TRACE_STYLE), WARMUP,
                                pad, progress)
    save_shaped_model_dir(shape, model, tokenizer, path)
    info = {"recipe": recipe, "first_loss": round(losses[0], 4), "last_loss": round(losses[-1], 4),
            "wall_s": round(time.monotonic() - started, 1), "prompt_format": prompter.name}
    done.write_text(json.dumps(info))
    return path, info


def logprob_gap(model_dir: Path, kind: str, dtype: str, settings: list[tuple[float, float]]) -> dict[str, Any]:
    """Per (T, top-p): the largest |sampler - trainer| log-prob over the sampled tokens; or why the sampler did not
    start. The trainer computes in fp32 as the node's does."""
    model, tok = load_model(model_dir)
    lines: list[str] = []
    try:
        sampler = make_sampler(kind, model_dir, model, tok, SamplerSettings(dtype=dtype), log=lines.append)
    except UserError as exc:
        return {"unavailable": str(exc)}
    prompter = build_prompter("", tok, RL["sampler.max_new_tokens"])
    prompts = [prompter.ids(tasks.instance(ref)) for ref in rl_source().eval_refs(GAP_PROMPTS)]
    gaps: dict[str, float] = {}
    tokens = 0
    try:
        for temperature, top_p in settings:
            out = sampler.generate(prompts, GAP_SAMPLES, SamplingParams(temperature, top_p,
                                                                        RL["sampler.max_new_tokens"], seed=1))
            trainer = Trainer(model, TrainConfig(), SamplerConfig(temperature=temperature, top_p=top_p),
                              tok.pad_token_id, vocab=len(tok))
            batch = collate([TrainSample(p, c.token_ids, c.logprobs, 0.0)
                             for p, group in zip(prompts, out, strict=True) for c in group], tok.pad_token_id)
            with torch.no_grad():
                logp, _ = trainer.token_log_probs(model, batch)
            mask = batch.mask.bool()
            gaps[f"T{temperature}/top_p{top_p}"] = (logp[mask] - batch.behaviour[mask]).abs().max().item()
            tokens += int(mask.sum())
    finally:
        sampler.close()
    finite = {name: gap if math.isfinite(gap) else "inf" for name, gap in gaps.items()}
    return {"max": max(gaps.values()) if all(map(math.isfinite, gaps.values())) else "inf", "by_setting": finite,
            "tokens": tokens, "sampler_lines": lines}


def well_formed_after_sft(model_dir: Path) -> dict[str, Any]:
    """Sampled (T 1) and greedy completions on held-out RL-task problems: the share that is well-formed."""
    model, tok = load_model(model_dir)
    sampler = make_sampler("hf", model_dir, model, tok, log=lambda line: None)
    budget = RL["sampler.max_new_tokens"]
    prompter = build_prompter("", tok, budget)
    ends = eos_ids(tok, getattr(model.generation_config, "eos_token_id", None))
    special = frozenset(tok.all_special_ids)
    insts = [tasks.instance(ref) for ref in rl_source().eval_refs(WELL_FORMED_PROBLEMS)]
    prompts = [prompter.ids(i) for i in insts]
    sampled = sampler.generate(prompts, WELL_FORMED_SAMPLES, SamplingParams(1.0, 1.0, budget, seed=2))
    greedy = sampler.generate(prompts, 1, SamplingParams(0.0, 1.0, budget))
    fmt = prompter.fmt

    def ok(c: Any) -> bool:
        return fmt.well_formed(c.token_ids, c.text, ends, special)

    flat = [c for group in sampled for c in group]
    return {"sampled": sum(map(ok, flat)) / len(flat), "greedy": sum(ok(g[0]) for g in greedy) / len(greedy),
            "greedy_accuracy": sum(ok(g[0]) and tasks.score(i, g[0].text, fmt) >= 1.0
                                   for i, g in zip(insts, greedy, strict=True)) / len(insts),
            "sampled_correct": sum(ok(c) and tasks.score(i, c.text, fmt) >= 1.0 for i, group in
                                   zip(insts, sampled, strict=True) for c in group) / len(flat),
            "problems": len(insts), "samples_per_problem": WELL_FORMED_SAMPLES, "max_new_tokens": budget}


def quarters(rewards: list[float]) -> dict[str, float]:
    """First and last quarter's mean of per-step rewards, and the standard error of their difference."""
    q = max(len(rewards) // 4, 2)
    first, last = rewards[:q], rewards[-q:]
    se = math.sqrt(statistics.variance(first) / q + statistics.variance(last) / q)
    return {"reward_first_quarter": statistics.fmean(first), "reward_last_quarter": statistics.fmean(last),
            "reward_diff_se": se}


def rl_run(model_dir: Path, run_dir: Path) -> dict[str, Any]:
    """The RL run; one cut short (a session's end) resumes from its newest checkpoint when its settings and its
    warmed-up model are the same (`bench_rl.json` in its run dir)."""
    steps = int(RL["run.steps"])
    settings = {**RL, "model.path": str(model_dir), "task.name": RL_TASK, "task.options": RL_TASK_OPTIONS,
                "run.eval_problems": 0, "run.checkpoint_every": RL_CHECKPOINT_EVERY, "run.run_dir": str(run_dir),
                "status.port": -1}
    identity = {"settings": settings, "model": json.loads((model_dir / "bench_recipe.json").read_text())["recipe"]}
    kept = run_dir / "bench_rl.json"
    resume = kept.exists() and json.loads(kept.read_text()) == identity
    if not resume:
        shutil.rmtree(run_dir, ignore_errors=True)
        run_dir.mkdir(parents=True)
        kept.write_text(json.dumps(identity))
    cfg = load_config(None, {**settings, "run.resume": resume})
    lines: list[str] = []

    def on_step(m: dict[str, Any]) -> None:
        if m["step"] % 25 == 0:
            print(f"  step {m['step']}/{steps} reward {m['reward_mean']:.3f}", flush=True)

    assembly = assemble(cfg, events=NodeEvents(log=lines.append, on_step=on_step))
    used = assembly.node.cfg  # with the model's own sampling settings filled in
    started = time.monotonic()
    try:
        assembly.run()
    finally:
        assembly.close()
    # every step's row once: a resumed run repeats the steps after its checkpoint, the later row wins
    logged = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    rows = [row for _, row in sorted({int(r["step"]): r for r in logged if "reward_mean" in r}.items())]
    rewards = [float(r["reward_mean"]) for r in rows]
    return {**quarters(rewards), "task": RL_TASK, "task_options": RL_TASK_OPTIONS,
            "settings": {**RL, "train.lr": used.train.lr, "run.prompts_per_step": used.run.prompts_per_step,
                         "run.group_size": used.run.group_size, "sampler.temperature": used.sampler.temperature,
                         "sampler.top_p": used.sampler.top_p, "sampler.kind": used.sampler.kind},
            "reward": "exact (correctness alone, no reward terms)", "rewards": rewards,
            "groups_used": [r["groups_used"] for r in rows], "wall_s": round(time.monotonic() - started, 1),
            "resumed": resume, "node_lines": lines}


def shape_part(shape: str) -> dict[str, Any]:
    root = RUNS / shape
    model_dir, warmup = warmed_up_dir(shape, root)
    print(f"  {shape}: warm-up loss {warmup['first_loss']} -> {warmup['last_loss']}", flush=True)
    gen = SHAPES[shape].generation_extra
    settings = [(1.0, 1.0), (float(gen.get("temperature", 1.0)), float(gen.get("top_p", 1.0)))]
    gaps = {kind: logprob_gap(model_dir, kind, "float32", settings) for kind in ("hf", "vllm")}
    bf16 = {kind: logprob_gap(model_dir, kind, "bfloat16", settings) for kind in ("vllm", "hf")}
    print(f"  {shape}: gaps {[g.get('max') for g in gaps.values()]}, bf16 {[g.get('max') for g in bf16.values()]}",
          flush=True)
    formed = well_formed_after_sft(model_dir)
    print(f"  {shape}: well-formed {formed['sampled']:.3f} sampled, {formed['greedy']:.3f} greedy", flush=True)
    rl = rl_run(model_dir, root / "rl")
    _, tok = load_model(model_dir)
    model_eos = json.loads((model_dir / "generation_config.json").read_text())["eos_token_id"]
    # At top-p < 1 a bf16 sampler can sample a token just outside the fp32 trainer's nucleus (log-prob -inf there):
    # the headline is T 1 / top-p 1, every setting is in details ("inf" where it happened).
    bf16_max = (bf16["vllm"] if "max" in bf16["vllm"] else bf16["hf"]).get("by_setting", {}).get("T1.0/top_p1.0")
    return {"prompt_format": warmup["prompt_format"], "eos_ids": list(eos_ids(tok, model_eos)),
            "sampler_trainer_logprob_gap_max": {kind: g.get("max") for kind, g in gaps.items()},
            "bf16_logprob_gap_max": bf16_max, "well_formed_frac_after_sft": formed["sampled"],
            "reward_first_quarter": rl["reward_first_quarter"], "reward_last_quarter": rl["reward_last_quarter"],
            "reward_diff_se": rl["reward_diff_se"],
            "details": {"size": SIZE, "dims": asdict(SIZES[SIZE]), "warmup": warmup, "gaps_fp32": gaps,
                        "gaps_bf16": bf16, "bf16_sampler": "vllm" if "max" in bf16["vllm"] else "hf",
                        "well_formed": formed, "rl": rl}}


def sizing_part() -> dict[str, Any]:
    root = RUNS / "sizing"
    model_dir, run_dir = root / "model", root / "run"
    if not (model_dir / "config.json").exists():
        model, tokenizer = build_shaped_model(SIZING["shape"], SIZING["size"], seed=0)
        save_shaped_model_dir(SIZING["shape"], model.to(torch.bfloat16), tokenizer, model_dir)
        del model
    shutil.rmtree(run_dir, ignore_errors=True)
    cmd = [sys.executable, "-m", "cli.main", "solo", "--model", str(model_dir), "--run-dir", str(run_dir),
           "--lora-rank", str(SIZING["lora_rank"]), "--max-new-tokens", str(SIZING["max_new_tokens"]),
           "--prompts-per-step", str(SIZING["prompts_per_step"]), "--group-size", str(SIZING["group_size"]),
           "--steps", str(SIZING["steps"]), "--eval-problems", "0", "--status-port", "-1"]
    started = time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"sizing run failed ({proc.returncode}): {proc.stderr[-3000:]}")
    sizes = json.loads((run_dir / "sizes.json").read_text())
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    peaks = [m["mem_peak_mib"] for m in metrics if "mem_peak_mib" in m]
    child = subprocess.run([sys.executable, "-m", "bench.byo_model", "--forced-training-child", str(model_dir),
                            str(root / "forced"), "--sizing-steps", str(SIZING["steps"])], cwd=REPO,
                           capture_output=True, text=True, check=False)
    if child.returncode != 0:
        raise SystemExit(f"forced training failed ({child.returncode}): {child.stderr[-3000:]}")
    forced = json.loads(child.stdout.strip().splitlines()[-1])
    estimate = sizes["estimate_mib"]
    measured = max(forced["peak_mib_per_step"])
    return {"shape": SIZING["size"], "estimate_mib": estimate, "measured_peak_mib": measured,
            "fits_16gib": estimate["total"] <= BUDGET_16GIB_MIB,
            "details": {"measured": "peak RSS (VmHWM) of the node the CLI builds, after training steps on full-length "
                                    "rows (forced_training); the CLI run itself never trains a random model "
                                    "(no group has signal): its peak is generation only (cli_run)",
                        "measured_over_estimate": round(measured / estimate["total"], 3), "run": SIZING,
                        "forced_training": forced, "cli_run": {"peak_mib_per_step": peaks,
                                                               "groups_used": [m.get("groups_used") for m in metrics]},
                        "sizes": sizes, "wall_s": round(time.monotonic() - started, 1),
                        "node_output": [line for line in proc.stderr.splitlines() if ":" in line][-12:]}}


def full_length_rows(node: Any, rng: Any, prompts: int, group_size: int, new_tokens: int) -> list[TrainSample]:
    """`prompts` x `group_size` training rows of `node`'s task: each prompt as the node builds it, then `new_tokens`
    random real ids, advantages +1 and -1 in turn. A random model's groups carry no signal, so a node never trains on
    its own: this is how a benchmark makes it train on rows of full length."""
    samples = []
    for ref in node.task_source.draw(rng, prompts):
        prompt = node.prompter.ids(tasks.instance(ref))
        for g in range(group_size):
            ids = [rng.randrange(len(node.tokenizer)) for _ in range(new_tokens)]
            samples.append(TrainSample(prompt, ids, [-5.0] * len(ids), 1.0 if g % 2 == 0 else -1.0))
    return samples


def forced_training_peak(model_dir: Path, run_dir: Path, steps: int) -> dict[str, Any]:
    """In a child process: the node the sizing run builds (the same settings, through the one assembly), then
    `steps` training steps on `full_length_rows`. Peak RSS (VmHWM) after each."""
    import random

    from swarm_node.model.device_memory import PeakMeter

    shutil.rmtree(run_dir, ignore_errors=True)
    cfg = load_config(None, {"model.path": str(model_dir), "run.run_dir": str(run_dir), "status.port": -1,
                             "train.lora_rank": SIZING["lora_rank"], "sampler.max_new_tokens": SIZING["max_new_tokens"],
                             "run.prompts_per_step": SIZING["prompts_per_step"],
                             "run.group_size": SIZING["group_size"], "run.eval_problems": 0})
    assembly = assemble(cfg, events=NodeEvents(log=lambda line: None))
    node, meter, rng = assembly.node, PeakMeter.for_device("cpu"), random.Random(0)
    peaks = []
    try:
        for _ in range(steps):
            samples = full_length_rows(node, rng, SIZING["prompts_per_step"], SIZING["group_size"],
                                       SIZING["max_new_tokens"])
            node.trainer.train_step(samples)
            peaks.append(round(meter.peak() / 2**20, 1))
    finally:
        assembly.close()
    return {"peak_mib_per_step": peaks, "rows": len(samples), "row_tokens": len(samples[0].prompt_ids)
            + SIZING["max_new_tokens"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", nargs="+", default=[*SHAPES, "sizing"], choices=[*SHAPES, "sizing"])
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--rl-steps", type=int, default=RL["run.steps"])
    parser.add_argument("--sizing-steps", type=int, default=SIZING["steps"])
    parser.add_argument("--forced-training-child", nargs=2, metavar=("MODEL_DIR", "RUN_DIR"), help=argparse.SUPPRESS)
    add_loaded_flag(parser)
    args = parser.parse_args(argv)
    if args.forced_training_child:
        print(json.dumps(forced_training_peak(*map(Path, args.forced_training_child), args.sizing_steps)))
        return 0
    RL["run.steps"], SIZING["steps"] = args.rl_steps, args.sizing_steps
    run = provenance.begin(timed=True, loaded=args.loaded)  # the sizing part's peak RSS depends on the load
    result: dict[str, Any] = json.loads(args.out.read_text()) if args.out.exists() else {}
    result.setdefault("shapes", {})
    for part in args.parts:
        print(f"byo_model: {part}", flush=True)
        started = time.monotonic()
        if part == "sizing":
            result["sizing"] = sizing_part()
        else:
            result["shapes"][part] = shape_part(part)
        # Parts are measured in different runs: each keeps its own commit (the file's provenance is the last run's).
        result.setdefault("measured", {})[part] = {"date": provenance.utc_now(), "commit": provenance.head_commit(),
                                                   "wall_s": round(time.monotonic() - started, 1)}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(provenance.stamp(result, run, runs=1), indent=1) + "\n")
    print("byo_model: " + "; ".join(
        [f"{name} {s['prompt_format']} gap hf {s['sampler_trainer_logprob_gap_max']['hf']:.1e} vllm "
         f"{s['sampler_trainer_logprob_gap_max']['vllm'] or float('nan'):.1e}, well-formed "
         f"{s['well_formed_frac_after_sft']:.2f}, reward {s['reward_first_quarter']:.3f} -> "
         f"{s['reward_last_quarter']:.3f} (se {s['reward_diff_se']:.3f})" for name, s in result["shapes"].items()]
        + ([f"sizing estimate {result['sizing']['estimate_mib']['total']} MiB, measured "
            f"{result['sizing']['measured_peak_mib']} MiB"] if "sizing" in result else [])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
