"""Scenario files for `swarm-node simulate`: TOML in, a validated `Scenario` out, or one-line `UserError`.

Layout (every key optional except what a run needs; unknown keys and impossible values are one-line errors):

    [simulation]  name, nodes, rounds, seeds, mode ("sync" lockstep rounds | "async" virtual clock | "echo": node 0
                  an ECHO-2 learner, the others its workers, a round one learner step; see simulations/echo_sim.py
                  | "attack": sync rounds with the [[attacker]] nodes malicious; simulations/attack_cell.py),
                  transport ("memory": in process, through the [network] model | "libp2p": a real libp2p host
                  per node on 127.0.0.1, sync mode only), eval_problems (greedy held-out eval per node at the end),
                  run_dir, status_port (0 = off; P: node i serves its status API on 127.0.0.1:P+i),
                  sampler ("per-node": each node builds the sampler its [config.sampler] names | "shared-lora": one
                  vLLM engine serves every node's policy as a LoRA adapter on the shared base model; needs
                  config.train.lora_rank > 0, the same rank, alpha and model for every node; not in mode "echo"),
                  checkpoint_rounds (K, default 10; 0 = off: every K rounds a sync/async cell over the memory
                  transport saves a snapshot it resumes from when run again; see simulations/snapshots.py. Not
                  part of the cell fingerprint: it changes no result)
    [network]     latency_ms (per link), uplink_mbps / downlink_mbps (per node, shared by all its streams; 0 means
                  unlimited), loss (probability a hop is lost), round_s (sync: how long a round lets messages
                  travel; async: virtual seconds of one step at speed 1). With transport "libp2p" only round_s
                  applies, as real seconds: the longest a round waits for the others' groups. Latency, bandwidth
                  and loss are then those of the real loopback interface, not modelled.
    [config]      node config tables applied to every node ([config.run], [config.share], ...: see config.py)
    [[variants]]  name + config: each variant is a separate swarm run (e.g. the SAPO I/J grid)
    [[node]]      per-node overrides: index, speed (compute factor), model (HF dir; "" = default),
                  join_round, leave_round (0 = stays), config (node config tables), device (a [devices] class: the
                  node's speed is multiplied by the class's, its run.memory_budget_mib is the class's memory_mib
                  unless its own config sets one)
    [devices]     device classes, [devices.NAME] speed, memory_mib (swarm_node/train/device_classes.py; the same
                  tables `swarm-node plan` reads). Every node sizes its steps to its budget by the estimate alone
                  (run.memory_guard is off: the nodes share one process)
    [[attacker]]  mode "attack" only: index, kind (simulations/byzantine.py ATTACKS): node `index` is a malicious
                  node of that kind, not trained (simulations/attack_cell.py); the other nodes are honest
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from simulations import variants
from simulations.network import LinkModel
from swarm_node.config import NodeConfig, build_config, read_toml
from swarm_node.errors import ConfigError, UserError
from swarm_node.train.device_classes import device_class, parse_device_classes

MODES = variants.SIM_MODES
TRANSPORTS = variants.SIM_TRANSPORTS
SIM_SAMPLERS = variants.SIM_SAMPLERS


@dataclass(frozen=True)
class NetworkSpec:
    """[network] in the file's units. These fields, not the link they build, go into a cell's fingerprint: a
    conversion that rounds differently must not orphan stored results."""

    latency_ms: float = 20.0
    uplink_mbps: float = 0.0  # 0: unlimited
    downlink_mbps: float = 0.0
    loss: float = 0.0
    round_s: float = 10.0

    def link(self) -> LinkModel:
        """Every node's link for the network model (seconds, bit/s)."""
        return LinkModel(self.latency_ms / 1000, self.uplink_mbps * 1e6, self.downlink_mbps * 1e6, self.loss)


@dataclass(frozen=True)
class NodeSpec:
    index: int
    speed: float = 1.0
    model: str = ""
    join_round: int = 0
    leave_round: int = 0  # 0: never leaves
    config: dict[str, Any] = field(default_factory=dict)
    device: str = ""  # a [devices] class ("": none)
    memory_mib: int = 0  # the class's memory: the node's run.memory_budget_mib (0: the default budget)


