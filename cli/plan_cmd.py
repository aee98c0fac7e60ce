"""`swarm-node plan`: the cheapest set of workers that keeps a learner busy, and the staleness bound it needs.

Thin: gather the inputs (plan file < measured run < flags), call swarm_node.echo.planning.plan, print a table (or JSON
with --json) on stdout. Bad input is one UserError line (exit 2); an infeasible plan is printed with its reason and
exits 1, so that scripts can tell it from a feasible one (exit 0).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from swarm_node.echo.plan_file import input_from_mapping, measure_run
from swarm_node.echo.planning import Plan, plan, plan_to_dict
from swarm_node.errors import UserError

METRICS_FILE = "metrics.jsonl"  # what swarm_node.node.run_files writes (not imported: that would load torch)


def run_plan(config: Path | None, from_run: Path | None, overrides: dict[str, Any], workers: list[str] | None,
             as_json: bool) -> Plan:
    """Build the plan input, plan, print. `overrides` maps "learner.step_s"-style keys to flag values (None:
    not given); `workers` are --worker specs, which replace the file's [[workers]]."""
    data: dict[str, Any] = {}
    if config is not None:
        from swarm_node.config import read_toml

        data = read_toml(config, "plan file")
    tables = {k: dict(v) if isinstance(v, dict) else v for k, v in data.items()}
    notes: list[str] = []
    if from_run is not None:
        m = measure_run(read_metrics(from_run))
        learner = tables.setdefault("learner", {})
        if isinstance(learner, dict):
            learner["step_s"] = m.train_s
            learner.setdefault("rollouts_per_step", m.rollouts_per_step)
        notes.append(f"measured over {m.steps} steps of {from_run}: training {m.train_s:.3g} s/step, "
                     f"{m.rollouts_per_step:g} groups/step (a rollout here is a group)"
                     + (f"; this node generated {m.gen_rollouts_s:.3g} groups/s" if m.gen_rollouts_s else ""))
    for dotted, value in overrides.items():
        if value is None:
            continue
        section, _, key = dotted.partition(".")
        table = tables.setdefault(section, {})
        if isinstance(table, dict):
            table[key] = value
    if workers:
        tables["workers"] = [parse_worker_flag(spec) for spec in workers]
    p = plan(input_from_mapping(tables, str(config) if config else "the flags"))
    if as_json:
        typer.echo(json.dumps({**plan_to_dict(p), "notes": notes}, indent=2))
    else:
        print_plan(p, notes)
    if not p.feasible:
        raise typer.Exit(1)
    return p


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / METRICS_FILE
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError as exc:
        raise UserError(f"no {METRICS_FILE} in {str(run_dir)!r} (is it a node's run dir?)") from exc
    records = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UserError(f"{path}:{i} is not JSON: {exc.msg}") from exc
        if isinstance(record, dict):
            records.append(record)
    return records


def parse_worker_flag(spec: str) -> dict[str, Any]:
    """NAME:THROUGHPUT:COST_PER_HOUR[:BANDWIDTH_MB_S] -> a [[workers]] table."""
    parts = spec.split(":")
    if len(parts) not in (3, 4) or not parts[0]:
        raise UserError(f"--worker must look like NAME:ROLLOUTS_PER_S:COST_PER_HOUR[:BANDWIDTH_MB_S], got {spec!r}")
    try:
        numbers = [float(x) for x in parts[1:]]
    except ValueError:
        raise UserError(f"--worker {spec!r}: throughput, cost and bandwidth must be numbers") from None
    table: dict[str, Any] = {"name": parts[0], "throughput": numbers[0], "cost_per_hour": numbers[1]}
    if len(numbers) == 3:
        table["bandwidth_mb_s"] = numbers[2]
    return table


def _s(x: float) -> str:
    return "inf" if x == float("inf") else f"{x:.3g}"  # inf: no worker (no generation, no dissemination)


def print_plan(p: Plan, notes: list[str]) -> None:
    from rich.console import Console
    from rich.table import Table

    out = Console(highlight=False, soft_wrap=True)  # stdout: the plan is the command's result
    for note in notes:
        out.print(note)
    if p.feasible:
        out.print(f"plan: {len(p.chosen)} worker(s), {p.throughput_rollouts_s:.4g} rollouts/s "
                  f"(need {p.required_rollouts_s:.4g}), ${p.cost_per_hour:.4g}/h ({p.search} search)")
    else:
        out.print(f"[red]{p.reason}[/red]")
        if p.chosen:
            out.print(f"best effort, every usable worker: {p.throughput_rollouts_s:.4g} rollouts/s, "
                      f"${p.cost_per_hour:.4g}/h")
    for name, why in p.excluded:
        out.print(f"excluded {name}: {why}")
    if not p.chosen:
        return
    workers = Table("worker", "rollouts/s", "$/h", "$/h per rollout/s", "link MB/s")
    for w in p.chosen:
        workers.add_row(w.name, f"{w.throughput_rollouts_s:.4g}", f"{w.cost_per_hour:.4g}",
                        f"{w.cost_per_hour / w.throughput_rollouts_s:.4g}",
                        "learner's" if w.bandwidth_mb_s is None else f"{w.bandwidth_mb_s:g}")
    out.print(workers)
    d = p.dissemination
    if d is not None:
        out.print(f"dissemination ({d.schedule}, {d.receivers} receivers, depth {d.depth}, {d.chunks} chunks at "
                  f"{d.hop_bandwidth_mb_s:g} MB/s): D = {_s(d.latency_s)} s; floor M/B = {_s(d.floor_s)} s; "
                  f"star {_s(d.star_s)} s")
    out.print(f"per step: generation G = {_s(p.generation_s)} s, upload U = {_s(p.upload_s)} s")
    if p.min_staleness is not None:
        out.print(f"smallest staleness bound with full learner utilisation: S = {p.min_staleness}")
    else:
        out.print("no staleness bound reaches full learner utilisation with these workers")
    rows = Table("S", "s/step", "utilisation", "$/step")
    for r in p.rows:
        deadlock = r.period_s == float("inf")
        rows.add_row(str(r.staleness), "deadlock" if deadlock else _s(r.period_s), f"{r.utilisation:.1%}",
                     "-" if deadlock else f"{r.cost_per_step:.4g}")
    out.print(rows)
