"""Steps per minute of `solo` and of a two-node `join` on loopback: the code of 2026-11-24 against today's, and
today's with one factor at a time set back to its old value (issue 27 item 6).

Contract:
- Arms (`ARMS`, registered by name): `old` runs the extracted old tree (`--old-root`, default /work/old-8ef0a4d:
  `git archive 8ef0a4d`) from its own root; `now` runs this checkout; every `now_*` arm is `now` with one factor
  reverted by a TOML (`--config`). All arms get the same model (`--model`, default the directory of the recipe
  `char-answer-line-v1`, built by this checkout: the default of 2026-11-26, the old default's dimensions and
  answer-line format, which both versions load and run at its 8-token budget; the old tree cannot run today's
  reasoning default as today's node does: it predates its prompts and gives it 8 tokens), the
  task `chain_sum` with its default options (the old default) unless the arm says otherwise, no held-out eval and
  no status server.
- Steps/min of a run come from its own `metrics.jsonl`: (records - 1) over the time between the first and the last
  step record, after skipping `--warmup` records; for `join`, both nodes (the bootstrap node `a` and the joiner
  `b`, which takes 4 external groups as in the README's two-peer example).
- Each round runs every arm once per mode, in an order rotated by the round, so no arm always runs first.
- Result: `bench/results/step_rate.json`: `ratio_now_over_then` {solo, join} = median of per-round now/old ratios
  (join: the two nodes' mean rate), `factors` {name: {solo?, join}} = median per-round ratio of the arm with that
  factor at its old value over the arm at today's value, and every per-round rate. One summary line.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import provenance
from bench.load_guard import add_loaded_flag
from bench.paired import paired_ratio, per_run_ratios

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
OLD_COMMIT = "8ef0a4d"
DEFAULT_OLD_ROOT = Path("/work/old-8ef0a4d")
TASK = "chain_sum"  # the old default task; both versions resolve its default options to one-digit sums of 2 terms
JOINER_EXTERNAL_GROUPS = 4  # the README's two-peer example
RUN_TIMEOUT_S = 600
CHILD_SOURCES_ENV = "STEP_RATE_SOURCES_FILE"
FIXED_MMAP_ENV = "STEP_RATE_FIXED_MMAP"
# the bootstrap node starts alone, before the joiner: these extra steps keep it training while the joiner does
BOOTSTRAP_EXTRA_STEPS = 15
MODEL_RECIPE = "char-answer-line-v1"  # the model both versions load (the default of 2026-11-26)


@dataclass(frozen=True)
class Arm:
    """One code version and configuration. `toml`: a config file's text (none: the version's defaults);
    `task`: the task flag (empty: the config's default mix); `modes`: where the arm is run."""

    old_code: bool = False
    toml: str = ""
    task: str = TASK
    modes: tuple[str, ...] = ("solo", "join")
    # the factor this arm sets back, and the arm (today's value) it is compared with
    factor: str = ""
    against: str = "now"
    fixed_mmap: bool = False  # glibc's mmap threshold fixed at 1 MiB in the node's process (`as_cli`)


ARMS: dict[str, Arm] = {}


def register(name: str, arm: Arm) -> None:
    ARMS[name] = arm


register("old", Arm(old_code=True))
register("now", Arm())
# task mix: today's default is the four-task mix; the old default was chain_sum alone (the `now` arm)
register("now_default_mix", Arm(task="", factor="task_mix", against="now_default_mix"))
# micro-batching: today a minibatch is split into micro-batches of train.microbatch_tokens padded tokens; the old
# trainer took a minibatch whole, which a limit above any minibatch reproduces
register("now_no_microbatch", Arm(toml="[train]\nmicrobatch_tokens = 1000000000\n", factor="microbatch"))
# validation budgets: [peers] rescore_share / burst_s bound re-scoring of peers' groups and max_messages_per_s their
# messages; the old code re-scored every group unbounded, which budgets far above any use reproduce
register("now_unbounded_budgets", Arm(
    toml="[peers]\nrescore_share = 1000.0\nburst_s = 1000000.0\nmax_messages_per_s = 0.0\n",
    modes=("join",), factor="validation_budgets"))
# glibc's mmap threshold: fixed at 1 MiB by every node with the memory guard on until 2026-11-26 (RSS follows the
# live memory); today only once the guard sees memory pressure (node/hardware.py): this arm fixes it from the start
register("now_fixed_mmap", Arm(fixed_mmap=True, factor="mmap_threshold"))
# prompts per step: today's run.prompts_per_step is 32 (abab91a: 16 lost count_bits to gradient noise in RL), the old
# default 16; a step of today's does twice the prompts, so steps/min alone would read as a slowdown
register("now_prompts16", Arm(toml="[run]\nprompts_per_step = 16\n", factor="prompts_per_step"))


@dataclass
class Runs:
    """Per-round steps/min: rates[mode][arm] = one value per round (join: the mean of both nodes), nodes[...]:
    join's per-node values."""

    rates: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    nodes: dict[str, dict[str, list[dict[str, float]]]] = field(default_factory=dict)
    seconds: dict[str, dict[str, list[float]]] = field(default_factory=dict)


def step_times(metrics: Path, warmup: int) -> list[float]:
    """The wall times of the run's step records after the first `warmup`."""
    times = [json.loads(line)["time"] for line in metrics.read_text().splitlines() if '"step"' in line][warmup:]
    if len(times) < 3:
        raise RuntimeError(f"{metrics}: only {len(times)} step records after {warmup} warm-up")
    return times


def steps_per_min(times: list[float], start: float = float("-inf"), end: float = float("inf")) -> float:
    """Steps per minute over the records in [start, end]: (records - 1) over the time between the first and last."""
    inside = [t for t in times if start <= t <= end]
    if len(inside) < 3:
        raise RuntimeError(f"only {len(inside)} step records in the window")
    return 60.0 * (len(inside) - 1) / (inside[-1] - inside[0])


class Launcher:
    """Starts CLI processes of either code version, each in its own process group, and ends them."""

    def __init__(self, old_root: Path, model: str, steps: int, sources_dir: Path) -> None:
        self.old_root, self.model, self.steps, self.sources_dir = old_root, model, steps, sources_dir
        self.live: list[subprocess.Popen[bytes]] = []
        self._n = 0

    def start(self, arm: Arm, command: str, run_dir: Path, *extra: str, more_steps: int = 0
              ) -> subprocess.Popen[bytes]:
        run_dir.mkdir(parents=True, exist_ok=True)
        args = [command, "--steps", str(self.steps + more_steps), "--model", self.model, "--run-dir", str(run_dir),
                "--eval-problems", "0", "--status-port", "-1", *extra]
        if arm.task:
            args += ["--task", arm.task]
        if arm.toml:
            (run_dir / "arm.toml").write_text(arm.toml)
            args += ["--config", str(run_dir / "arm.toml")]
        root = self.old_root if arm.old_code else REPO
        env = {**os.environ, "PYTHONPATH": str(root)}
        if arm.old_code:
            argv = [sys.executable, "-m", "cli.main", *args]
        else:  # through this module, which records the modules the run imported (provenance)
            self._n += 1
            env[CHILD_SOURCES_ENV] = str(self.sources_dir / f"{self._n}.json")
            if arm.fixed_mmap:
                env[FIXED_MMAP_ENV] = "1"
            argv = [sys.executable, "-m", "bench.step_rate", "--as-cli", *args]
        log = (run_dir / "out.log").open("wb")
        proc = subprocess.Popen(argv, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)  # own group: the libp2p host child ends with it
        self.live.append(proc)
        return proc

    def wait(self, *procs: subprocess.Popen[bytes]) -> None:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        for proc in procs:
            rc = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            if rc != 0:
                raise RuntimeError(f"{proc.args} exited {rc}")
            self.live.remove(proc)

    def kill_all(self) -> None:
        for proc in self.live:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.live.clear()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_listening(port: int, proc: subprocess.Popen[bytes], timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args} exited {proc.returncode} before listening")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise TimeoutError(f"nothing listening on {port} after {timeout_s}s")


def keygen(path: Path) -> str:
    """An identity both versions load (the key file format did not change); its peer id."""
    out = subprocess.run([sys.executable, "-m", "cli.main", "keygen", str(path), "--force"], cwd=REPO,
                         env={**os.environ, "PYTHONPATH": str(REPO)}, check=True, capture_output=True, text=True)
    return out.stdout.split()[0]


def run_solo(launcher: Launcher, arm: Arm, run_dir: Path, warmup: int) -> dict[str, float]:
    launcher.wait(launcher.start(arm, "solo", run_dir))
    return rates_of(run_dir, "solo", warmup)


def run_join(launcher: Launcher, arm: Arm, run_dir: Path, warmup: int, keys: dict[str, tuple[Path, str]]
             ) -> dict[str, float]:
    port = free_port()
    a = launcher.start(arm, "join", run_dir / "a", "--listen", f"/ip4/127.0.0.1/tcp/{port}",
                       "--identity", str(keys["a"][0]), more_steps=BOOTSTRAP_EXTRA_STEPS)
    wait_listening(port, a)
    b = launcher.start(arm, "join", run_dir / "b", "--listen", "/ip4/127.0.0.1/tcp/0", "--identity",
                       str(keys["b"][0]), "--bootstrap", f"/ip4/127.0.0.1/tcp/{port}/p2p/{keys['a'][1]}",
                       "--external-groups", str(JOINER_EXTERNAL_GROUPS))
    launcher.wait(a, b)
    return rates_of(run_dir, "join", warmup)  # over the window in which both trained (a starts alone)


MODES: dict[str, Callable[..., dict[str, float]]] = {"solo": run_solo, "join": run_join}


def measure(args: argparse.Namespace, work: Path) -> Runs:
    launcher = Launcher(args.old_root, args.model, args.steps, work / "sources")
    (work / "sources").mkdir(parents=True, exist_ok=True)
    keys = {node: (work / f"{node}.key", "") for node in ("a", "b")}
    keys = {node: (path, keygen(path)) for node, (path, _) in keys.items()}
    runs = Runs()
    try:
        for r in range(args.rounds):
            for mode in args.modes:
                names = [n for n, arm in ARMS.items() if mode in arm.modes]
                names = names[r % len(names):] + names[:r % len(names)]
                for name in names:
                    started = time.monotonic()
                    extra = (keys,) if mode == "join" else ()
                    rates = MODES[mode](launcher, ARMS[name], work / f"r{r}" / mode / name, args.warmup, *extra)
                    took = time.monotonic() - started
                    runs.rates.setdefault(mode, {}).setdefault(name, []).append(statistics.fmean(rates.values()))
                    runs.nodes.setdefault(mode, {}).setdefault(name, []).append(rates)
                    runs.seconds.setdefault(mode, {}).setdefault(name, []).append(round(took, 1))
                    print(f"  round {r + 1}/{args.rounds} {mode} {name}: "
                          + ", ".join(f"{k} {v:.1f}" for k, v in rates.items()) + f" steps/min ({took:.0f} s)",
                          flush=True)
    finally:
        launcher.kill_all()
    return runs


def collect(work: Path, rounds: int, warmup: int, modes: list[str]) -> Runs:
    """The rates of a finished or interrupted measurement, read back from its run directories: a round counts for
    a mode only when every arm of that mode finished in it (its pairs stay whole)."""
    runs = Runs()
    for r in range(rounds):
        for mode in modes:
            names = [n for n, arm in ARMS.items() if mode in arm.modes]
            try:  # a missing or cut-off run leaves its whole round out for this mode
                rates = {n: rates_of(work / f"r{r}" / mode / n, mode, warmup) for n in names}
            except (OSError, RuntimeError, ValueError) as exc:
                print(f"  round {r + 1} {mode}: left out ({exc})", flush=True)
                continue
            for name, by_node in rates.items():
                runs.rates.setdefault(mode, {}).setdefault(name, []).append(statistics.fmean(by_node.values()))
                runs.nodes.setdefault(mode, {}).setdefault(name, []).append(by_node)
    return runs


def rates_of(run_dir: Path, mode: str, warmup: int) -> dict[str, float]:
    """One finished run's steps/min, as `run_solo` / `run_join` measure them."""
    if mode == "solo":
        return {"solo": steps_per_min(step_times(run_dir / "metrics.jsonl", warmup))}
    times = {node: step_times(run_dir / node / "metrics.jsonl", warmup) for node in ("a", "b")}
    start, end = max(t[0] for t in times.values()), min(t[-1] for t in times.values())
    return {node: steps_per_min(t, start, end) for node, t in times.items()}


def summarize(runs: Runs) -> dict[str, Any]:
    ratio = {mode: round(paired_ratio(r["now"], r["old"]), 3) for mode, r in runs.rates.items()}
    factors: dict[str, dict[str, float]] = {}
    per_round_factors: dict[str, dict[str, list[float]]] = {}
    for name, arm in ARMS.items():
        if not arm.factor:
            continue
        for mode, rates in runs.rates.items():
            if name not in rates:
                continue
            # the arm with the factor at its old value over the arm with it at today's value
            old_value, now_value = (rates["now"], rates[name]) if arm.against == name else (rates[name], rates["now"])
            factors.setdefault(arm.factor, {})[mode] = round(paired_ratio(old_value, now_value), 3)
            per_round_factors.setdefault(arm.factor, {})[mode] = [round(x, 3) for x in
                                                                 per_run_ratios(old_value, now_value)]
    return {
        "old_commit": OLD_COMMIT,
        "task": TASK,
        "ratio_now_over_then": ratio,
        "ratio_now_over_then_per_round": {m: [round(x, 3) for x in per_run_ratios(r["now"], r["old"])]
                                          for m, r in runs.rates.items()},
        "factors": factors,
        "factors_per_round": per_round_factors,
        "factors_unchanged": {"threads": "train.threads = 0 (all cores) and the same torch.set_num_threads call "
                                         "in both versions (node start); nothing to revert"},
        "steps_per_min_median": {m: {a: round(statistics.median(v), 1) for a, v in r.items()}
                                 for m, r in runs.rates.items()},
        "steps_per_min": {m: {a: [round(x, 2) for x in v] for a, v in r.items()} for m, r in runs.rates.items()},
        "join_nodes_steps_per_min": {a: [{k: round(x, 2) for k, x in v.items()} for v in vals]
                                     for a, vals in runs.nodes.get("join", {}).items()},
        "run_seconds": runs.seconds or None,  # None: collected from run directories
        "arms": {n: {"old_code": a.old_code, "toml": a.toml, "task": a.task or "(default mix)",
                     "modes": list(a.modes), "factor": a.factor, "fixed_mmap": a.fixed_mmap}
                 for n, a in ARMS.items()},
    }


def as_cli() -> None:
    """Run the CLI with the rest of argv; at exit, write the repository modules it imported (for provenance)."""
    out = os.environ.get(CHILD_SOURCES_ENV)
    if out:
        atexit.register(lambda: Path(out).write_text(json.dumps(provenance.imported_sources())))
    if os.environ.get(FIXED_MMAP_ENV):
        from swarm_node.model.device_memory import return_freed_memory
        if not return_freed_memory():
            raise RuntimeError("glibc's mallopt is not available: the fixed_mmap arm cannot run")
    from cli.main import app
    sys.argv = ["swarm-node", *sys.argv[2:]]
    app()


def extract_old_tree(root: Path) -> None:
    """`git archive OLD_COMMIT` of this checkout, unpacked at `root` (a clean clone has the commit)."""
    print(f"step_rate: extracting {OLD_COMMIT} to {root}", flush=True)
    root.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", OLD_COMMIT], capture_output=True, check=False)
    if archive.returncode != 0:
        raise SystemExit(f"error: git archive {OLD_COMMIT} failed: {archive.stderr.decode().strip()}")
    subprocess.run(["tar", "-x", "-C", str(root)], input=archive.stdout, check=True)


def default_model() -> str:
    """`MODEL_RECIPE`'s directory, built by this checkout when missing."""
    from swarm_node.model.default_model import ensure_default_model
    return str(ensure_default_model(recipe=MODEL_RECIPE))


def main() -> None:
    if sys.argv[1:2] == ["--as-cli"]:
        as_cli()
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5, help="step records skipped at the start of each run")
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    parser.add_argument("--old-root", type=Path, default=DEFAULT_OLD_ROOT,
                        help=f"the old tree (extracted there from git when absent: git archive {OLD_COMMIT})")
    parser.add_argument("--model", default="",
                        help=f"model dir both versions load [the {MODEL_RECIPE} recipe's, built when missing]")
    parser.add_argument("--work", type=Path, default=REPO / "runs" / "step_rate")
    parser.add_argument("--out", type=Path, default=RESULTS / "step_rate.json")
    parser.add_argument("--collect", action="store_true",
                        help="measure nothing: summarize the runs already under --work (e.g. after a timeout)")
    add_loaded_flag(parser)
    args = parser.parse_args()
    run = provenance.begin(timed=not args.collect, loaded=args.loaded)
    if not (args.old_root / "cli" / "main.py").exists():
        extract_old_tree(args.old_root)
    args.model = args.model or default_model()
    runs = collect(args.work, args.rounds, args.warmup, args.modes) if args.collect else measure(args, args.work)
    out = summarize(runs)
    out["model"] = args.model
    out["settings"] = {"rounds": args.rounds, "steps": args.steps, "warmup": args.warmup, "modes": args.modes}
    child: set[str] = set()
    for f in (args.work / "sources").glob("*.json"):
        child.update(json.loads(f.read_text()))
    args.out.write_text(json.dumps(provenance.stamp(out, run, args.rounds, child_sources=sorted(child)),
                                   indent=1) + "\n")
    r = out["ratio_now_over_then"]
    print(f"step_rate: now/old {' '.join(f'{m} {v:.2f}' for m, v in r.items())}; factors (old value / now): "
          + ", ".join(f"{f} " + "/".join(f"{m} {v:.2f}" for m, v in ms.items()) for f, ms in out["factors"].items()))


if __name__ == "__main__":
    main()
