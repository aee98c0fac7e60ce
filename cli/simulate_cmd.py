"""`swarm-node simulate SCENARIO.toml`: run a multi-node scenario and write CSV, plots and a summary table.

Thin: load the scenario (one-line errors), run every (variant, seed) cell with a progress display, write the
report. Cells already complete in the run dir are reused, so an interrupted run continues where it stopped.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from cli.common import console


def run_simulate(path: Path, run_dir: Path | None = None, rounds: int | None = None,
                 seeds: list[int] | None = None, transport: str | None = None, device: str | None = None,
                 prompt_format: str | None = None) -> Path:
    """Run the scenario at `path`; returns the run dir. Raises UserError for a bad scenario or override."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from simulations.report import write_report
    from simulations.runner import run_cell
    from simulations.scenario import TRANSPORTS, check_transport, load_scenario
    from swarm_node.errors import UserError

    scn = load_scenario(path)
    changes: dict[str, Any] = {}
    if rounds is not None:
        if rounds < 1:
            raise UserError(f"--rounds must be >= 1, got {rounds}")
        changes["rounds"] = rounds
    if seeds:
        changes["seeds"] = tuple(seeds)
    if transport is not None:
        if transport not in TRANSPORTS:
            raise UserError(f"--transport must be one of {', '.join(TRANSPORTS)}, not {transport!r}")
        check_transport(scn.mode, transport)
        changes["transport"] = transport
    config = scn.config
    if device is not None:  # every node's run.device (model/device.py); checked when the first node starts
        config = {**config, "run": {**config.get("run", {}), "device": device}}
    if prompt_format is not None:  # every node's task.prompt_format (tasks/formats.py): one swarm, one format
        config = {**config, "task": {**config.get("task", {}), "prompt_format": prompt_format}}
    if config is not scn.config:
        changes["config"] = config
    scn = dataclasses.replace(scn, **changes)
    out = run_dir or Path(scn.run_dir)
    out.mkdir(parents=True, exist_ok=True)
    cells = len(scn.variants) * len(scn.seeds)
    console.print(f"simulate {scn.name}: {scn.nodes} nodes, {scn.rounds} rounds, {len(scn.variants)} variants x "
                  f"{len(scn.seeds)} seeds, mode {scn.mode}, transport {scn.transport}, run dir {out}", highlight=False)
    results = []
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TextColumn("{task.fields[info]}"), TimeElapsedColumn(), console=console) as progress:
        overall = progress.add_task("cells", total=cells, info="")
        for variant in scn.variants:
            for seed in scn.seeds:
                task = progress.add_task(f"{variant.name} seed {seed}", total=scn.rounds, info="")

                def on_round(_v: str, _s: int, rnd: int, total: int, reward: float | None, task: Any = task) -> None:
                    info = f"mean local reward {reward:.3f}" if reward is not None else ""
                    progress.update(task, completed=rnd, info=info)

                result = run_cell(scn, variant, seed, out, on_round,
                                  lambda message: progress.console.print(message, highlight=False))
                progress.update(task, completed=scn.rounds, info=f"cum reward {result['cum_reward']:.2f}")
                progress.advance(overall)
                results.append(result)
    for p in write_report(scn, results, out):
        console.print(f"wrote {p}", highlight=False)
    console.print((out / "summary.md").read_text(), highlight=False)
    return out
