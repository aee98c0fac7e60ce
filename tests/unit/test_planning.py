"""Capacity planning (swarm_node.echo.planning and plan_*, `swarm-node plan`): hand-computed selections, latencies,
periods and S."""

from __future__ import annotations

import itertools
import json
import math
import random
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app
from swarm_node.echo.plan_file import input_from_mapping, measure_run
from swarm_node.echo.plan_model import (
    MB,
    PlanInput,
    WorkerSpec,
    dissemination,
    learner_period_s,
    min_full_staleness,
)
from swarm_node.echo.plan_search import cheapest_set
from swarm_node.echo.planning import plan, plan_to_dict
from swarm_node.errors import UserError

ROOT = Path(__file__).resolve().parents[2]
A, B, C = WorkerSpec("a", 2.0, 1.0), WorkerSpec("b", 1.0, 0.3), WorkerSpec("c", 1.5, 0.6)
PLAN_TOML = """
[learner]
step_s = 10.0
rollouts_per_step = 25
delta_mb = 100

[network]
bandwidth_mb_s = 10

[[workers]]
name = "a"
throughput = 2.0
cost_per_hour = 1.0

[[workers]]
name = "b"
throughput = 1.0
cost_per_hour = 0.3

[[workers]]
name = "c"
throughput = 1.5
cost_per_hour = 0.6
"""


def example(**changes: object) -> PlanInput:
    """T = 10 s, R = 25 (need 2.5 rollouts/s), M = 100 MB at 10 MB/s in 1 MB chunks (K = 100), stripe:2."""
    base: dict[str, object] = dict(learner_step_s=10.0, rollouts_per_step=25.0, delta_bytes=100 * MB,
                                   bandwidth_mb_s=10.0, chunk_bytes=MB, workers=(A, B, C))
    base.update(changes)
    return PlanInput(**base)  # type: ignore[arg-type]


def names(ws: tuple[WorkerSpec, ...]) -> set[str]:
    return {w.name for w in ws}


# ------------------------------------------------------------------------------------------------- selection
def test_cheapest_of_three_workers() -> None:
    # Sets reaching 2.5/s: {b,c} 2.5 at $0.9, {a,b} 3.0 at $1.3, {a,c} 3.5 at $1.6, {a,b,c} $1.9.
    chosen, search = cheapest_set([A, B, C], 2.5)
    assert names(chosen) == {"b", "c"} and search == "exact"
    assert cheapest_set([A, B, C], 4.6) is None  # all three give 4.5


def test_exact_search_beats_greedy_where_greedy_is_trapped() -> None:
    # Greedy by $/throughput takes x (1.0) then y (1.0): $12; one z (1.06/throughput) does it for $10.6.
    x, y, z = WorkerSpec("x", 6, 6.0), WorkerSpec("y", 6, 6.0), WorkerSpec("z", 10, 10.6)
    exact, how = cheapest_set([x, y, z], 10)
    greedy, how_g = cheapest_set([x, y, z], 10, exact_limit=0)
    assert (names(exact), how) == ({"z"}, "exact")
    assert (names(greedy), how_g) == ({"x", "y"}, "greedy")


def test_greedy_drops_what_a_later_worker_made_redundant() -> None:
    # Greedy adds p (ratio 1.0, not enough) then q (1.05); q alone suffices, so p is dropped again.
    p, q = WorkerSpec("p", 9, 9.0), WorkerSpec("q", 10, 10.5)
    chosen, _ = cheapest_set([p, q], 10, exact_limit=0)
    assert names(chosen) == {"q"}


def test_exact_search_matches_brute_force() -> None:
    rng = random.Random(7)
    for _ in range(150):
        ws = [WorkerSpec(f"w{i}", rng.choice([0.5, 1, 1.5, 2, 3]), rng.choice([0, 0.2, 0.5, 1, 1.5]))
              for i in range(rng.randint(1, 7))]
        need = rng.uniform(0.5, 8)
        best = None
        for k in range(len(ws) + 1):
            for combo in itertools.combinations(ws, k):
                thr = sum(w.throughput_rollouts_s for w in combo)
                if thr >= need:
                    key = (round(sum(w.cost_per_hour for w in combo), 9), -round(thr, 9))
                    best = key if best is None or key < best else best
        found = cheapest_set(ws, need)
        got = None if found is None else (round(sum(w.cost_per_hour for w in found[0]), 9),
                                          -round(sum(w.throughput_rollouts_s for w in found[0]), 9))
        assert got == best, (ws, need)


