"""Memory benchmark: a `solo` run's peak RSS under several memory budgets, and RSS growth over a long soak.

    python -m bench.memory [--budgets 950,1100,1400,1800] [--steps 6] [--sampler auto]   # the budgets part
    python -m bench.memory --soak-hours 2 [--segment-hours 0.5] [--skip-budgets]          # the soak, resumable

Budgets: each budget runs `swarm-node solo --memory-budget B` in its own process; its peak RSS is the kernel's
(os.wait4's ru_maxrss), so nothing inside the node measures itself. The top-level budgets and peaks are this
invocation's sampler; `by_sampler` keeps each sampler's last run, and `within_budget` is true when every peak of
every sampler kept is at most its budget (and every run exited 0).
Soak: one `solo` node trained for --soak-hours of wall time, its RSS (/proc/PID/status VmRSS) sampled every
--sample-s seconds into bench/results/memory_soak.jsonl. Resumable and appendable: a run stops after
--segment-hours (SIGTERM: the node checkpoints), and the next invocation resumes the node from its checkpoint and
appends, with the soak clock running on from the samples already there, until --soak-hours are reached.
`soak_rss_growth_frac` = median RSS of the last window / median of the first window - 1, over samples taken
while training (not while a segment loads); the window is 10 minutes, or half the soak when it is shorter.
Each segment is a new process, so a leak shows best within one: `soak_segments` has each segment's own figure,
and the full soak is best run as one segment (the default --segment-hours is longer than any soak).
Baseline, same soak (`--soak-baseline`, from its start): a second solo node with oneDNN's default primitive cache
(`ONEDNN_PRIMITIVE_CACHE_CAPACITY=1024`, where ours sets 0) runs beside ours in its own run dir, both sampled at the
same times (samples carry `arm`: "ours" or the baseline's name; samples without one are ours), so the two growths
come from the same hours of the same machine: `soak_baseline` {arm, rss_growth_frac, segments}.
Writes bench/results/memory.json (the budgets part and the soak part are merged with what is there) and prints
one line. `gpu` is null: this benchmark runs on the CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench import provenance
from swarm_node.model.device_memory import status_kib

RESULTS = Path(__file__).parent / "results"
OUT = RESULTS / "memory.json"
SOAK_FILE = RESULTS / "memory_soak.jsonl"
RUN_ROOT = Path("runs/bench-memory")
WINDOW_S = 600.0  # the soak's first (and last) 10 minutes
CLI = [sys.executable, "-m", "cli.main", "solo"]
SOAK_STEPS = 10_000_000  # the soak stops on time, not on steps
OURS = "ours"
SOAK_ARMS = {  # arm -> what its node's environment adds (registered by name; the baseline is chosen by --soak-baseline)
    OURS: {},
    "onednn_default_cache": {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "1024"},  # oneDNN's own default: an unbounded cache
}
BASELINE = "onednn_default_cache"
GPU_NOTE = ("gpu: null; this benchmark measures CPU RSS. The GPU figures (device, steps/s against the CPU, peak "
            "VRAM) come from a session lent a GPU")


def solo_args(run_dir: Path, sampler: str, extra: list[str]) -> list[str]:
    return [*CLI, "--run-dir", str(run_dir), "--sampler", sampler, "--status-port", "-1", "--eval-problems", "0",
            *extra]


def peak_of_run(budget_mib: int, steps: int, sampler: str) -> dict[str, Any]:
    """One solo run under `budget_mib`: its kernel-measured peak RSS, exit code and what sizing chose."""
    run_dir = RUN_ROOT / f"{sampler}-budget-{budget_mib}"
    shutil.rmtree(run_dir, ignore_errors=True)
    args = solo_args(run_dir, sampler, ["--steps", str(steps), "--memory-budget", str(budget_mib),
                                        "--checkpoint-every", str(steps)])
    log = RUN_ROOT / f"{sampler}-budget-{budget_mib}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    lines = log.read_text().splitlines()
    return {"budget_mib": budget_mib, "peak_rss_mib": round(usage.ru_maxrss / 1024, 1), "exit_code": proc.returncode,
            "sizing": next((line for line in lines if line.startswith("memory: budget")), ""),
            "guard": [line for line in lines if line.startswith("memory: step")],
            "error": next((line for line in lines if line.startswith("error:")), "")}


def growth(samples: list[dict[str, Any]], window_s: float = WINDOW_S) -> tuple[float, float | None]:
    """(soak hours, RSS growth fraction) over the training samples (see the module header); None: too few."""
    train = [s for s in samples if s.get("phase") == "train"]
    if len(train) < 2:
        return 0.0, None
    t0, t1 = train[0]["t"], train[-1]["t"]
    window = min(window_s, (t1 - t0) / 2)
    first = [s["rss_mib"] for s in train if s["t"] <= t0 + window]
    last = [s["rss_mib"] for s in train if s["t"] >= t1 - window]
    return round((t1 - t0) / 3600, 4), round(statistics.median(last) / statistics.median(first) - 1, 4)


def read_samples(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    records = (json.loads(line) for line in path.read_text().splitlines() if line.strip())
    return [r for r in records if "provenance" not in r]  # the first line: how the samples were taken


def metrics_steps(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return 0
    return sum(1 for line in path.read_text().splitlines() if line.strip())


def arm_of(sample: dict[str, Any]) -> str:
    return str(sample.get("arm", OURS))


def arm_samples(samples: list[dict[str, Any]], arm: str) -> list[dict[str, Any]]:
    return [s for s in samples if arm_of(s) == arm]


def soak_dir(arm: str) -> Path:
    return RUN_ROOT / ("soak" if arm == OURS else f"soak-{arm}")


def soak_part(samples: list[dict[str, Any]], arm: str) -> dict[str, Any]:
    """One arm's soak figures: hours and growth over all its samples, and each segment's own."""
    mine = arm_samples(samples, arm)
    hours, frac = growth(mine)
    segments = [dict(zip(("segment", "hours", "rss_growth_frac"),
                         (k, *growth([s for s in mine if s["segment"] == k])), strict=True))
                for k in sorted({s["segment"] for s in mine})]
    return {"hours": hours, "rss_growth_frac": frac, "segments": segments}


def soak(hours: float, segment_hours: float, sample_s: float, sampler: str, budget_mib: int | None,
         arms: tuple[str, ...] = (OURS,)) -> None:
    """Run (or continue) the soak for one segment, every arm's node side by side, appending samples to SOAK_FILE."""
    samples = read_samples(SOAK_FILE)
    ours = arm_samples(samples, OURS)
    done_s = ours[-1]["t"] if ours else 0.0
    if done_s >= hours * 3600:
        return
    if ours and any(not arm_samples(samples, arm) for arm in arms):
        raise SystemExit("a baseline arm must run from the soak's start: pass --restart-soak")
    extra = ["--steps", str(SOAK_STEPS), "--checkpoint-every", "50"]
    if budget_mib:
        extra += ["--memory-budget", str(budget_mib)]
    segment = 1 + max((s["segment"] for s in samples), default=0)
    until = min(hours * 3600, done_s + segment_hours * 3600)
    RUN_ROOT.mkdir(parents=True, exist_ok=True)
    procs: dict[str, subprocess.Popen[bytes]] = {}
    steps_before: dict[str, int] = {}
    with open(SOAK_FILE, "a") as out:
        for arm in arms:
            run_dir = soak_dir(arm)
            if not samples:
                shutil.rmtree(run_dir, ignore_errors=True)
            resume = ["--resume"] if (run_dir / "checkpoints").exists() else []
            steps_before[arm] = metrics_steps(run_dir)
            with open(RUN_ROOT / f"soak-{segment}{'' if arm == OURS else '-' + arm}.log", "w") as log:
                procs[arm] = subprocess.Popen(solo_args(run_dir, sampler, [*extra, *resume]), stdout=log,
                                              stderr=subprocess.STDOUT, env={**os.environ, **SOAK_ARMS[arm]})
        started = time.monotonic()
        try:
            while all(proc.poll() is None for proc in procs.values()):
                t = done_s + time.monotonic() - started
                taken = [sample_of(arm, proc.pid, t, segment, steps_before[arm]) for arm, proc in procs.items()]
                if None in taken:  # a process is starting or gone: nothing to sample yet
                    time.sleep(1.0)
                    continue
                out.write("".join(json.dumps(x) + "\n" for x in taken))
                out.flush()
                if t >= until:  # the last samples of this segment are written first
                    break
                time.sleep(sample_s)
        finally:
            for proc in procs.values():
                stop_soak_node(proc)
    for arm, proc in procs.items():
        if proc.returncode not in (0, 130, -signal.SIGTERM):
            raise SystemExit(f"soak segment {segment} ({arm}): solo exited with {proc.returncode}; see {RUN_ROOT}")


