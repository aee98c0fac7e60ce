"""End-to-end bounded fan-in: two `swarm-node join` processes on loopback with `[share] fanin = "bounded"`.

Node A starts a swarm, B joins through A's printed address. Their groups travel only as digests on the shard
topic and pulls (or pushes) over streams: each node must train on the other's groups, and its /status must show
the exchange's round counters (inbound messages and bytes, pulls sent and served).
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
ADDR = re.compile(r"join this node with: --bootstrap (/ip4/127\.0\.0\.1/tcp/\d+/p2p/\w+)")
PEER_ID = re.compile(r"peer id (\w+)")
STATUS = re.compile(r"status: (http://127\.0\.0\.1:\d+/)")
COUNTERS = ("inbound_messages", "inbound_bytes", "pulls_sent", "pulls_served")

pytestmark = pytest.mark.libp2p


def _join(run_dir: Path, model: Path, config: Path, steps: int, bootstrap: str | None) -> subprocess.Popen[str]:
    args = [sys.executable, "-m", "cli.main", "join", "--model", str(model), "--sampler", "hf", "--status-port", "0",
            "--config", str(config), "--run-dir", str(run_dir), "--steps", str(steps), "--eval-problems", "0",
            "--prompts-per-step", "4", "--group-size", "8", "--external-groups", "4", "--max-external-age", "8",
            "--listen", "/ip4/127.0.0.1/tcp/0"]
    if bootstrap:
        args += ["--bootstrap", bootstrap]
    log = open(run_dir.parent / f"{run_dir.name}.log", "w")  # a file, not a pipe: a full pipe would block the node
    return subprocess.Popen(args, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, text=True)


def _log(run_dir: Path) -> str:
    return (run_dir.parent / f"{run_dir.name}.log").read_text()


def _await_line(proc: subprocess.Popen[str], run_dir: Path, pattern: re.Pattern[str], deadline: float) -> str:
    while time.monotonic() < deadline:
        match = pattern.search(_log(run_dir))
        if match:
            return match.group(1)
        assert proc.poll() is None, f"join exited before printing {pattern.pattern}:\n" + _log(run_dir)
        time.sleep(0.2)
    raise AssertionError(f"no line matching {pattern.pattern}:\n" + _log(run_dir))


def _exchange(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url + "status", timeout=5) as response:
        return dict(json.loads(response.read())["exchange"])


def test_two_peers_share_through_digests_and_pulls(tmp_path: Path, warm_tiny_model_dir: Path) -> None:
    config = tmp_path / "bounded.toml"
    config.write_text('[share]\nfanin = "bounded"\n')
    procs: list[subprocess.Popen[str]] = []
    seen: dict[str, dict[str, int]] = {name: dict.fromkeys(COUNTERS, 0) for name in "ab"}
    drops: dict[str, set[str]] = {name: set() for name in "ab"}
    try:
        first = _join(tmp_path / "a", warm_tiny_model_dir, config, 100_000, None)
        procs.append(first)
        deadline = time.monotonic() + 90
        addr = _await_line(first, tmp_path / "a", ADDR, deadline)
        second = _join(tmp_path / "b", warm_tiny_model_dir, config, 30, addr)
        procs.append(second)
        urls = {"a": _await_line(first, tmp_path / "a", STATUS, deadline),
                "b": _await_line(second, tmp_path / "b", STATUS, deadline)}
        # Each finished round's counters, as /status shows them while B trains (the largest seen of each).
        while second.poll() is None:
            for name, url in urls.items():
                try:
                    shown = _exchange(url)
                except OSError:
                    continue  # B's server stops as it exits
                for key in COUNTERS:
                    seen[name][key] = max(seen[name][key], int(shown.get(key, 0)))
                drops[name].update(shown.get("by_reason", {}))
            time.sleep(0.5)
        assert second.wait(timeout=300) == 0, _log(tmp_path / "b")
        ids = {name: PEER_ID.search(_log(tmp_path / name)).group(1) for name in "ab"}  # type: ignore[union-attr]
        first.send_signal(signal.SIGINT)
        first.wait(timeout=180)
        assert first.returncode == 130, _log(tmp_path / "a")
    finally:
        for proc in procs:
            proc.kill()
    for name, other in (("a", "b"), ("b", "a")):
        metrics = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        assert sum(m.get("external_used", 0) for m in metrics) > 0, f"node {name} never trained on a peer's group"
        assert {s for m in metrics for s in m.get("external_sources", [])} == {ids[other]}, name
        assert all(seen[name][key] > 0 for key in COUNTERS), (name, seen)
    # A pull answers with whole groups (kilobytes): a round's bytes are more than its digest batches alone.
    assert all(seen[name]["inbound_bytes"] > 1000 for name in "ab"), seen
    assert drops == {"a": set(), "b": set()}  # two honest peers: nothing refused or scored
