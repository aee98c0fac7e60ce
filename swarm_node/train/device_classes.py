"""Device classes: named hardware profiles (relative speed, memory) shared by simulation scenarios and ECHO-2's plan.

Contract (pure: no I/O, no torch): a `[devices]` table maps a class name to `{speed = S, memory_mib = M}`: S is a
compute factor against a speed-1 node (> 0; a scenario divides a node's step time by it, a plan multiplies
`learner.throughput_per_speed` by it), M the memory a node of the class has for one step (a scenario node's
`run.memory_budget_mib`; a plan excludes a worker whose class has less than `learner.worker_memory_mib`).
`parse_device_classes(table, where)` returns name -> `DeviceClass`; `device_class(classes, name, where)` looks one up.
Unknown keys, wrong types, missing keys and unknown names are one UserError line naming the key.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from swarm_node.errors import UserError


@dataclass(frozen=True)
class DeviceClass:
    name: str
    speed: float  # compute factor against a speed-1 node
    memory_mib: int  # memory a node of this class has for one step


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise UserError(f"{where} must be a number > 0, got {value!r}")
    return float(value)


def parse_device_classes(table: Any, where: str = "devices") -> dict[str, DeviceClass]:
    if not isinstance(table, Mapping):
        raise UserError(f"[{where}] must be a table of device classes ([{where}.NAME] speed, memory_mib)")
    classes: dict[str, DeviceClass] = {}
    for name, entry in table.items():
        at = f"{where}.{name}"
        if not isinstance(entry, Mapping):
            raise UserError(f"[{at}] must be a table with speed and memory_mib")
        unknown = sorted(set(entry) - {"speed", "memory_mib"})
        if unknown:
            raise UserError(f"unknown key {at}.{unknown[0]}; known: memory_mib, speed")
        for key in ("speed", "memory_mib"):
            if key not in entry:
                raise UserError(f"{at}.{key} is required")
        memory = entry["memory_mib"]
        if isinstance(memory, bool) or not isinstance(memory, int) or memory <= 0:
            raise UserError(f"{at}.memory_mib must be an integer > 0, got {memory!r}")
        classes[name] = DeviceClass(name, _number(entry["speed"], f"{at}.speed"), memory)
    return classes


def device_class(classes: Mapping[str, DeviceClass], name: str, where: str) -> DeviceClass:
    if name not in classes:
        known = ", ".join(sorted(classes)) or "none defined"
        raise UserError(f"{where} names device class {name!r}, which [devices] does not define (known: {known})")
    return classes[name]