def sample_of(arm: str, pid: int, t: float, segment: int, steps_before: int) -> dict[str, Any] | None:
    """One RSS sample of an arm's node (None when its /proc entry is not readable yet, or any more)."""
    try:
        rss = status_kib(Path(f"/proc/{pid}/status").read_text(), "VmRSS") or 0
    except FileNotFoundError:  # the node exited between poll() and the read
        return None
    if not rss:
        return None
    steps = metrics_steps(soak_dir(arm))
    sample = {"t": round(t, 1), "rss_mib": round(rss / 1024, 1), "steps": steps, "segment": segment,
              "phase": "train" if steps > steps_before else "start"}
    return sample if arm == OURS else {**sample, "arm": arm}  # ours stay as samples were before arms


def stop_soak_node(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)  # the node checkpoints, then exits
        try:
            proc.wait(timeout=300)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--budgets", default="950,1100,1400,1800", help="budgets in MiB, comma-separated (at least 3)")
    ap.add_argument("--steps", type=int, default=6, help="solo steps per budget run")
    ap.add_argument("--sampler", default="auto", help="sampler of every run (auto | vllm | native | hf)")
    ap.add_argument("--skip-budgets", action="store_true", help="only the soak (keeps the budgets part on file)")
    ap.add_argument("--soak-hours", type=float, default=0.0, help="total soak length (0: no soak)")
    ap.add_argument("--segment-hours", type=float, default=24.0, help="stop this invocation after this long")
    ap.add_argument("--sample-s", type=float, default=30.0, help="seconds between RSS samples")
    ap.add_argument("--soak-budget", type=int, default=0, help="the soak node's --memory-budget in MiB (0: default)")
    ap.add_argument("--restart-soak", action="store_true", help="discard the soak samples and start over")
    ap.add_argument("--soak-baseline", action="store_true",
                    help=f"run a baseline node ({BASELINE}) beside ours for the whole soak (from its start)")
    args = ap.parse_args()
    run = provenance.begin()  # peaks and growth of RSS: no time or rate, no load guard
    RESULTS.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = json.loads(OUT.read_text()) if OUT.exists() else {}
    if not args.skip_budgets:
        budgets = [int(b) for b in args.budgets.split(",") if b.strip()]
        if len(budgets) < 3:
            raise SystemExit("--budgets needs at least 3 budgets")
        runs = [peak_of_run(b, args.steps, args.sampler) for b in budgets]
        part = {"budgets_mib": budgets, "peak_rss_mib": [r["peak_rss_mib"] for r in runs],
                "within_budget": all(r["exit_code"] == 0 and r["peak_rss_mib"] <= r["budget_mib"] for r in runs),
                "steps": args.steps, "runs": runs}
        by_sampler = {**result.get("by_sampler", {}), args.sampler: part}
        result.update({**part, "sampler": args.sampler, "by_sampler": by_sampler,
                       "within_budget": all(p["within_budget"] for p in by_sampler.values())})
    if args.restart_soak:
        SOAK_FILE.unlink(missing_ok=True)
        for arm in SOAK_ARMS:
            shutil.rmtree(soak_dir(arm), ignore_errors=True)
    if args.soak_hours > 0:
        arms = (OURS, BASELINE) if args.soak_baseline else (OURS,)
        soak(args.soak_hours, args.segment_hours, args.sample_s, args.sampler, args.soak_budget or None, arms)
        result.update({"soak_target_hours": args.soak_hours, "soak_sampler": args.sampler})
    samples = read_samples(SOAK_FILE)
    ours = arm_samples(samples, OURS)
    hours, frac = growth(ours)
    segments = sorted({s["segment"] for s in samples})
    result["soak_segments"] = soak_part(samples, OURS)["segments"]
    result.update({"soak_hours": hours, "soak_rss_growth_frac": frac, "soak_samples": len(ours),
                   "soak_complete": bool(ours) and ours[-1]["t"] >= result.get("soak_target_hours", 0) * 3600,
                   "gpu": None, "note": GPU_NOTE})
    if arm_samples(samples, BASELINE):
        result["soak_baseline"] = {"arm": BASELINE, **soak_part(samples, BASELINE)}
    OUT.write_text(json.dumps(provenance.stamp(result, run, runs=len(result.get("runs", []))), indent=1) + "\n")
    if args.soak_hours > 0:
        lines = provenance.stamp_lines(samples, run, runs=len(segments))
        SOAK_FILE.write_text("".join(json.dumps(line) + "\n" for line in lines))
    print(f"memory: budgets {result.get('budgets_mib')} MiB -> peaks {result.get('peak_rss_mib')} MiB "
          f"(within budget: {result.get('within_budget')}); soak {hours:.3g} h, RSS growth "
          f"{'n/a' if frac is None else f'{frac:+.1%}'}{baseline_text(result.get('soak_baseline'))}; wrote {OUT}")


def baseline_text(baseline: dict[str, Any] | None) -> str:
    if baseline is None or baseline["rss_growth_frac"] is None:
        return ""
    return f" (baseline {baseline['arm']} beside it: {baseline['rss_growth_frac']:+.1%})"


if __name__ == "__main__":
    main()
