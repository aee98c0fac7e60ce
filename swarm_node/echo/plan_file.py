"""Plan inputs from outside: a plan file's tables (`input_from_mapping`) and a run's metrics (`measure_run`).

Contract: `input_from_mapping(data)` builds a PlanInput from [learner], [network] and [[workers]] tables (keys
and units in docs/PLANNING.md; `count = n` expands a worker into n named copies, `tokens_per_s` converts through
learner.tokens_per_rollout; `device = "NAME"` takes a [devices] class (train/device_classes.py): the worker's
throughput defaults to the class's speed times learner.throughput_per_speed, and its memory is checked against
learner.worker_memory_mib); unknown sections or keys, wrong types and missing required keys raise one UserError
line. `measure_run(records)` takes medians over the trained steps of a node's metrics.jsonl records.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from protocol.relay import DEFAULT_SCHEDULE
from swarm_node.echo.plan_model import MB, PlanInput, WorkerSpec, check_int_at_least, check_non_negative, check_positive
from swarm_node.errors import UserError
from swarm_node.train.device_classes import device_class, parse_device_classes

_LEARNER_KEYS = {"step_s": float, "rollouts_per_step": float, "delta_mb": float, "kappa": int,
                 "max_staleness": int, "cost_per_hour": float, "tokens_per_rollout": float, "rollout_kb": float,
                 "throughput_per_speed": float, "worker_memory_mib": float}
_NETWORK_KEYS = {"bandwidth_mb_s": float, "chunk_mb": float, "schedule": str, "hop_latency_s": float}
_WORKER_KEYS = {"name": str, "throughput": float, "tokens_per_s": float, "cost_per_hour": float,
                "bandwidth_mb_s": float, "count": int, "device": str}
_SECTIONS = {"learner": _LEARNER_KEYS, "network": _NETWORK_KEYS}
DEFAULT_CHUNK_MB = 1.0


def _typed(value: Any, kind: type, where: str) -> Any:
    if kind is float and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if kind is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if kind is str and isinstance(value, str):
        return value
    names = {float: "a number", int: "an integer", str: "a string"}
    raise UserError(f"{where} must be {names[kind]}, got {value!r}")


def _table(data: Any, keys: Mapping[str, type], where: str) -> dict[str, Any]:
    if not isinstance(data, Mapping):
        raise UserError(f"{where} must be a table")
    out = {}
    for key, value in data.items():
        if key not in keys:
            raise UserError(f"unknown key {where}.{key}; known: {', '.join(sorted(keys))}")
        out[key] = _typed(value, keys[key], f"{where}.{key}")
    return out


def _required(table: Mapping[str, Any], key: str, where: str, hint: str) -> Any:
    if key not in table:
        raise UserError(f"{where}.{key} is required ({hint})")
    return table[key]


def _mb_to_bytes(what: str, mb: float) -> int:
    check_positive(what, mb)
    return max(1, round(mb * MB))


def _kb_to_bytes(kb: float) -> int:
    check_non_negative("learner.rollout_kb", kb)
    return round(kb * 1000)


def input_from_mapping(data: Mapping[str, Any], source: str = "the plan file") -> PlanInput:
    """A PlanInput from a plan file's tables ([learner], [network], [[workers]]); see docs/PLANNING.md.
    Unknown sections or keys, wrong types and missing required keys are one UserError line."""
    for section in data:
        if section not in (*_SECTIONS, "workers", "devices"):
            raise UserError(f"unknown section [{section}] in {source}; known: devices, learner, network, workers")
    learner = _table(data.get("learner", {}), _LEARNER_KEYS, "learner")
    network = _table(data.get("network", {}), _NETWORK_KEYS, "network")
    raw_workers = data.get("workers", [])
    if not isinstance(raw_workers, list):
        raise UserError("workers must be an array of tables ([[workers]])")
    tokens_per_rollout = learner.get("tokens_per_rollout")
    if tokens_per_rollout is not None:
        check_positive("learner.tokens_per_rollout", tokens_per_rollout)
    workers: list[WorkerSpec] = []
    classes = parse_device_classes(data.get("devices", {}), "devices")
    for i, raw in enumerate(raw_workers):
        w = _table(raw, _WORKER_KEYS, f"workers[{i}]")
        name = _required(w, "name", f"workers[{i}]", "each worker needs a name")
        cls = device_class(classes, w["device"], f"worker {name!r}") if "device" in w else None
        if cls is not None and "throughput" not in w and "tokens_per_s" not in w:
            per_speed = _required(learner, "throughput_per_speed", "learner",
                                  f"worker {name!r} takes its throughput from device class {cls.name!r}")
            check_positive("learner.throughput_per_speed", per_speed)
            w["throughput"] = cls.speed * per_speed
        if ("throughput" in w) == ("tokens_per_s" in w):
            raise UserError(f"worker {name!r}: give exactly one of throughput (rollouts/s) or tokens_per_s")
        if "tokens_per_s" in w:
            if tokens_per_rollout is None:
                raise UserError(f"worker {name!r}: tokens_per_s needs learner.tokens_per_rollout to convert")
            throughput = w["tokens_per_s"] / tokens_per_rollout
        else:
            throughput = w["throughput"]
        cost = _required(w, "cost_per_hour", f"worker {name!r}", "dollars per hour; 0 for a free worker")
        count = w.get("count", 1)
        check_int_at_least(f"worker {name!r}: count", count, 1)
        names = [name] if count == 1 else [f"{name}#{j}" for j in range(1, count + 1)]
        workers.extend(WorkerSpec(n, throughput, cost, w.get("bandwidth_mb_s"), cls.name if cls else "",
                                  cls.memory_mib if cls else None) for n in names)
    hint = "in the plan file or as a flag"
    return PlanInput(
        learner_step_s=_required(learner, "step_s", "learner", f"{hint}, or --from-run RUN_DIR"),
        rollouts_per_step=_required(learner, "rollouts_per_step", "learner", f"{hint}, or --from-run RUN_DIR"),
        delta_bytes=_mb_to_bytes("learner.delta_mb", _required(learner, "delta_mb", "learner", hint)),
        bandwidth_mb_s=_required(network, "bandwidth_mb_s", "network", hint),
        chunk_bytes=_mb_to_bytes("network.chunk_mb", network.get("chunk_mb", DEFAULT_CHUNK_MB)),
        workers=tuple(workers),
        kappa=learner.get("kappa", 1),
        schedule=network.get("schedule", DEFAULT_SCHEDULE),
        rollout_bytes=_kb_to_bytes(learner.get("rollout_kb", 0.0)),
        hop_latency_s=network.get("hop_latency_s", 0.0),
        max_staleness=learner.get("max_staleness"),
        learner_cost_per_hour=learner.get("cost_per_hour", 0.0),
        worker_memory_mib=learner.get("worker_memory_mib"),
    )


@dataclass(frozen=True)
class RunMeasurement:
    """What a node's metrics.jsonl says about its learner: medians over the trained steps."""

    steps: int
    train_s: float  # median seconds of training per step (the learner's busy time T)
    rollouts_per_step: float  # median groups per step (the unit is a group of G completions)
    gen_rollouts_s: float | None  # median groups/s of this node's own generation (None: it did not generate)


def measure_run(records: Iterable[Mapping[str, Any]]) -> RunMeasurement:
    """Medians over the steps that trained (skipped steps carry no train_s); UserError if there are none."""
    trained = [m for m in records if isinstance(m.get("train_s"), int | float) and m["train_s"] > 0
               and isinstance(m.get("groups_total"), int) and m["groups_total"] > 0]
    if not trained:
        raise UserError("the run's metrics hold no trained step (need train_s and groups_total)")
    gen = [m["groups_total"] / m["gen_s"] for m in trained if isinstance(m.get("gen_s"), int | float)
           and m["gen_s"] > 0]
    return RunMeasurement(steps=len(trained), train_s=statistics.median(m["train_s"] for m in trained),
                          rollouts_per_step=statistics.median(m["groups_total"] for m in trained),
                          gen_rollouts_s=statistics.median(gen) if gen else None)
