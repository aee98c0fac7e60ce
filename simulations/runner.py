"""Run a scenario: N nodes in one process, over the in-memory transport with the network model or over real libp2p.

Contract:
- A scenario runs once per (variant, seed) "cell"; each cell writes `<run_dir>/<variant>/seed<k>/` with one node
  directory per node (its run dir), `metrics.csv` (one row per node per round) and, last, `result.json`. A cell
  with a result.json of the same fingerprint is complete and is skipped when the scenario runs again (resumable
  sweeps). An incomplete cell resumes mid-run from its last snapshot when `snapshots.resume_point` accepts it (sync
  and async cells over the memory transport snapshot every `checkpoint_rounds` rounds; the log says "resuming
  cell V/seedK from round R"); otherwise its directory is removed and the cell redone. A resumed cell's
  result.json has the same keys; its `wall_s` adds the sessions up. Once result.json is written, the cell's
  snapshots (progress.json, the nodes' checkpoints) are deleted.
- `CELL_RUNNERS[scn.mode]` runs a cell (names: `variants.SIM_MODES`): "sync" (lockstep rounds) and
  "async" (virtual clock) run SAPO nodes over `CELL_LOOPS[scn.transport]` (memory_cell.py: the network model;
  libp2p_cell.py: real hosts on loopback, sync only); "echo" runs an ECHO-2 learner and its workers
  (echo_cell.py); "attack" runs honest SAPO nodes beside the scenario's malicious ones (attack_cell.py).
- `[simulation] status_port = P` (> 0): node i serves its status API on 127.0.0.1:P+i for the whole cell (the
  URLs go to `log`).
- `[simulation] sampler = "shared-lora"`: one vLLM engine per cell serves every node's policy as a LoRA adapter
  (swarm_node/sampler/shared_lora.py); nodes train their adapters only. In sync mode on a GPU a round's sampling
  is one engine batch over all nodes (each node's draft on its own thread; results as if sampled alone); on CPU,
  where vLLM's LoRA ops make mixed-adapter batches slower than separate calls, nodes call it one after another.
- The cumulative reward of a node is the sum over its rounds of the mean reward per LOCAL completion; a cell's
  is the mean over nodes.
"""

from __future__ import annotations

import json
import shutil
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from simulations import variants
from simulations.attack_cell import attack_cell
from simulations.cells import (
    CellSamplers,
    LogFn,
    RoundFn,
    SimNode,
    cell_dir,
    cumulative_rewards,
    drop_totals,
    shared_engine,
    start_status_servers,
)
from simulations.echo_cell import echo_cell
from simulations.libp2p_cell import libp2p_cell
from simulations.memory_cell import memory_cell
from simulations.results import CSV_FIELDS, RESULT_FILE, cell_fingerprint, finish_cell, read_rows, write_csv
from simulations.scenario import Scenario, Variant
from simulations.snapshots import clear, resume_point
from swarm_node.status.stats import NodeStats
from swarm_node.variants import Registry

__all__ = ["CELL_LOOPS", "CELL_RUNNERS", "CSV_FIELDS", "RESULT_FILE", "cell_dir", "cell_fingerprint",
           "cumulative_rewards", "read_rows", "run_cell", "run_scenario", "write_csv"]

CellLoop = Callable[[Scenario, Variant, int, Path, list[NodeStats], CellSamplers, list[dict[str, Any]], RoundFn | None,
                     LogFn], list[SimNode]]
CELL_LOOPS: dict[str, CellLoop] = {"memory": memory_cell, "libp2p": libp2p_cell}  # keys: variants.SIM_TRANSPORTS

CellResult = tuple[list[dict[str, Any]], dict[str, Any]]  # metrics rows, the result (less its fingerprint)
CellRunner = Callable[[Scenario, Variant, int, Path, RoundFn | None, LogFn], CellResult]
CELL_RUNNERS: Registry[CellRunner] = Registry("simulation mode", variants.SIM_MODES)


