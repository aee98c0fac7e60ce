"""End-to-end `swarm-node solo`: bad inputs are one line and exit 2; SIGKILL mid-run and resume loses nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from swarm_node.model import checkpoint

CLI = [sys.executable, "-m", "cli.main"]
ROOT = Path(__file__).resolve().parents[2]
SMALL = ["--sampler", "hf", "--status-port", "-1", "--prompts-per-step", "4", "--group-size", "4",
         "--eval-problems", "0"]


def run_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def error_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert len(lines) == 1, proc.stderr
    return lines[0]


@pytest.mark.parametrize(("args", "expected"), [
    (["--model", "/nonexistent/model"], "model path '/nonexistent/model' is not a directory"),
    (["--task", "no_such_task"], "unknown task 'no_such_task'"),
    (["--task", "chain_sum", "--task-option", "wrong_option=3"], "bad options for task 'chain_sum'"),
    (["--task-option", "max_digits=2"], "task.options needs task.name (the dataset the options are for)"),
    (["--sampler", "gpu"], "sampler.kind 'gpu' unknown; choose one of auto, vllm, native, hf"),
])
def test_bad_inputs_are_one_line(tmp_path: Path, args: list[str], expected: str) -> None:
    assert expected in error_line(run_cli("solo", *SMALL, "--run-dir", str(tmp_path / "r"), *args))


def test_an_eval_larger_than_a_test_split_is_one_line_before_training(tmp_path: Path, tiny_model_dir: Path) -> None:
    """One-digit chain_sum has 32 distinct test questions: an eval of 33 fails at the start, naming the entry."""
    line = error_line(run_cli("solo", *SMALL, "--model", str(tiny_model_dir), "--run-dir", str(tmp_path / "r"),
                              "--task", "chain_sum", "--eval-problems", "33"))
    assert line == ("error: task mix entry chain_sum {max_digits: 1, max_terms: 2, min_digits: 1, min_terms: 2}: its "
                    "test split has 32 distinct questions, fewer than the 33 the eval asks for; enlarge its options "
                    "or lower --eval-problems")
    assert not (tmp_path / "r" / "metrics.jsonl").exists()  # not a step was trained


def test_non_hf_model_dir_and_config_typo(tmp_path: Path) -> None:
    assert "has no config.json" in error_line(run_cli("solo", *SMALL, "--model", str(tmp_path)))
    cfg = tmp_path / "c.toml"
    cfg.write_text("[train]\nlearning_rate = 1e-3\n")
    assert "unknown key 'train.learning_rate' in c.toml" in error_line(run_cli("solo", "--config", str(cfg)))


def test_unwritable_run_dir(tmp_path: Path, tiny_model_dir: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    line = error_line(run_cli("solo", *SMALL, "--model", str(tiny_model_dir), "--run-dir", str(blocker / "sub")))
    assert "is not writable" in line


def _metric_steps(run_dir: Path) -> list[int]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    steps = []
    for line in path.read_text().splitlines():
        try:
            steps.append(json.loads(line)["step"])
        except json.JSONDecodeError:
            pass  # a line cut by the kill
    return steps


def test_sigkill_mid_training_then_resume(tmp_path: Path, warm_tiny_model_dir: Path) -> None:
    run_dir = tmp_path / "run"
    base = ["solo", *SMALL, "--model", str(warm_tiny_model_dir), "--run-dir", str(run_dir), "--checkpoint-every", "2",
            "--steps", "14"]
    for kill_after in (5, 9):  # kill twice, each time mid-training (and possibly mid-checkpoint)
        extra = ["--resume"] if kill_after != 5 else []
        proc = subprocess.Popen([*CLI, *base, *extra], cwd=ROOT, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 120
            while len(_metric_steps(run_dir)) < kill_after and time.monotonic() < deadline:
                assert proc.poll() is None, "solo exited before it was killed"
                time.sleep(0.05)
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
        assert len(_metric_steps(run_dir)) >= kill_after
        ckpt = checkpoint.latest_checkpoint(run_dir)
        assert ckpt is not None and ckpt.step >= 2
    resumed = run_cli(*base, "--resume", timeout=180)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resume: continuing from checkpoint step {ckpt.step}" in resumed.stderr
    assert _metric_steps(run_dir) == list(range(1, 15))  # the step count continues, no gap, no duplicate
    final = checkpoint.latest_checkpoint(run_dir)
    last = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    assert final is not None and final.step == 14
    assert final.state["policy_version"] == last["policy_version"]  # the version survived both kills
    names = sorted(p.name for p in (run_dir / checkpoint.CHECKPOINT_DIR).iterdir())
    assert names == ["step-00000010", "step-00000012", "step-00000014"]  # keep 3, nothing partial left


def test_solo_without_resume_refuses_existing_run(tmp_path: Path, tiny_model_dir: Path) -> None:
    run_dir = tmp_path / "run"
    args = ["solo", *SMALL, "--model", str(tiny_model_dir), "--run-dir", str(run_dir), "--steps", "2"]
    first = run_cli(*args)
    assert first.returncode == 0, first.stderr
    assert "done: 2 steps" in first.stderr
    assert "already has checkpoints: pass --resume" in error_line(run_cli(*args))