@dataclass(frozen=True)
class Variant:
    name: str
    config: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Scenario:
    name: str
    nodes: int
    rounds: int
    seeds: tuple[int, ...]
    mode: str
    transport: str
    eval_problems: int
    run_dir: str
    network: NetworkSpec
    config: dict[str, Any]
    variants: tuple[Variant, ...]
    node_specs: tuple[NodeSpec, ...]
    status_port: int = 0  # 0: off
    sampler: str = "per-node"  # SIM_SAMPLERS
    checkpoint_rounds: int = 10  # a resumable snapshot every K rounds (0: off); snapshots.py
    attackers: tuple[tuple[int, str], ...] = ()  # mode "attack": (node index, attack kind); byzantine.py

    def base_model(self, variant: Variant, index: int) -> str:
        """Node `index`'s starting model directory ("" = the embedded default)."""
        return self.node_spec(index).model or self.node_config(variant, index, 0, Path(".")).model.path

    def node_spec(self, index: int) -> NodeSpec:
        return next((s for s in self.node_specs if s.index == index), NodeSpec(index))

    def node_config(self, variant: Variant, index: int, seed: int, run_dir: Path) -> NodeConfig:
        """Defaults < [config] < variant config < [[node]] config < what the harness fixes (dirs, seeds)."""
        spec = self.node_spec(index)
        memory = {"run": {"memory_budget_mib": spec.memory_mib}} if spec.memory_mib else {}
        where = f" in scenario {self.name!r}"
        harness = {"run": {"seed": seed * 1000 + index, "run_dir": str(run_dir), "steps": self.rounds, "resume": False,
                           # the harness keeps per-round metrics, not checkpoints
                           "checkpoint_every": self.rounds + 1, "eval_problems": self.eval_problems,
                           # the nodes share this process: its memory is not one node's
                           "memory_guard": False},
                   "status": {"port": -1}}
        layers = (self.config, variant.config, memory, spec.config)
        return build_config([(copy.deepcopy(layer), where) for layer in layers] + [(harness, " (simulation harness)")])


_SECTIONS = {"simulation", "network", "config", "variants", "node", "attacker", "devices"}
_SIM_KEYS = {"name", "nodes", "rounds", "seeds", "mode", "transport", "eval_problems", "run_dir", "status_port",
             "sampler", "checkpoint_rounds"}
_NODE_KEYS = {"index", "speed", "model", "join_round", "leave_round", "config", "device"}


def check_transport(mode: str, transport: str) -> None:
    """A UserError unless `transport` is known and can run `mode` (libp2p has no virtual clock: sync only)."""
    if transport not in TRANSPORTS:
        raise UserError(f"simulation.transport must be one of {', '.join(TRANSPORTS)}, not {transport!r}")
    if transport == "libp2p" and mode != "sync":
        raise UserError(f"simulation.transport 'libp2p' runs mode 'sync' only (real hosts have no virtual clock), "
                        f"not {mode!r}")


def check_status_port(port: int, nodes: int, mode: str) -> None:
    if port != 0 and not 1 <= port <= 65536 - nodes:
        raise UserError(f"simulation.status_port must be 0 (off) or in [1, {65536 - nodes}] (node i uses port + i), "
                        f"got {port}")
    if port and mode == "echo":
        raise UserError("simulation.status_port is not available in mode 'echo'; set it to 0")


def _check_keys(data: dict[str, Any], known: set[str], where: str) -> None:
    for key in data:
        if key not in known:
            raise UserError(f"unknown key {key!r} in {where}; known: {', '.join(sorted(known))}")