def swarm_cell(scn: Scenario, variant: Variant, seed: int, root: Path, on_round: RoundFn | None,
               log: LogFn) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """SAPO nodes over the scenario's transport: metrics rows and the cell's result (less its fingerprint)."""
    started = time.monotonic()
    rows: list[dict[str, Any]] = []
    stats = [NodeStats() for _ in range(scn.nodes)]
    engine = shared_engine(scn, variant, root, log)
    servers: list[Any] = []
    try:
        servers = start_status_servers(scn, stats, log)
        nodes = CELL_LOOPS[scn.transport](scn, variant, seed, root, stats, CellSamplers(engine), rows, on_round, log)
        try:
            finals = [n.node.evaluate() for n in nodes] if scn.eval_problems else []
            evals = [e.greedy_acc for e in finals]
            drops = drop_totals(nodes)
        finally:
            for n in nodes:
                n.node.close()
    finally:
        for server in servers:
            server.stop()
        if engine is not None:
            engine.close()
    cum = cumulative_rewards(rows, scn.nodes)
    result = {"variant": variant.name, "seed": seed, "nodes": scn.nodes, "rounds": scn.rounds,
              "cum_reward_per_node": cum, "cum_reward": statistics.fmean(cum),
              "final_eval_acc_per_node": evals, "final_eval_acc": statistics.fmean(evals) if evals else None,
              "final_eval_per_task_per_node": [e.per_task for e in finals],
              # {dataset NUL question: 0/1} per node: paired intervals against another cell on the same questions
              "final_eval_outcomes_per_node": [e.by_question() for e in finals],
              "external_drops": drops, "wall_s": time.monotonic() - started}
    return rows, result


CELL_RUNNERS.add("sync", swarm_cell)
CELL_RUNNERS.add("async", swarm_cell)
CELL_RUNNERS.add("echo", echo_cell)
CELL_RUNNERS.add("attack", attack_cell)  # honest SAPO nodes and [[attacker]] nodes (attack_cell.py)


def finished_result(scn: Scenario, variant: Variant, seed: int, run_dir: Path) -> dict[str, Any] | None:
    """The result of a cell that completed for this very scenario (same fingerprint), else None; runs nothing."""
    done = cell_dir(run_dir, variant.name, seed) / RESULT_FILE
    if not done.exists():
        return None
    previous = json.loads(done.read_text())
    return previous if previous.get("fingerprint") == cell_fingerprint(scn, variant) else None


def run_cell(scn: Scenario, variant: Variant, seed: int, run_dir: Path,
             on_round: RoundFn | None = None, log: LogFn | None = None) -> dict[str, Any]:
    """Run one (variant, seed) cell, resume it from its last snapshot, or load its result if it completed before.
    `log` gets status URLs, resumes and warnings (default: dropped)."""
    say: LogFn = log or (lambda _m: None)
    root = cell_dir(run_dir, variant.name, seed)
    fingerprint = cell_fingerprint(scn, variant)
    prior_wall_s = 0.0
    if (previous := finished_result(scn, variant, seed, run_dir)) is not None:
        return previous
    if (root / RESULT_FILE).exists():
        # another scenario (or default model) ran here before: its result does not count
        say(f"{root}: result of a different scenario or model; running the cell again")
        shutil.rmtree(root)
    progress = resume_point(root, fingerprint, scn.nodes, say) if root.exists() else None
    if progress is not None:
        say(f"resuming cell {variant.name}/seed{seed} from round {progress.round}")
        prior_wall_s = progress.wall_s
    elif root.exists():
        shutil.rmtree(root)  # no usable snapshot: the cell restarts from scratch
    root.mkdir(parents=True, exist_ok=True)
    rows, result = CELL_RUNNERS[scn.mode](scn, variant, seed, root, on_round, say)
    result = finish_cell(root, rows, {**result, "wall_s": result["wall_s"] + prior_wall_s, "fingerprint": fingerprint})
    clear(root, scn.nodes)
    return result


def run_scenario(scn: Scenario, run_dir: Path, on_round: RoundFn | None = None,
                 on_cell: Callable[[dict[str, Any]], None] | None = None,
                 log: LogFn | None = None) -> list[dict[str, Any]]:
    results = []
    for variant in scn.variants:
        for seed in scn.seeds:
            result = run_cell(scn, variant, seed, run_dir, on_round, log)
            results.append(result)
            if on_cell is not None:
                on_cell(result)
    return results
