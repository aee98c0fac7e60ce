"""Steps per minute of `solo` and of a two-node `join`: the code of 8ef0a4d (2026-11-24) against today's, on the same
model and task, and what each default changed since then costs.

Arms, each a fresh process (two for join) on one model directory (today's embedded default unless --model):
  then            8ef0a4d, extracted with `git archive` under --work-dir, `--task chain_sum` (its default task)
  now             this checkout, `--task chain_sum`
  now+mix         this checkout on today's default task mix (four specialties; 8ef0a4d had chain_sum alone)
  now-microbatch  this checkout with micro-batching off (`train.microbatch_tokens` beyond any batch: one pass per
                  minibatch, as 8ef0a4d trained)
  now-budgets     join only: the peer budgets off (`peers.rescore_share` beyond any need, `peers.max_messages_per_s`
                  0), as 8ef0a4d had none
Every round runs every arm once, in an order that rotates per round, so that a slow minute of the machine falls on
all arms alike; ratios are the medians of the per-round ratios (bench/paired.py), every round's rates are kept.

Steps/min comes from the run's own metrics.jsonl (the times of its step records), skipping the first --skip steps
(engine warm-up, the first checkpoint): process start-up is not a step. For join, node B (--steps) joins node A's
swarm; both rates are taken over the window in which both trained (B's steps after --skip), and the join rate is
their sum (the swarm's steps/min). Eval is off in every arm (it runs outside the steps anyway).

    python -m bench.step_rate [--rounds 3] [--steps 40] [--join-steps 30] [--skip 5] [--loaded]

Writes bench/results/step_rate.json: `ratio_now_over_then` {solo, join}, `factors` {name: ratio of the arm over
`now`}, per-round rates under `rounds`. It reports rates, so it refuses a loaded machine unless --loaded.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import provenance
from bench.load_guard import add_loaded_flag
from bench.paired import paired_ratio, round_order

THEN = "8ef0a4d"
REPO = Path(__file__).resolve().parents[1]
RESULT = REPO / "bench" / "results" / "step_rate.json"
ADDR = re.compile(r"join this node with: --bootstrap (/ip4/127\.0\.0\.1/tcp/\d+/p2p/\w+)")
HUGE = 1_000_000_000


@dataclass(frozen=True)
class Arm:
    name: str
    old_code: bool = False
    task: str | None = "chain_sum"  # None: the default mix
    toml: str = ""  # config overrides, as a TOML file's text
    roles: tuple[str, ...] = ("solo", "join")
    why: str = ""


ARMS = (
    Arm("then", old_code=True, why=f"the code of {THEN}"),
    Arm("now", why="this checkout"),
    Arm("now+mix", task=None, why="today's default task mix instead of chain_sum alone"),
    Arm("now-microbatch", toml=f"[train]\nmicrobatch_tokens = {HUGE}\n", roles=("solo",), why="micro-batching off"),
    Arm("now-budgets", toml=f"[peers]\nrescore_share = {HUGE}.0\nmax_messages_per_s = 0.0\n", roles=("join",),
        why="the peer budgets (re-scoring share, message rate) off"),
)
FACTORS = {"task_mix": "now+mix", "microbatch_limits": "now-microbatch", "validation_budgets": "now-budgets"}


def step_times(run_dir: Path) -> list[tuple[int, float]]:
    """(step, time) of each complete step record of the run's metrics.jsonl."""
    out = []
    path = run_dir / "metrics.jsonl"
    for line in path.read_text().splitlines() if path.exists() else []:
        record = json.loads(line)
        if "step" in record and "time" in record and not record.get("skipped"):
            out.append((int(record["step"]), float(record["time"])))
    return out


def rate_in(times: list[tuple[int, float]], start: float, end: float) -> float:
    """Steps/min over [start, end]: the steps completed in the window over its length (from the first to the last)."""
    inside = [t for _, t in times if start <= t <= end]
    if len(inside) < 2:
        raise RuntimeError(f"fewer than 2 steps in the timing window ({len(inside)}): raise --steps")
    return (len(inside) - 1) / (inside[-1] - inside[0]) * 60.0


