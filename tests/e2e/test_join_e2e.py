"""End-to-end: three `swarm-node join` processes on loopback train on each other's rollouts.

Node A starts a swarm, B and C join through A's printed address. Each node's metrics.jsonl must show external
groups from both other peers in its training batches (re-scored locally, never trusted).
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

ROOT = Path(__file__).resolve().parents[2]
ADDR = re.compile(r"join this node with: --bootstrap (/ip4/127\.0\.0\.1/tcp/\d+/p2p/\w+)")

pytestmark = pytest.mark.libp2p


def _join(run_dir: Path, model: Path, steps: int, bootstrap: str | None) -> subprocess.Popen[str]:
    args = [sys.executable, "-m", "cli.main", "join", "--model", str(model), "--sampler", "hf", "--status-port", "-1",
            "--run-dir", str(run_dir), "--steps", str(steps), "--eval-problems", "0", "--prompts-per-step", "4",
            "--group-size", "8", "--external-groups", "4", "--max-external-age", "8",
            "--listen", "/ip4/127.0.0.1/tcp/0"]
    if bootstrap:
        args += ["--bootstrap", bootstrap]
    return subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _peer_id(proc: subprocess.Popen[str], deadline: float) -> str:
    assert proc.stderr is not None
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        match = ADDR.search(line)
        if match:
            return match.group(1)
        assert line or proc.poll() is None, "join exited before printing its address"
    raise AssertionError("no address printed")


def test_three_peers_train_on_each_others_rollouts(tmp_path: Path, warm_tiny_model_dir: Path) -> None:
    model = warm_tiny_model_dir
    procs: list[subprocess.Popen[str]] = []
    try:
        # A runs until B and C are done, then gets Ctrl-C: a clean shutdown that keeps its metrics and checkpoint.
        first = _join(tmp_path / "a", model, 100_000, None)
        procs.append(first)
        addr = _peer_id(first, time.monotonic() + 90)
        procs += [_join(tmp_path / name, model, 40, addr) for name in ("b", "c")]
        for proc in procs[1:]:
            proc.wait(timeout=300)
            assert proc.returncode == 0, proc.stderr.read() if proc.stderr else ""
        first.send_signal(signal.SIGINT)
        first.wait(timeout=180)  # a checkpoint and the host shutdown; slow on a loaded 2-core machine
        assert first.returncode == 130
    finally:
        for proc in procs:
            proc.kill()
    sources: dict[str, set[str]] = {}
    for name in "abc":
        metrics = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        assert sum(m.get("external_used", 0) for m in metrics) > 0, f"node {name} never trained on a peer's group"
        sources[name] = {s for m in metrics for s in m.get("external_sources", [])}
    assert all(len(s) == 2 for s in sources.values()), sources  # each node used groups from both others
    assert len(set().union(*sources.values())) == 3  # and every node's groups were used by someone
    assert (tmp_path / "a" / "checkpoints").is_dir()  # Ctrl-C saved a checkpoint
