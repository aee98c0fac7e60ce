"""End-to-end ECHO-2 on loopback: `join --role learner` and `join --role worker` processes.

The worker follows the learner's policy through the pipelined broadcast (deltas applied bit for bit, checked by
hash), generates rollouts tagged with the version it used; the learner trains only on rollouts within S.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ADDR = re.compile(r"join this node with: --bootstrap (/ip4/127\.0\.0\.1/tcp/\d+/p2p/(\w+))")

pytestmark = pytest.mark.libp2p


def _join(run_dir: Path, model: Path, steps: int, extra: list[str]) -> subprocess.Popen[str]:
    args = [sys.executable, "-m", "cli.main", "join", "--model", str(model), "--sampler", "hf", "--status-port", "-1",
            "--run-dir", str(run_dir), "--steps", str(steps), "--eval-problems", "0", "--prompts-per-step", "4",
            "--group-size", "8", "--max-staleness", "1", "--listen", "/ip4/127.0.0.1/tcp/0", *extra]
    return subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _address(proc: subprocess.Popen[str], deadline: float) -> tuple[str, str]:
    assert proc.stderr is not None
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        match = ADDR.search(line)
        if match:
            return match.group(1), match.group(2)
        assert line or proc.poll() is None, "join exited before printing its address"
    raise AssertionError("no address printed")


def test_worker_follows_learner_and_learner_trains_within_the_bound(tmp_path: Path,
                                                                    warm_tiny_model_dir: Path) -> None:
    procs: list[subprocess.Popen[str]] = []
    try:
        learner = _join(tmp_path / "learner", warm_tiny_model_dir, 5, ["--role", "learner"])
        procs.append(learner)
        addr, learner_id = _address(learner, time.monotonic() + 90)
        worker = _join(tmp_path / "worker", warm_tiny_model_dir, 100_000,
                       ["--role", "worker", "--learner", learner_id, "--bootstrap", addr])
        procs.append(worker)
        learner.wait(timeout=300)
        assert learner.returncode == 0, learner.stderr.read() if learner.stderr else ""
        worker.send_signal(signal.SIGINT)
        worker.wait(timeout=60)
    finally:
        for proc in procs:
            proc.kill()
    steps = [json.loads(x) for x in (tmp_path / "learner" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in steps] == [1, 2, 3, 4, 5]
    assert all(0 <= m["lag"] <= 1 for m in steps)
    assert [m["published_version"] for m in steps] == [1, 2, 3, 4, 5]
    batches = [json.loads(x) for x in (tmp_path / "worker" / "metrics.jsonl").read_text().splitlines()]
    versions = [b["policy_version"] for b in batches]
    assert versions == sorted(versions) and max(versions) >= 3  # it applied the learner's deltas as they came