def test_identical_workers_stay_exact() -> None:
    # 20 copies of one machine: without symmetry breaking the search would run out of budget (-> "greedy").
    chosen, search = cheapest_set([WorkerSpec(f"w{i}", 1.0, 0.5) for i in range(20)], 9.5)
    assert (len(chosen), search) == (10, "exact")


def test_forced_workers_stay_in() -> None:
    chosen, _ = cheapest_set([A, B, C], 2.5, forced=["a"])
    assert names(chosen) == {"a", "b"}  # with a forced in, b ($0.3) closes the gap


# ---------------------------------------------------------------------------------------------- dissemination
FOUR = tuple(WorkerSpec(f"r{i}", 1.0, 0.1) for i in range(4))


@pytest.mark.parametrize(("schedule", "depth", "latency", "busiest"), [
    ("chain", 4, 10 * (1 + 3 / 100), 10.0),  # (M/B)(1 + (N-1)/K)
    ("tree:2", 2, 2 * 10 * (1 + 1 / 100), 20.0),  # hop at B/2, 2 levels
    ("star", 1, 40.0, 40.0),  # N M / B
    ("stripe:2", 3, 10 * (50 + 2) * 2 / 100, 10.0),  # (K/f + depth - 1) chunk times of f M/(K B); levels 1, 2, 4
])
def test_dissemination_latency(schedule: str, depth: int, latency: float, busiest: float) -> None:
    d = dissemination(example(schedule=schedule), FOUR)  # M = 100 MB, B = 10 MB/s, K = 100, N = 4
    assert (d.depth, d.chunks, d.receivers) == (depth, 100, 4)
    assert d.latency_s == pytest.approx(latency)
    assert d.busiest_uplink_s == pytest.approx(busiest)
    assert d.floor_s == pytest.approx(10.0) and d.star_s == pytest.approx(40.0)


def test_dissemination_hop_latency_and_slow_receiver() -> None:
    assert dissemination(example(schedule="chain", hop_latency_s=0.05), FOUR).latency_s == pytest.approx(10.5)
    slow = (*FOUR[:3], WorkerSpec("slow", 1.0, 0.1, bandwidth_mb_s=5.0))
    d = dissemination(example(schedule="chain"), slow)  # every hop at the slowest link: 5 MB/s
    assert (d.hop_bandwidth_mb_s, d.latency_s, d.floor_s) == (5.0, pytest.approx(20.6), pytest.approx(20.0))
    star = dissemination(example(schedule="star"), slow)  # max(N M / B, M / slowest) = max(40, 20)
    assert star.latency_s == pytest.approx(40.0)


# ----------------------------------------------------------------------------------------- the overlap model
def test_plan_of_the_example() -> None:
    p = plan(example())
    assert p.feasible and p.reason == "" and p.search == "exact"
    assert names(p.chosen) == {"b", "c"}
    assert p.cost_per_hour == pytest.approx(0.9) and p.throughput_rollouts_s == pytest.approx(2.5)
    assert p.required_rollouts_s == pytest.approx(2.5) and p.shortfall_rollouts_s == 0
    assert p.dissemination is not None and p.dissemination.latency_s == pytest.approx(10.2)  # stripe:2, N = 2
    assert p.generation_s == pytest.approx(10.0) and p.upload_s == 0
    # x = D + G + U = 20.2 s; kappa = 1: P(S) = max(T, (T + x) / (S + 1)); S_min = ceil(x / T) = 3.
    assert p.min_staleness == 3
    assert [r.period_s for r in p.rows] == pytest.approx([30.2, 15.1, 30.2 / 3, 10.0])
    assert p.rows[3].utilisation == pytest.approx(1.0) and p.rows[0].utilisation == pytest.approx(10 / 30.2)
    assert p.rows[3].cost_per_step == pytest.approx(0.9 * 10 / 3600)


