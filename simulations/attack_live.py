"""A real `swarm-node join` under attack: its memory, its training rate, how fast it graylists (bench/attack.py
part "live", tests/e2e/test_flood_e2e.py).

Contract:
- `LiveNode.start(run_dir, config, cpu, model, extra, env)`: one honest `join` process (a SAPO peer on 127.0.0.1 unless
  `extra` join arguments say otherwise, its status API on a free loopback port), pinned to CPU `cpu` with
  taskset when given, with `env` added to its environment; `.addr` is the address it printed, `.lines` the
  newest LOG_LINES_KEPT lines of its log.
  `.rss_mib()` is the resident memory of its whole process tree (the node and its libp2p host child), from /proc;
  `.status()` its status API's JSON; `.stop()` interrupts it (SIGINT), then kills what is left.
- `start_peers(addr, roles, ...)`: simulations/attack_peers.py against it, pinned to another CPU. They publish on
  the flooded rollout topic, so `node_tables` sets `[share] fanin = "flood"` unless the scenario names one.
- `run_fraction(...)`: the node and `nodes - 1` live peers, k of them attackers (`live_kinds`: with 10 nodes every
  kind runs at some fraction), measured for `seconds` from the node's first training step: max RSS, steps per
  minute, and per attacker identity the seconds from its joining to its state graylisted or banned in the node's
  status.
- `measure_live(scn, fractions, run_dir, seconds, repeats)`: every fraction (0.0 included, the clean run), `repeats`
  rounds of them; `summarise_live` (pure) turns the rounds into the bench's fields max_rss_mib (worst round),
  steps_per_min_vs_clean (median of the rounds' ratios), time_to_graylist_s (median per kind; null when never
  graylisted).
"""

from __future__ import annotations

import json
import os
import re
import selectors
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from collections import deque
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from simulations.attack_grid import attackers_for, key
from simulations.scenario import Scenario

ROOT = Path(__file__).resolve().parents[1]
ADDR = re.compile(r"join this node with: --bootstrap (/ip4/127\.0\.0\.1/tcp/\d+/p2p/\w+)")
BLOCKED = ("graylisted", "banned")
LOG_LINES_KEPT = 200
LIVE_ORDER = ("over_length", "sybil", "forged_reward", "oov_tokens", "junk", "stale", "replay")
LogFn = Callable[[str], None]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pinned(cpu: int | None) -> list[str]:
    return ["taskset", "-c", str(cpu)] if cpu is not None and shutil.which("taskset") else []


