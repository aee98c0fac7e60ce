"""The ECHO-2 cell (mode "echo"): node 0 is the learner, nodes 1..N-1 its workers, a round one learner step.

Runs `simulations.echo_sim` on a virtual clock with the scenario's network and node speeds; one metrics row per
learner step; the result adds the learner's summary (`learner_step_s`, `learner_utilization`, ...).
No mid-run snapshots (simulations/snapshots.py): the learner's buffer, the workers' followed policies and the
rollouts and policy deltas in flight on the virtual clock are state outside any node checkpoint, so an echo cell
resumes only as a whole (an interrupted one is redone).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from simulations.cells import LogFn, RoundFn, cumulative_rewards
from simulations.scenario import Scenario, Variant


def echo_cell(scn: Scenario, variant: Variant, seed: int, root: Path, on_round: RoundFn | None,
              log: LogFn) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """ECHO-2 mode: node 0 is the learner, nodes 1..N-1 its workers; a round is one learner step."""
    from simulations.echo_sim import EchoSimConfig, run_echo

    started = time.monotonic()
    cfg = scn.node_config(variant, 0, seed, root)
    merged: dict[str, Any] = {}
    for layer in (scn.config, variant.config):
        merged.update(_dotted(layer))
    for fixed in ("run.prompts_per_step", "run.group_size", "run.seed", "run.run_dir", "run.steps"):
        merged.pop(fixed, None)
    net = scn.network
    echo_cfg = EchoSimConfig(
        steps=scn.rounds, workers=scn.nodes - 1, worker_speeds=[scn.node_spec(i).speed for i in range(1, scn.nodes)],
        max_staleness=cfg.train.max_staleness, prompts_per_step=cfg.run.prompts_per_step,
        group_size=cfg.run.group_size, seed=seed, model_path=scn.node_spec(0).model, encoding=cfg.echo.encoding,
        bandwidth_mb_s=(net.uplink_mbps / 8) or 1e6, latency_s=net.link().latency_s,
        chunk_bytes=cfg.echo.chunk_bytes, schedule=cfg.echo.schedule, overrides=merged)
    rows: list[dict[str, Any]] = []

    def on_step(m: dict[str, Any]) -> None:
        rows.append({"variant": variant.name, "seed": seed, "node": 0, "round": m["step"], "time_s": m["time_s"],
                     "reward_mean": m.get("reward_mean"), "accuracy": m.get("accuracy"),
                     "groups_used": m.get("groups_used"), "loss": m.get("loss"), "step_s": m.get("step_s")})
        if on_round is not None:
            on_round(variant.name, seed, m["step"], scn.rounds, m.get("reward_mean"))

    sim = run_echo(echo_cfg, root, on_step)
    cum = cumulative_rewards(rows, 1)
    result = {"variant": variant.name, "seed": seed, "nodes": scn.nodes, "rounds": scn.rounds,
              "cum_reward_per_node": cum, "cum_reward": cum[0], "final_eval_acc_per_node": [],
              "final_eval_acc": None, "external_drops": sim.dropped, "wall_s": time.monotonic() - started,
              "max_staleness": echo_cfg.max_staleness, **{f"learner_{k}": v for k, v in sim.summary().items()
                                                          if k != "dropped"}}
    return rows, result


def _dotted(table: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in table.items():
        if isinstance(value, dict) and key != "options":
            out.update(_dotted(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out