def test_publishing_every_kappa_steps() -> None:
    p = plan(example(kappa=2))
    # S < kappa - 1 deadlocks; S = 1: synchronous per 2 steps, (x + 2T) / 2; S = 2: sigma 2, m 1: T + (x - T)/2;
    # S = 3: sigma 3, m 2: T + (x - 2T)/4; S_min = kappa - 1 + ceil(x / T) = 4.
    assert p.min_staleness == 4
    assert [r.period_s for r in p.rows] == pytest.approx([math.inf, 20.1, 15.1, 10.05, 10.0])
    assert p.rows[0].utilisation == 0


def test_period_and_min_staleness_agree() -> None:
    rng = random.Random(3)
    for _ in range(300):
        t, g, u, d = rng.uniform(1, 5), rng.uniform(0.1, 5), rng.uniform(0, 2), rng.uniform(0, 30)
        kappa, busiest = rng.randint(1, 4), rng.uniform(0, 10)
        periods = [learner_period_s(s, t, g, u, d, busiest, kappa) for s in range(40)]
        assert all(a >= b for a, b in itertools.pairwise(periods))  # a larger bound never hurts
        s_min = min_full_staleness(t, g, u, d, busiest, kappa)
        if s_min is None:
            assert min(periods) > t
        else:
            assert periods[s_min] == pytest.approx(t) and (s_min == 0 or periods[s_min - 1] > t * (1 + 1e-9))
            assert s_min == kappa - 1 + math.ceil((d + g + u) / t)


def test_synchronous_and_exact_boundary() -> None:
    # S = 0 is the sequential loop: train, publish, disseminate, generate, upload.
    assert learner_period_s(0, 10, 10, 5, 5, 0) == pytest.approx(30.0)
    # x = 5 + 10 + 5 = 20 = 2 T exactly: S = 2 suffices (no float ceil surprise).
    assert min_full_staleness(10, 10, 5, 5, 0) == 2
    assert min_full_staleness(10, 10.5, 0, 0, 0) is None  # the workers cannot keep pace at any S


def test_staleness_cap_buys_throughput() -> None:
    # Small delta (D = 0.04 s): {b, c} gives G = 10 s, so S_min = 2. Under a cap S = 1 generation must fit in
    # T - D = 9.96 s: 25 / 9.96 = 2.51 rollouts/s, which {b, c} misses; {a, b} (3.0, $1.3) is the cheapest.
    free = plan(example(delta_bytes=MB, bandwidth_mb_s=100.0))
    assert names(free.chosen) == {"b", "c"} and free.min_staleness == 2
    capped = plan(example(delta_bytes=MB, bandwidth_mb_s=100.0, max_staleness=1))
    assert names(capped.chosen) == {"a", "b"} and capped.min_staleness == 1
    assert capped.required_rollouts_s == pytest.approx(25 / (10 - 0.04))


def test_upload_counts() -> None:
    # 25 rollouts x 400 kB through 10 MB/s: U = 1 s, so x = 10.2 + 10 + 1 = 21.2 and S_min = 3 still.
    p = plan(example(rollout_bytes=400_000))
    assert p.upload_s == pytest.approx(1.0) and p.rows[0].period_s == pytest.approx(31.2)


# ------------------------------------------------------------------------------------------------- infeasible
def test_infeasible_says_how_much_is_missing() -> None:
    p = plan(example(rollouts_per_step=50.0))  # need 5/s, all three give 4.5/s
    assert not p.feasible and p.search == "none"
    assert p.reason == "infeasible: need 0.5 more rollouts/s (have 4.5, need 5)"
    assert p.shortfall_rollouts_s == pytest.approx(0.5)
    assert names(p.chosen) == {"a", "b", "c"} and p.min_staleness is None


def test_infeasible_when_the_cap_leaves_no_time() -> None:
    p = plan(example(max_staleness=0))
    assert not p.feasible and "leaves no time for generation within S = 0" in p.reason