def _typed(data: dict[str, Any], key: str, kind: type, default: Any, where: str) -> Any:
    value = data.get(key, default)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if isinstance(value, bool) and kind is not bool or not isinstance(value, kind):
        raise UserError(f"{where}.{key} must be {kind.__name__}, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise UserError(f"{where}.{key} must be finite, got {value!r}")
    return value


def _table(data: dict[str, Any], key: str) -> dict[str, Any]:
    value = data.get(key, {})
    if not isinstance(value, dict):
        raise UserError(f"[{key}] must be a table")
    return value


def parse_scenario(data: dict[str, Any], name: str = "scenario") -> Scenario:
    _check_keys(data, _SECTIONS, "scenario")
    sim = _table(data, "simulation")
    _check_keys(sim, _SIM_KEYS, "[simulation]")
    nodes = _typed(sim, "nodes", int, 2, "simulation")
    rounds = _typed(sim, "rounds", int, 50, "simulation")
    seeds = sim.get("seeds", [0])
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) and not isinstance(s, bool)
                                                           and s >= 0 for s in seeds):
        raise UserError(f"simulation.seeds must be a non-empty list of integers >= 0, got {seeds!r}")
    if len(set(seeds)) != len(seeds):
        raise UserError(f"simulation.seeds has duplicates: {seeds!r}")
    mode = _typed(sim, "mode", str, "sync", "simulation")
    transport = _typed(sim, "transport", str, "memory", "simulation")
    eval_problems = _typed(sim, "eval_problems", int, 100, "simulation")
    if not 1 <= nodes <= 64:
        raise UserError(f"simulation.nodes must be in [1, 64], got {nodes}")
    if rounds < 1:
        raise UserError(f"simulation.rounds must be >= 1, got {rounds}")
    if mode not in MODES:
        raise UserError(f"simulation.mode must be one of {', '.join(MODES)}, not {mode!r}")
    if mode == "echo" and nodes < 2:
        raise UserError("simulation.mode echo needs nodes >= 2: node 0 is the learner, the others its workers")
    check_transport(mode, transport)
    status_port = _typed(sim, "status_port", int, 0, "simulation")
    check_status_port(status_port, nodes, mode)
    if eval_problems < 0:
        raise UserError(f"simulation.eval_problems must be >= 0, got {eval_problems}")
    net = _table(data, "network")
    _check_keys(net, set(NetworkSpec.__dataclass_fields__), "[network]")
    network = NetworkSpec(**{k: _typed(net, k, float, getattr(NetworkSpec(), k), "network") for k in net})
    for k in ("latency_ms", "uplink_mbps", "downlink_mbps"):
        if getattr(network, k) < 0:
            raise UserError(f"network.{k} must be >= 0, got {getattr(network, k)}")
    if not 0 <= network.loss < 1:
        raise UserError(f"network.loss must be in [0, 1), got {network.loss}")
    if network.round_s <= 0:
        raise UserError(f"network.round_s must be > 0, got {network.round_s}")
    config = _table(data, "config")
    variants_raw = data.get("variants", [{"name": "default"}])
    if isinstance(variants_raw, list) and not variants_raw:
        raise UserError("[[variants]] must be a non-empty array of tables")
    variants = []
    for i, v in enumerate(_array_of_tables(variants_raw, "variants", {"name", "config"},
                                           "a non-empty array of tables")):
        vname = _typed(v, "name", str, f"v{i}", f"variants[{i}]")
        if not vname or any(ch in vname for ch in "\\\0") or vname in (".", ".."):
            raise UserError(f"variants[{i}].name {vname!r} is not usable as a directory name")
        variants.append(Variant(vname, _typed(v, "config", dict, {}, f"variants[{i}]")))
    if len({v.name for v in variants}) != len(variants):
        raise UserError("variant names must be distinct")
    specs = []
    classes = parse_device_classes(data.get("devices", {}), "devices")
    nodes_raw = data.get("node", [])
    if not isinstance(nodes_raw, list):
        raise UserError("[[node]] must be an array of tables")
    for i, n in enumerate(nodes_raw):
        if not isinstance(n, dict):
            raise UserError(f"node[{i}] must be a table")
        _check_keys(n, _NODE_KEYS, f"node[{i}]")
        where = f"node[{i}]"
        spec = NodeSpec(_typed(n, "index", int, -1, where), _typed(n, "speed", float, 1.0, where),
                        _typed(n, "model", str, "", where), _typed(n, "join_round", int, 0, where),
                        _typed(n, "leave_round", int, 0, where), _typed(n, "config", dict, {}, where))
        if not 0 <= spec.index < nodes:
            raise UserError(f"{where}.index must be in [0, {nodes}), got {spec.index}")
        if spec.speed <= 0:
            raise UserError(f"{where}.speed must be > 0, got {spec.speed}")
        if "device" in n:
            cls = device_class(classes, _typed(n, "device", str, "", where), f"{where}.device")
            spec = dataclasses.replace(spec, speed=spec.speed * cls.speed, device=cls.name, memory_mib=cls.memory_mib)
        if spec.join_round < 0 or spec.leave_round < 0 or (spec.leave_round and spec.leave_round <= spec.join_round):
            raise UserError(f"{where}: need 0 <= join_round < leave_round (or leave_round 0), got "
                            f"{spec.join_round}, {spec.leave_round}")
        if spec.model and not Path(spec.model).is_dir():
            raise UserError(f"{where}.model {spec.model!r} is not a directory")
        specs.append(spec)
    if len({s.index for s in specs}) != len(specs):
        raise UserError("[[node]] indices must be distinct")
    sampler = _typed(sim, "sampler", str, "per-node", "simulation")
    if sampler not in SIM_SAMPLERS:
        raise UserError(f"simulation.sampler must be one of {', '.join(SIM_SAMPLERS)}, not {sampler!r}")
    checkpoint_rounds = _typed(sim, "checkpoint_rounds", int, 10, "simulation")
    if checkpoint_rounds < 0:
        raise UserError(f"simulation.checkpoint_rounds must be >= 0 (0 = off), got {checkpoint_rounds}")
    scenario = Scenario(_typed(sim, "name", str, name, "simulation"), nodes, rounds, tuple(seeds), mode, transport,
                        eval_problems, _typed(sim, "run_dir", str, f"runs/sim-{name}", "simulation"), network,
                        config, tuple(variants), tuple(specs), status_port, sampler, checkpoint_rounds,
                        parse_attackers(data.get("attacker", []), nodes, mode))
    # Build every node's config once now, so a typo anywhere fails before anything runs.
    for variant in variants:
        for index in range(nodes):
            try:
                scenario.node_config(variant, index, seeds[0], Path("."))
            except ConfigError as exc:
                raise UserError(str(exc)) from exc
    if sampler == "shared-lora":
        check_shared_lora(scenario)
    return scenario


