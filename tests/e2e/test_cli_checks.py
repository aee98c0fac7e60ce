"""`swarm-node solo` and `simulate` as subprocesses on the tiny model: `--device cuda` on a CPU machine, a too
small `--memory-budget` and a `--prompt-format` the budget cannot hold are one line and exit 2 before anything
trains; a task mix with held-out evaluation prints per-specialty accuracy before and after training and writes it
to metrics.jsonl."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def test_solo_device_cuda_without_cuda_is_one_line(tmp_path: Path, tiny_model_dir: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    proc = subprocess.run([sys.executable, "-m", "cli.main", "solo", "--device", "cuda", "--model",
                           str(tiny_model_dir), "--status-port", "-1", "--run-dir", str(tmp_path / "r"),
                           "--eval-problems", "0"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert errors == ["error: --device cuda: no CUDA device here; found CPU only (no CUDA, no MPS)"]


def test_simulate_device_flag_reaches_every_node(tmp_path: Path, tiny_model_dir: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    scenario = tmp_path / "s.toml"
    scenario.write_text(f'[simulation]\nnodes = 1\nrounds = 1\neval_problems = 0\n[config.sampler]\nkind = "hf"\n'
                        f'[[node]]\nindex = 0\nmodel = "{tiny_model_dir}"\n')
    proc = subprocess.run([sys.executable, "-m", "cli.main", "simulate", str(scenario), "--device", "cuda",
                           "--run-dir", str(tmp_path / "out")], cwd=ROOT, capture_output=True, text=True, timeout=300)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert errors == ["error: --device cuda: no CUDA device here; found CPU only (no CUDA, no MPS)"]


def test_solo_with_a_too_small_budget_is_one_line(tmp_path: Path, tiny_model_dir: Path) -> None:
    # On the CPU the budget holds the process's own memory too: 64 MiB cannot fit it (on a GPU the budget is the
    # card's, and this tiny model fits there: found by bench.gpu_check on an H100).
    proc = subprocess.run([sys.executable, "-m", "cli.main", "solo", "--memory-budget", "64MiB", "--device", "cpu",
                           "--model", str(tiny_model_dir), "--sampler", "hf", "--status-port", "-1", "--run-dir",
                           str(tmp_path / "r"), "--eval-problems", "0"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and len(errors) == 1, proc.stderr
    assert errors[0].startswith("error: memory budget 64 MiB is too small: this run needs at least ")
    assert not (tmp_path / "r" / "checkpoints").exists()


def test_solo_with_a_prompt_format_the_budget_cannot_hold_is_one_line(tmp_path: Path, tiny_model_dir: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "cli.main", "solo", "--prompt-format", "think-answer",
                           "--max-new-tokens", "8", "--model", str(tiny_model_dir), "--sampler", "hf",
                           "--status-port", "-1", "--run-dir", str(tmp_path / "r"), "--eval-problems", "0"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert errors == ["error: prompt format 'think-answer' needs a generation budget of at least 37 tokens (its "
                      "shortest well-formed completion, EOS included), got --max-new-tokens 8"]


def test_solo_prints_held_out_accuracy_before_and_after_per_specialty(tmp_path: Path, tiny_model_dir: Path) -> None:
    """End to end: a mix of two, eval at the start and the end, per-specialty numbers in the summary and metrics."""
    config = tmp_path / "mix.toml"
    config.write_text('[task]\nselection = "balanced"\n'
                      'mix = [{name = "chain_sum"}, {name = "basic_arithmetic", options = {min_terms = 2, '
                      'max_terms = 2, min_digits = 1, max_digits = 1}}]\n')
    run_dir = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "cli.main", "solo", "--config", str(config), "--model",
                           str(tiny_model_dir), "--sampler", "hf", "--status-port", "-1", "--steps", "2",
                           "--prompts-per-step", "2", "--group-size", "2", "--eval-problems", "4",
                           "--run-dir", str(run_dir)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    change = r"\S+ -> \S+ \([+-]\S+ \[[+-]\S+, [+-]\S+\]\)"  # before -> after (change [paired 95% interval])
    summary = re.search(rf"held-out greedy accuracy {change} \(before -> after training; change \[95% interval\]\) "
                        rf"on 4 problems \(chain_sum {change}, basic_arithmetic {change}\)", proc.stderr + proc.stdout)
    assert summary, proc.stderr
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [sorted(s["per_task"]) for s in steps] == [["basic_arithmetic", "chain_sum"]] * 2  # balanced: one each
    assert all(m["groups"] == 1 for s in steps for m in s["per_task"].values())