def test_infeasible_when_the_learner_link_is_too_slow() -> None:
    p = plan(example(learner_step_s=5.0))  # 100 MB at 10 MB/s = 10 s > one step
    assert not p.feasible and p.chosen == ()
    assert p.reason.startswith("infeasible: the learner's link needs 10 s per delta (100 MB at 10 MB/s)")


def test_slow_worker_link_is_excluded() -> None:
    slow = WorkerSpec("slow", 50.0, 0.01, bandwidth_mb_s=1.0)  # 100 s per delta, T = 10 s
    p = plan(example(workers=(A, B, C, slow)))
    assert names(p.chosen) == {"b", "c"}
    assert p.excluded == (("slow", "its link needs 100 s per delta, more than kappa steps (10 s)"),)


def test_plan_to_dict_is_strict_json() -> None:
    d = plan_to_dict(plan(example(kappa=2)))
    text = json.dumps(d, allow_nan=False)
    assert json.loads(text)["rows"][0]["period_s"] is None and d["min_staleness"] == 4


# ----------------------------------------------------------------------------------------------- bad inputs
@pytest.mark.parametrize(("changes", "message"), [
    ({"learner_step_s": 0.0}, "learner.step_s must be a finite number > 0, got 0.0"),
    ({"learner_step_s": math.nan}, "learner.step_s must be a finite number > 0, got nan"),
    ({"rollouts_per_step": -1.0}, "learner.rollouts_per_step must be a finite number > 0"),
    ({"bandwidth_mb_s": 0.0}, "network.bandwidth_mb_s must be a finite number > 0"),
    ({"workers": ()}, "no workers: give at least one [[workers]] entry (or --worker)"),
    ({"workers": (A, A)}, "worker name 'a' appears twice"),
    ({"kappa": 0}, "learner.kappa must be an integer >= 1, got 0"),
    ({"max_staleness": -1}, "learner.max_staleness must be an integer >= 0"),
    ({"schedule": "ring"}, "network.schedule 'ring': unknown schedule (known: chain, star, stripe, tree)"),
    ({"schedule": "star:2"}, "network.schedule 'star:2': star takes no fan-out"),
    ({"schedule": "tree:0"}, "fan-out must be an integer in [1, 64]"),
])
def test_bad_plan_input(changes: dict[str, object], message: str) -> None:
    with pytest.raises(UserError) as err:
        example(**changes)
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(("args", "message"), [
    (("a", 0.0, 1.0), "worker 'a': throughput must be a finite number > 0, got 0.0"),
    (("a", 1.0, -1.0), "worker 'a': cost_per_hour must be a finite number >= 0, got -1.0"),
    (("a", 1.0, 1.0, 0.0), "worker 'a': bandwidth_mb_s must be a finite number > 0"),
    (("", 1.0, 1.0), "a worker needs a non-empty name"),
])
def test_bad_worker(args: tuple, message: str) -> None:
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        WorkerSpec(*args)


# ------------------------------------------------------------------------------------------------ plan files
def parse(text: str) -> PlanInput:
    import tomllib

    return input_from_mapping(tomllib.loads(text))


def test_plan_file_fields() -> None:
    inp = parse("""
        [learner]
        step_s = 12
        rollouts_per_step = 64
        delta_mb = 150
        kappa = 2
        max_staleness = 4
        tokens_per_rollout = 500
        rollout_kb = 8
        cost_per_hour = 2.5
        [network]
        bandwidth_mb_s = 12.5
        chunk_mb = 0.5
        schedule = "tree:3"
        hop_latency_s = 0.02
        [[workers]]
        name = "gpu"
        tokens_per_s = 1000
        cost_per_hour = 0.4
        count = 3
        [[workers]]
        name = "laptop"
        throughput = 0.5
        cost_per_hour = 0
        bandwidth_mb_s = 2
    """)
    assert (inp.learner_step_s, inp.rollouts_per_step, inp.delta_bytes, inp.kappa, inp.max_staleness) == \
        (12.0, 64.0, 150_000_000, 2, 4)
    assert (inp.bandwidth_mb_s, inp.chunk_bytes, inp.chunks, inp.schedule, inp.hop_latency_s) == \
        (12.5, 500_000, 300, "tree:3", 0.02)
    assert (inp.rollout_bytes, inp.learner_cost_per_hour) == (8000, 2.5)
    assert inp.workers == (WorkerSpec("gpu#1", 2.0, 0.4), WorkerSpec("gpu#2", 2.0, 0.4), WorkerSpec("gpu#3", 2.0, 0.4),
                           WorkerSpec("laptop", 0.5, 0.0, 2.0))