def solo_rate(times: list[tuple[int, float]], skip: int) -> float:
    kept = times[skip:]
    if len(kept) < 2:
        raise RuntimeError(f"only {len(times)} steps recorded: raise --steps above --skip")
    return rate_in(kept, kept[0][1], kept[-1][1])


@dataclass
class Runner:
    model: Path
    work: Path
    old_dir: Path
    skip: int
    log: list[str] = field(default_factory=list)

    def _command(self, arm: Arm, role: str, run_dir: Path, steps: int, extra: list[str]) -> tuple[list[str], Path]:
        code = self.old_dir if arm.old_code else REPO
        args = [sys.executable, "-m", "cli.main", role, "--model", str(self.model), "--steps", str(steps),
                "--run-dir", str(run_dir), "--status-port", "-1", "--eval-problems", "0", *extra]
        if arm.task:
            args += ["--task", arm.task]
        if arm.toml:
            config = run_dir.parent / f"{run_dir.name}.toml"
            config.write_text(arm.toml)
            args += ["--config", str(config)]
        return args, code

    def _start(self, arm: Arm, role: str, run_dir: Path, steps: int, extra: list[str]) -> subprocess.Popen[str]:
        """The arm's process; its log goes to a file beside the run dir (a pipe nobody reads would block it)."""
        args, code = self._command(arm, role, run_dir, steps, extra)
        env = {**os.environ, "PYTHONPATH": str(code)}
        log = open(_log_path(run_dir), "w")  # noqa: SIM115 - the child holds it; closed with the process
        return subprocess.Popen(args, cwd=code, env=env, stdout=subprocess.DEVNULL, stderr=log, text=True,
                                start_new_session=True)

    def solo(self, arm: Arm, run_dir: Path, steps: int) -> float:
        proc = self._start(arm, "solo", run_dir, steps, [])
        if proc.wait(timeout=1800) != 0:
            raise RuntimeError(f"{arm.name} solo failed ({proc.returncode}): {_tail(run_dir)}")
        return solo_rate(step_times(run_dir), self.skip)

    def join(self, arm: Arm, run_dir: Path, steps: int) -> tuple[float, float]:
        first = self._start(arm, "join", run_dir / "a", HUGE, ["--listen", "/ip4/127.0.0.1/tcp/0"])
        second = None
        try:
            addr = _address(first, run_dir / "a", time.monotonic() + 300)
            second = self._start(arm, "join", run_dir / "b", steps, ["--listen", "/ip4/127.0.0.1/tcp/0",
                                                                      "--bootstrap", addr])
            if second.wait(timeout=1800) != 0:
                raise RuntimeError(f"{arm.name} join B failed ({second.returncode}): {_tail(run_dir / 'b')}")
        finally:
            for proc in (second, first):
                if proc is not None and proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGINT)
                    try:
                        proc.wait(timeout=120)
                    except subprocess.TimeoutExpired:
                        os.killpg(proc.pid, signal.SIGKILL)
                        proc.wait()
        b_times = step_times(run_dir / "b")[self.skip:]
        if len(b_times) < 2:
            raise RuntimeError(f"{arm.name} join: B recorded {len(b_times)} steps after the skip")
        start, end = b_times[0][1], b_times[-1][1]
        return rate_in(step_times(run_dir / "a"), start, end), rate_in(b_times, start, end)


def _log_path(run_dir: Path) -> Path:
    return run_dir.parent / f"{run_dir.name}.log"


def _tail(run_dir: Path) -> str:
    return _log_path(run_dir).read_text()[-2000:]


def _address(proc: subprocess.Popen[str], run_dir: Path, deadline: float) -> str:
    """The bootstrap address the node logs once its host is up."""
    while time.monotonic() < deadline:
        match = ADDR.search(_log_path(run_dir).read_text())
        if match:
            return match.group(1)
        if proc.poll() is not None:
            raise RuntimeError(f"the first join exited before printing its address: {_tail(run_dir)}")
        time.sleep(0.5)
    raise RuntimeError("the first join printed no address")


