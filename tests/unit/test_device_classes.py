"""Device classes (speed, memory) in simulation scenarios and in ECHO-2's plan: the same [devices] tables."""

from __future__ import annotations

from pathlib import Path

import pytest

from simulations.scenario import parse_scenario
from swarm_node.echo.plan_file import input_from_mapping
from swarm_node.echo.planning import plan
from swarm_node.errors import UserError
from swarm_node.train.device_classes import DeviceClass, device_class, parse_device_classes

DEVICES = {"laptop": {"speed": 0.5, "memory_mib": 3000}, "gpu24": {"speed": 8, "memory_mib": 24576}}


def test_parse_device_classes() -> None:
    classes = parse_device_classes(DEVICES)
    assert classes == {"laptop": DeviceClass("laptop", 0.5, 3000), "gpu24": DeviceClass("gpu24", 8.0, 24576)}
    assert device_class(classes, "gpu24", "node[0].device") is classes["gpu24"]


@pytest.mark.parametrize(("table", "message"), [
    ({"x": {"speed": 1}}, "devices.x.memory_mib is required"),
    ({"x": {"speed": 0, "memory_mib": 1}}, "devices.x.speed must be a number > 0, got 0"),
    ({"x": {"speed": 1, "memory_mib": 1.5}}, "devices.x.memory_mib must be an integer > 0, got 1.5"),
    ({"x": {"speed": 1, "memory_mib": 1, "vram": 2}}, "unknown key devices.x.vram; known: memory_mib, speed"),
    ({"x": 3}, "[devices.x] must be a table with speed and memory_mib"),
])
def test_bad_device_classes_are_one_line(table: dict, message: str) -> None:
    with pytest.raises(UserError) as err:
        parse_device_classes(table)
    assert str(err.value) == message


def test_unknown_class_names_the_known_ones() -> None:
    with pytest.raises(UserError) as err:
        device_class(parse_device_classes(DEVICES), "tpu", "node[0].device")
    assert str(err.value) == ("node[0].device names device class 'tpu', which [devices] does not define "
                              "(known: gpu24, laptop)")


def _scenario(nodes: list[dict]) -> dict:
    return {"simulation": {"nodes": 3, "rounds": 2}, "devices": DEVICES, "node": nodes}


def test_scenario_nodes_take_their_class_speed_and_memory() -> None:
    scn = parse_scenario(_scenario([
        {"index": 0, "device": "gpu24"},
        {"index": 1, "device": "laptop", "speed": 2.0},  # the node's own factor times the class's
        {"index": 2, "device": "laptop", "config": {"run": {"memory_budget_mib": 5000}}},
    ]))
    specs = [scn.node_spec(i) for i in range(3)]
    assert [(s.speed, s.device, s.memory_mib) for s in specs] == [(8.0, "gpu24", 24576), (1.0, "laptop", 3000),
                                                                  (0.5, "laptop", 3000)]
    configs = [scn.node_config(scn.variants[0], i, 0, Path(".")) for i in range(3)]
    assert [c.run.memory_budget_mib for c in configs] == [24576, 3000, 5000]  # a node's own config wins
    assert [c.run.memory_guard for c in configs] == [False, False, False]  # one process for all nodes


def test_scenario_without_classes_is_unchanged() -> None:
    scn = parse_scenario({"simulation": {"nodes": 2, "rounds": 2}, "node": [{"index": 1, "speed": 3.0}]})
    assert (scn.node_spec(1).speed, scn.node_spec(1).device, scn.node_spec(1).memory_mib) == (3.0, "", 0)
    assert scn.node_config(scn.variants[0], 1, 0, Path(".")).run.memory_budget_mib == 0


def test_scenario_unknown_class_is_one_line() -> None:
    with pytest.raises(UserError, match=r"^node\[0\].device names device class 'tpu'"):
        parse_scenario(_scenario([{"index": 0, "device": "tpu"}]))


PLAN = {
    "learner": {"step_s": 10.0, "rollouts_per_step": 32.0, "delta_mb": 1.0, "throughput_per_speed": 1.0,
                "worker_memory_mib": 4096},
    "network": {"bandwidth_mb_s": 100.0},
    "devices": DEVICES,
    "workers": [{"name": "lap", "device": "laptop", "cost_per_hour": 0.0, "count": 2},
                {"name": "g", "device": "gpu24", "cost_per_hour": 1.0},
                {"name": "fixed", "throughput": 2.0, "cost_per_hour": 0.1, "device": "gpu24"}],
}


def test_plan_takes_throughput_from_the_class_and_excludes_short_memory() -> None:
    inp = input_from_mapping(PLAN)
    assert [(w.name, w.throughput_rollouts_s, w.device, w.memory_mib) for w in inp.workers] == [
        ("lap#1", 0.5, "laptop", 3000), ("lap#2", 0.5, "laptop", 3000), ("g", 8.0, "gpu24", 24576),
        ("fixed", 2.0, "gpu24", 24576)]
    p = plan(inp)
    assert p.excluded == (("lap#1", "its device class 'laptop' has 3000 MiB, a worker needs 4096 MiB"),
                          ("lap#2", "its device class 'laptop' has 3000 MiB, a worker needs 4096 MiB"))
    # 32 rollouts per 10 s step: 3.2/s; "fixed" (2/s, $0.1) alone is short, "g" (8/s, $1) alone is enough.
    assert p.feasible and [w.name for w in p.chosen] == ["g"]


def test_plan_class_throughput_needs_the_speed_unit() -> None:
    data = {**PLAN, "learner": {k: v for k, v in PLAN["learner"].items() if k != "throughput_per_speed"}}
    with pytest.raises(UserError) as err:
        input_from_mapping(data)
    assert str(err.value) == ("learner.throughput_per_speed is required (worker 'lap' takes its throughput from "
                              "device class 'laptop')")