MINIMAL = """
[learner]
step_s = 10
rollouts_per_step = 25
delta_mb = 100
[network]
bandwidth_mb_s = 10
"""


@pytest.mark.parametrize(("text", "message"), [
    (MINIMAL + "[extra]\n", "unknown section [extra] in the plan file; known: devices, learner, network, workers"),
    (MINIMAL.replace("step_s = 10", "step_s = 10\nstep = 3"), "unknown key learner.step; known: cost_per_hour"),
    (MINIMAL.replace("step_s = 10", 'step_s = "ten"'), "learner.step_s must be a number, got 'ten'"),
    (MINIMAL.replace("step_s = 10", "step_s = true"), "learner.step_s must be a number, got True"),
    (MINIMAL.replace("step_s = 10", "step_s = 10\nkappa = 1.5"), "learner.kappa must be an integer, got 1.5"),
    (MINIMAL.replace("step_s = 10\n", ""), "learner.step_s is required (in the plan file or as a flag, or --from-run"),
    (MINIMAL.replace("delta_mb = 100", "delta_mb = -1"), "learner.delta_mb must be a finite number > 0, got -1.0"),
    (MINIMAL.replace("delta_mb = 100", "delta_mb = 100\nrollout_kb = -2"), "learner.rollout_kb must be a finite"),
    (MINIMAL, "no workers"),
    ("workers = 3\n" + MINIMAL, "workers must be an array of tables ([[workers]])"),
    (MINIMAL + '[[workers]]\nname = "w"\nthroughput = 1\n', "worker 'w'.cost_per_hour is required"),
    (MINIMAL + '[[workers]]\nname = "w"\ncost_per_hour = 1\n', "worker 'w': give exactly one of throughput"),
    (MINIMAL + '[[workers]]\nname = "w"\nthroughput = 1\ntokens_per_s = 9\ncost_per_hour = 1\n',
     "give exactly one of throughput (rollouts/s) or tokens_per_s"),
    (MINIMAL + '[[workers]]\nname = "w"\ntokens_per_s = 9\ncost_per_hour = 1\n',
     "worker 'w': tokens_per_s needs learner.tokens_per_rollout to convert"),
    (MINIMAL + '[[workers]]\nname = "w"\nthroughput = 1\ncost_per_hour = 1\ncount = 0\n',
     "worker 'w': count must be an integer >= 1, got 0"),
    (MINIMAL + '[[workers]]\nname = "w"\nthroughput = 1\ncost_per_hour = 1\ngpu = "x"\n',
     "unknown key workers[0].gpu; known: bandwidth_mb_s, cost_per_hour, count, device, name, throughput, tokens_per_s"),
])
def test_plan_file_errors(text: str, message: str) -> None:
    with pytest.raises(UserError) as err:
        parse(text)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_measure_run_takes_medians_of_trained_steps() -> None:
    records = [{"step": 1, "train_s": 9.0, "gen_s": 4.0, "groups_total": 16},
               {"step": 2, "skipped": "nonfinite"},
               {"step": 3, "train_s": 11.0, "gen_s": 2.0, "groups_total": 16},
               {"step": 4, "train_s": 10.0, "gen_s": 0.0, "groups_total": 12}]
    m = measure_run(records)
    assert (m.steps, m.train_s, m.rollouts_per_step, m.gen_rollouts_s) == (3, 10.0, 16, 6.0)  # median(4, 8)
    with pytest.raises(UserError, match="no trained step"):
        measure_run([{"step": 1, "skipped": "x"}])