def extract_then(work: Path) -> Path:
    """8ef0a4d's tree under `work` (once), from this repository's history."""
    target = work / f"then-{THEN}"
    if (target / "cli" / "main.py").exists():
        return target
    target.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", THEN], check=True, capture_output=True).stdout
    with tempfile.TemporaryFile() as buf:
        buf.write(archive)
        buf.seek(0)
        with tarfile.open(fileobj=buf) as tar:
            tar.extractall(target, filter="data")
    return target


def default_model() -> Path:
    from swarm_node.model.default_model import ensure_default_model

    return ensure_default_model()


def summarise(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Paired ratios over rounds: now/then per role, and each factor's arm over `now`."""
    def ratio(role: str, ours: str, base: str) -> float | None:
        pairs = [(r[role][ours], r[role][base]) for r in rounds if ours in r[role] and base in r[role]]
        return paired_ratio([a for a, _ in pairs], [b for _, b in pairs]) if pairs else None

    factors: dict[str, dict[str, float | None]] = {}
    for name, arm in FACTORS.items():
        factors[name] = {role: ratio(role, arm, "now") for role in ("solo", "join")}
    return {"ratio_now_over_then": {role: ratio(role, "now", "then") for role in ("solo", "join")},
            "factors": {name: by_role["join"] if by_role["solo"] is None else by_role["solo"]
                        for name, by_role in factors.items()},
            "factors_by_role": factors}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40, help="solo steps per arm")
    parser.add_argument("--join-steps", type=int, default=30, help="node B's steps per join arm")
    parser.add_argument("--skip", type=int, default=5, help="first steps left out of the rate")
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--roles", nargs="+", default=["solo", "join"], choices=["solo", "join"])
    parser.add_argument("--work-dir", type=Path, default=Path(tempfile.gettempdir()) / "swarm-node-step-rate")
    parser.add_argument("--out", type=Path, default=RESULT)
    add_loaded_flag(parser)
    args = parser.parse_args()
    run = provenance.begin(timed=True, loaded=args.loaded)
    model = args.model or default_model()
    runner = Runner(model, args.work_dir, extract_then(args.work_dir), args.skip)
    rounds: list[dict[str, Any]] = []
    for r in range(args.rounds):
        record: dict[str, Any] = {"solo": {}, "join": {}, "join_nodes": {}}
        for role in args.roles:
            for arm in round_order([a for a in ARMS if role in a.roles], r):
                run_dir = args.work_dir / f"r{r}-{role}-{arm.name}"
                subprocess.run(["rm", "-rf", str(run_dir)], check=True)
                run_dir.mkdir(parents=True)
                if role == "solo":
                    record["solo"][arm.name] = round(runner.solo(arm, run_dir, args.steps), 2)
                else:
                    a, b = runner.join(arm, run_dir, args.join_steps)
                    record["join_nodes"][arm.name] = [round(a, 2), round(b, 2)]
                    record["join"][arm.name] = round(a + b, 2)
                print(f"round {r + 1}/{args.rounds} {role} {arm.name}: {record[role][arm.name]} steps/min",
                      file=sys.stderr, flush=True)
        rounds.append(record)
    summary = summarise(rounds)
    result = {**summary, "rounds": rounds,
              "arms": {a.name: {"why": a.why, "task": a.task or "default mix", "config": a.toml or None}
                       for a in ARMS},
              "setup": {"then": THEN, "model": str(model), "solo_steps": args.steps, "join_steps": args.join_steps,
                        "skip": args.skip, "roles": args.roles}}
    sources = [str(p.relative_to(REPO)) for d in ("swarm_node", "cli", "protocol") for p in (REPO / d).rglob("*.py")]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(provenance.stamp(result, run, args.rounds, child_sources=sources), indent=1) + "\n")
    then = summary["ratio_now_over_then"]
    print(f"step_rate: now/then solo {then['solo']}, join {then['join']}; factors "
          + ", ".join(f"{k} {v}" for k, v in summary["factors"].items()))


if __name__ == "__main__":
    main()