def toml_value(value: Any) -> str:
    """A TOML value: booleans, numbers, strings, lists and inline tables of them."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{json.dumps(str(k))} = {toml_value(v)}" for k, v in value.items()) + " }"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return json.dumps(value)


def write_config(path: Path, tables: Mapping[str, Mapping[str, Any]]) -> Path:
    """A node config TOML from {table: {key: value}} (booleans, numbers, strings, lists, inline tables)."""
    lines = []
    for table, values in tables.items():
        lines.append(f"[{table}]")
        for k, v in values.items():
            lines.append(f"{k} = {toml_value(v)}")
    path.write_text("\n".join(lines) + "\n")
    return path


def tree_pids(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                todo.extend(int(c) for c in (task / "children").read_text().split())
            except OSError:
                pass
    return out


def rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


class LiveNode:
    def __init__(self, proc: subprocess.Popen[str], addr: str, port: int, lines: list[str]) -> None:
        self.proc, self.addr, self.port = proc, addr, port
        self.lines: deque[str] = deque(lines, maxlen=LOG_LINES_KEPT)  # its log (stderr), the newest lines

    @classmethod
    def start(cls, run_dir: Path, config: Path, cpu: int | None = None, model: Path | None = None,
              timeout_s: float = 180.0, extra: list[str] | None = None,
              env: Mapping[str, str] | None = None) -> LiveNode:
        port = free_port()
        args = [*pinned(cpu), sys.executable, "-m", "cli.main", "join", "--config", str(config), "--run-dir",
                str(run_dir), "--listen", "/ip4/127.0.0.1/tcp/0", "--status-port", str(port), "--status-host",
                "127.0.0.1"]
        if model is not None:
            args += ["--model", str(model)]
        proc = subprocess.Popen(args + (extra or []), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True, start_new_session=True, env={**os.environ, **(env or {})})
        assert proc.stderr is not None
        sel = selectors.DefaultSelector()
        sel.register(proc.stderr, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout_s
        lines: list[str] = []
        while time.monotonic() < deadline:
            if sel.select(timeout=1.0):
                line = proc.stderr.readline()
                if not line and proc.poll() is not None:
                    break
                lines = (lines + [line])[-LOG_LINES_KEPT:]
                if match := ADDR.search(line):
                    node = cls(proc, match.group(1), port, lines)
                    node.drain_stderr()
                    return node
        proc.kill()
        raise RuntimeError(f"join printed no address in {timeout_s:.0f} s: {''.join(lines[-20:])[-2000:]}")

    def drain_stderr(self) -> None:
        """Keep reading the node's log so that a full pipe never blocks it (the newest lines are kept in `lines`)."""
        import threading

        def read() -> None:
            assert self.proc.stderr is not None
            for line in self.proc.stderr:
                self.lines.append(line)
        threading.Thread(target=read, daemon=True).start()

    def rss_mib(self) -> float:
        return sum(rss_kib(p) for p in tree_pids(self.proc.pid)) / 1024

    def status(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/status", timeout=5) as r:
            return dict(json.loads(r.read()))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()


class LivePeers:
    """simulations/attack_peers.py as a process; `.identities` maps peer id -> (role, wall time it joined)."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.identities: dict[str, tuple[str, float]] = {}
        self.events: list[dict[str, Any]] = []
        import threading

        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            self.events.append(event)
            if event.get("event") == "identity":
                self.identities[event["peer_id"]] = (event["role"], time.time())

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()


def start_peers(addr: str, roles: list[str], config: Path, seconds: float, cpu: int | None = None,
                model: Path | None = None, interval_s: float = 2.0, seed: int = 0) -> LivePeers:
    args = [*pinned(cpu), sys.executable, "-m", "simulations.attack_peers", "--target", addr, "--roles", *roles,
            "--config", str(config), "--seconds", str(seconds), "--interval-s", str(interval_s), "--seed", str(seed)]
    if model is not None:
        args += ["--model", str(model)]
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            start_new_session=True)
    return LivePeers(proc)


def node_tables(scn: Scenario) -> dict[str, dict[str, Any]]:
    """The scenario's node config as TOML tables for a live node (no eval, no checkpoints while measured)."""
    tables: dict[str, dict[str, Any]] = {k: dict(v) for k, v in scn.config.items()}
    for k, v in scn.variants[0].config.items():
        tables.setdefault(k, {}).update(v)
    tables.setdefault("run", {}).update({"steps": 100_000, "eval_problems": 0, "checkpoint_every": 100_000})
    # The live peers (attack_peers.py) publish on the flooded rollout topic: the node listens there too.
    tables.setdefault("share", {}).setdefault("fanin", "flood")
    return tables


def live_kinds(nodes: int, fractions: tuple[float, ...]) -> dict[float, list[str]]:
    """Each fraction's attacker kinds: LIVE_ORDER in turn, continuing from the previous fraction's, so that with 10
    nodes (1 + 3 + 5 attackers) every kind runs, the maximal-length one at 10% and again at 50%."""
    out, at = {}, 0
    for f in fractions:
        k = attackers_for(nodes, f)
        out[f] = [LIVE_ORDER[(at + j) % len(LIVE_ORDER)] for j in range(k)]
        at += k
    return out


def run_fraction(scn: Scenario, fraction: float, kinds: list[str], run_dir: Path, seconds: float,
                 log: LogFn) -> dict[str, Any]:
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    config = write_config(run_dir / "node.toml", node_tables(scn))
    roles = ["fair"] * (scn.nodes - 1 - len(kinds)) + kinds
    node = LiveNode.start(run_dir / "node", config, cpu=0)
    peers = start_peers(node.addr, roles, config, seconds + 600, cpu=1)
    try:
        deadline = time.monotonic() + 600
        while node.status().get("step", 0) < 1:
            if time.monotonic() > deadline or node.proc.poll() is not None:
                raise RuntimeError("the live node trained no step")
            time.sleep(0.5)
        start_step, started = node.status()["step"], time.monotonic()
        max_rss, blocked_at = 0.0, {}
        while (elapsed := time.monotonic() - started) < seconds:
            max_rss = max(max_rss, node.rss_mib())
            for p in node.status().get("peers", []):
                if p["state"] in BLOCKED and p["peer_id"] not in blocked_at:
                    blocked_at[p["peer_id"]] = time.time()
            time.sleep(0.5)
        steps = node.status()["step"] - start_step
    finally:
        peers.stop()
        node.stop()
    to_block: dict[str, list[float | None]] = {}
    for peer, (role, joined) in peers.identities.items():
        if role != "fair":
            at = blocked_at.get(peer)
            to_block.setdefault(role, []).append(round(at - joined, 2) if at is not None else None)
    honest_blocked = [p for p, (role, _) in peers.identities.items() if role == "fair" and p in blocked_at]
    out = {"max_rss_mib": round(max_rss, 1), "steps_per_min": steps / (elapsed / 60), "steps": steps,
           "roles": roles, "time_to_block_s": to_block, "honest_peers_blocked": len(honest_blocked)}
    log(f"live {key(fraction)}: {out}")
    return out


def measure_live(scn: Scenario, fractions: tuple[float, ...], run_dir: Path, seconds: float,
                 log: LogFn, repeats: int = 1) -> dict[str, Any]:
    """`repeats` rounds of every fraction in turn (0.0 first), so that each ratio pairs runs taken close together."""
    kinds = live_kinds(scn.nodes, fractions)
    runs = []
    for r in range(repeats):
        where = run_dir if repeats == 1 else run_dir / f"repeat{r}"
        runs.append({key(f): run_fraction(scn, f, kinds[f], where / f"f{key(f)}", seconds, log) for f in fractions})
    return summarise_live(runs)


def summarise_live(runs: list[dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """The live fields from repeated rounds (fraction -> run_fraction's result, "0.0" the clean run): max_rss_mib
    the worst over rounds; steps_per_min_vs_clean the median over rounds of each round's ratio to its own clean
    run; time_to_graylist_s the median over every attacker identity of every round."""
    fractions = list(runs[0])
    ratios: dict[str, list[float]] = {f: [] for f in fractions}
    for run in runs:
        clean = run[key(0.0)]["steps_per_min"]
        for f in fractions:
            if clean:
                ratios[f].append(run[f]["steps_per_min"] / clean)
    times: dict[str, list[float]] = {}
    never: set[str] = set()
    for run in runs:
        for r in run.values():
            for kind, values in r["time_to_block_s"].items():
                times.setdefault(kind, []).extend(v for v in values if v is not None)
                if any(v is None for v in values):
                    never.add(kind)
    return {"max_rss_mib": {f: max(run[f]["max_rss_mib"] for run in runs) for f in fractions},
            "steps_per_min_vs_clean": {f: statistics.median(v) if v else None for f, v in ratios.items()},
            "steps_per_min_vs_clean_per_repeat": ratios,
            "time_to_graylist_s": {k: statistics.median(v) if v else None for k, v in sorted(times.items())},
            "live_never_graylisted": sorted(never), "live_runs": runs}