# ------------------------------------------------------------------------------------------------------ CLI
@pytest.fixture
def plan_file(tmp_path: Path) -> Path:
    path = tmp_path / "plan.toml"
    path.write_text(PLAN_TOML)
    return path


def test_cli_table(plan_file: Path) -> None:
    result = CliRunner().invoke(app, ["plan", "--config", str(plan_file)])
    assert result.exit_code == 0, result.output
    out = result.output
    assert "plan: 2 worker(s), 2.5 rollouts/s (need 2.5), $0.9/h (exact search)" in out
    assert "D = 10.2 s; floor M/B = 10 s; star 20 s" in out
    assert "smallest staleness bound with full learner utilisation: S = 3" in out


def test_cli_json_flags_override_the_file(plan_file: Path) -> None:
    result = CliRunner().invoke(app, ["plan", "--config", str(plan_file), "--step-s", "20", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert [w["name"] for w in data["chosen"]] == ["c"]  # need 1.25/s: c alone ($0.6) beats a ($1.0)
    assert data["required_rollouts_s"] == pytest.approx(1.25)


def test_cli_worker_flags_replace_the_file(plan_file: Path) -> None:
    result = CliRunner().invoke(app, ["plan", "--config", str(plan_file), "--worker", "big:3:2.0",
                                      "--worker", "small:1:0.1:50", "--json"])
    data = json.loads(result.output)
    assert [w["name"] for w in data["chosen"]] == ["big"] and data["cost_per_hour"] == 2.0


def test_cli_from_run(plan_file: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    rows = [{"step": i, "train_s": s, "gen_s": 5.0, "groups_total": 25} for i, s in enumerate([19.0, 20.0, 21.0])]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = CliRunner().invoke(app, ["plan", "--config", str(plan_file), "--from-run", str(run), "--json"])
    data = json.loads(result.output)
    assert data["required_rollouts_s"] == pytest.approx(1.25)  # 25 groups per measured 20 s
    assert data["notes"][0].startswith("measured over 3 steps of")


def test_cli_infeasible_exits_1(plan_file: Path) -> None:
    result = CliRunner().invoke(app, ["plan", "--config", str(plan_file), "--rollouts-per-step", "50"])
    assert result.exit_code == 1
    assert "infeasible: need 0.5 more rollouts/s (have 4.5, need 5)" in result.output


def test_cli_entry_point(plan_file: Path, tmp_path: Path) -> None:
    cli = [sys.executable, "-m", "cli.main", "plan"]
    ok = subprocess.run([*cli, "--config", str(plan_file)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0 and "S = 3" in ok.stdout, ok.stderr
    bad = tmp_path / "bad.toml"
    bad.write_text(PLAN_TOML + "\n[learner.oops]\n")
    for args, line in [(["--config", str(tmp_path / "missing.toml")],
                        f"error: plan file '{tmp_path / 'missing.toml'}' not found"),
                       (["--config", str(bad)], "error: unknown key learner.oops; known:"),
                       (["--config", str(plan_file), "--worker", "x:1"], "error: --worker must look like NAME:")]:
        proc = subprocess.run([*cli, *args], cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert proc.stderr.count("\n") == 1 and proc.stderr.startswith(line), proc.stderr


def test_the_documented_example_holds() -> None:
    import tomllib

    doc = (ROOT / "docs" / "PLANNING.md").read_text()
    toml_text = doc.split("```toml\n", 1)[1].split("```", 1)[0]
    p = plan(input_from_mapping(tomllib.loads(toml_text)))
    assert [w.name for w in p.chosen] == [f"rtx4090#{i}" for i in range(1, 6)]
    assert p.cost_per_hour == pytest.approx(1.75) and p.min_staleness == 2
    assert p.dissemination is not None and p.dissemination.latency_s == pytest.approx(4.16)
    assert p.rows[1].period_s == pytest.approx((60 + 4.16 + 256 / 4.5 + 0.256) / 2)
    assert p.excluded[0][0] == "laptop"
    assert "S = 2" in doc and "$1.75/h" in doc
