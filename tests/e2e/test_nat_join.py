"""End to end behind real NATs: `swarm-node join` nodes A and B, each behind its own cone NAT (network namespaces,
nft masquerade), given only a public bootstrap started with `--relay on`, say they are private, and train on each
other's rollout groups (metrics.jsonl)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.netns.topology import Topology, namespaces_unavailable

ROOT = Path(__file__).resolve().parents[2]
PEER_ID = re.compile(r"join this node with: --bootstrap /ip4/[\d.]+/tcp/\d+/p2p/(\w+)")
WHY_NOT = namespaces_unavailable()
pytestmark = [pytest.mark.libp2p, pytest.mark.slow,
              pytest.mark.skipif(WHY_NOT is not None, reason=f"network namespaces unavailable: {WHY_NOT}")]


def _join(topo: Topology, ns: str, run_dir: Path, model: Path, steps: int, *extra: str) -> subprocess.Popen[str]:
    run_dir.mkdir(parents=True)
    args = [sys.executable, "-m", "cli.main", "join", "--model", str(model), "--sampler", "hf", "--status-port", "-1",
            "--run-dir", str(run_dir), "--steps", str(steps), "--eval-problems", "0", "--prompts-per-step", "4",
            "--group-size", "8", "--external-groups", "4", "--max-external-age", "8",
            "--listen", "/ip4/0.0.0.0/tcp/4001", *extra]
    with (run_dir.parent / f"{run_dir.name}.log").open("w") as log:  # the child keeps its own descriptor
        return topo.popen(ns, *args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log, text=True)


def _peer_id(log: Path, deadline: float) -> str:
    while time.monotonic() < deadline:
        match = PEER_ID.search(log.read_text()) if log.exists() else None
        if match:
            return match.group(1)
        time.sleep(0.5)
    raise AssertionError(f"no address printed in {log}")


REACHABILITY_LINE = "reachability: private, behind NAT or firewall"


def _trained_on(run_dir: Path, peer: str) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [m for m in map(json.loads, lines) if peer in m.get("external_sources", [])]


def _dump_stacks(procs: dict[str, subprocess.Popen[str]], logs: Path) -> str:
    """Every thread's stack of each node and its network host (`kill -USR1`, cli/main.py), from their logs: what
    a failure shows when a node stops stepping or does not stop."""
    for proc in procs.values():
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGUSR1)  # the node and its host share the session Topology started
    time.sleep(2.0)
    return "\n".join(f"--- {name} ---\n{(logs / f'{name}.log').read_text()[-6000:]}" for name in procs)


def test_nodes_behind_nat_train_on_each_others_groups(tmp_path: Path, warm_tiny_model_dir: Path) -> None:
    """A and B behind cone NATs, given only the bootstrap: each says it is private and trains on the other's
    groups. The nodes run until both have happened (a busy machine slows AutoNAT's verdict, not its outcome)."""
    model = warm_tiny_model_dir
    with Topology(homes={"a": "cone", "b": "cone"}, public=1) as topo:
        started = time.time()
        boot = _join(topo, topo.pub(0), tmp_path / "boot", model, 100_000, "--relay", "on")
        boot_id = _peer_id(tmp_path / "boot.log", time.monotonic() + 120)
        bootstrap = f"/ip4/{topo.pub_ip(0)}/tcp/4001/p2p/{boot_id}"
        homes = {name: _join(topo, topo.home(name).host_ns, tmp_path / name, model, 100_000, "--bootstrap",
                             bootstrap) for name in ("a", "b")}
        ids = {name: _peer_id(tmp_path / f"{name}.log", time.monotonic() + 120) for name in homes}
        other = {"a": "b", "b": "a"}
        deadline = time.monotonic() + 480
        done: set[str] = set()
        while done != set(homes) and time.monotonic() < deadline:
            for me, proc in homes.items():
                assert proc.poll() is None, (tmp_path / f"{me}.log").read_text()[-3000:]  # no node may die
                if (REACHABILITY_LINE in (tmp_path / f"{me}.log").read_text()
                        and _trained_on(tmp_path / me, ids[other[me]])):
                    done.add(me)
            time.sleep(1.0)
        procs = {**homes, "boot": boot}
        stacks = "" if done == set(homes) else _dump_stacks(procs, tmp_path)
        for proc in procs.values():
            proc.send_signal(signal.SIGINT)
        for name, proc in procs.items():
            try:
                proc.wait(timeout=180)
            except subprocess.TimeoutExpired:
                raise AssertionError(f"{name} did not stop on SIGINT\n{_dump_stacks(procs, tmp_path)}") from None
        assert done == set(homes), f"only {sorted(done)} trained on their peer's groups\n{stacks}"
    for me in homes:
        used = _trained_on(tmp_path / me, ids[other[me]])
        assert used, f"{me} never trained on {other[me]}'s groups"
        assert REACHABILITY_LINE in (tmp_path / f"{me}.log").read_text()
        print(f"{me}: first step trained on {other[me]}'s groups {used[0]['time'] - started:.1f} s after the swarm "
              f"started (step {used[0]['step']})")