def _array_of_tables(raw: Any, name: str, keys: set[str], what: str = "an array of tables") -> list[dict[str, Any]]:
    """A TOML [[name]] array: each entry a table with only `keys`; one-line errors naming the entry."""
    if not isinstance(raw, list):
        raise UserError(f"[[{name}]] must be {what}")
    for i, table in enumerate(raw):
        if not isinstance(table, dict):
            raise UserError(f"{name}[{i}] must be a table")
        _check_keys(table, keys, f"{name}[{i}]")
    return raw


def parse_attackers(raw: Any, nodes: int, mode: str) -> tuple[tuple[int, str], ...]:
    """[[attacker]] tables as (index, kind), sorted; mode "attack" only, with at least one honest node."""
    out = []
    for i, a in enumerate(_array_of_tables(raw, "attacker", {"index", "kind"})):
        index, kind = _typed(a, "index", int, -1, f"attacker[{i}]"), _typed(a, "kind", str, "", f"attacker[{i}]")
        if not 0 <= index < nodes:
            raise UserError(f"attacker[{i}].index must be in [0, {nodes}), got {index}")
        if kind not in variants.ATTACKS:
            raise UserError(f"attacker[{i}].kind must be one of {', '.join(variants.ATTACKS)}, not {kind!r}")
        out.append((index, kind))
    if len({i for i, _ in out}) != len(out):
        raise UserError("[[attacker]] indices must be distinct")
    if out and mode != "attack":
        raise UserError(f"[[attacker]] needs simulation.mode 'attack', not {mode!r}")
    if mode == "attack" and len(out) >= nodes:
        raise UserError("simulation.mode 'attack' needs at least one honest node")
    return tuple(sorted(out))


def check_shared_lora(scn: Scenario) -> None:
    """One engine serves one base model and one adapter shape: every node must agree on both."""
    if scn.mode == "echo":
        raise UserError("simulation.sampler 'shared-lora' is not available in mode 'echo' (ECHO-2 trains full weights)")
    for variant in scn.variants:
        shapes = {(c.train.lora_rank, c.train.lora_alpha)
                  for c in (scn.node_config(variant, i, scn.seeds[0], Path(".")) for i in range(scn.nodes))}
        if len(shapes) != 1 or next(iter(shapes))[0] < 1:
            raise UserError(f"simulation.sampler 'shared-lora' needs config.train.lora_rank >= 1 and the same "
                            f"lora_rank and lora_alpha on every node (variant {variant.name!r}: {sorted(shapes)})")
        if len({scn.base_model(variant, i) for i in range(scn.nodes)}) != 1:
            raise UserError(f"simulation.sampler 'shared-lora' serves one base model: every node needs the same "
                            f"model (variant {variant.name!r})")


def load_scenario(path: Path) -> Scenario:
    return parse_scenario(read_toml(path, "scenario file"), path.stem)


def with_overrides(scn: Scenario, *, rounds: int | None = None, nodes: int | None = None,
                   eval_problems: int | None = None, seeds: Sequence[int] | None = None) -> Scenario:
    """`scn` with what a bench's command line gave; None, 0 or no seeds keeps the scenario's own value (argparse
    leaves an option it was not given at None)."""
    changes: dict[str, Any] = {k: v for k, v in (("rounds", rounds), ("nodes", nodes),
                                                 ("eval_problems", eval_problems)) if v}
    if seeds:
        changes["seeds"] = tuple(seeds)
    return dataclasses.replace(scn, **changes)
