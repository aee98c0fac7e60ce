"""A simulation cell's parts shared by its transports: the nodes, their samplers, rows, the status servers.

Contract: `build_node(s)` assembles each scenario node as a SAPO peer (node/assembly.py, as `join` does) over its
(not yet started) transport (`resume`: each from the newest checkpoint in its run dir); `CellSamplers` is
each node's sampler or one shared LoRA engine (`shared_engine`) that batches a round's drafts; `row` is a node's
metrics.csv row for one step; `cumulative_rewards` sums per-node rewards; `start_status_servers` serves node i's
status on STATUS_HOST:P+i.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from simulations.scenario import Scenario, Variant
from swarm_node.errors import UserError
from swarm_node.model.default_model import ensure_default_model, load_tokenizer
from swarm_node.node.assembly import Assembly, Sharing, assemble
from swarm_node.node.build import sampler_settings
from swarm_node.node.core import Node, NodeEvents
from swarm_node.sampler.base import Sampler
from swarm_node.sharing.exchange import TransportExchange
from swarm_node.sharing.pool import ExperiencePool
from swarm_node.status.stats import NodeStats
from swarm_node.transport.base import Transport
from swarm_node.types import Draft, SkippedStep

if TYPE_CHECKING:
    from swarm_node.sampler.shared_lora import SharedLoRAEngine

RoundFn = Callable[[str, int, int, int, float | None], None]  # variant, seed, round done, rounds, mean reward
LogFn = Callable[[str], None]
STATUS_HOST = "127.0.0.1"


@dataclass
class SimNode:
    index: int
    assembly: Assembly
    transport: Transport
    exchange: TransportExchange
    join: float
    leave: float
    up: bool = False

    @property
    def node(self) -> Node:
        return self.assembly.node


def peer_name(index: int) -> str:
    return f"node{index}"  # policy ids must be alphanumeric (WIRE.md)


def cell_dir(run_dir: Path, variant: str, seed: int) -> Path:
    return run_dir / variant.replace("/", "-") / f"seed{seed}"


TransportFor = Callable[[int], Transport]  # node index -> its (not yet started) transport


class CellSamplers:
    """What the nodes of a cell sample with: each its own sampler (built by the node), or one shared LoRA engine
    that runs the generate calls of a round's nodes as one batch."""

    def __init__(self, engine: SharedLoRAEngine | None = None) -> None:
        self.engine = engine

    def for_node(self, index: int) -> Sampler | None:
        return self.engine.sampler(peer_name(index)) if self.engine is not None else None

    def sample_all(self, nodes: list[SimNode]) -> dict[int, Draft | SkippedStep]:
        """Every node's `sample_and_share`, by node index."""
        if self.engine is None or not self.engine.batches_policies or len(nodes) < 2:
            return {n.index: n.assembly.sample_and_share() for n in nodes}
        with self.engine.gather(len(nodes)) as leave, ThreadPoolExecutor(len(nodes), "sim-sample") as pool:
            def one(n: SimNode) -> Draft | SkippedStep:
                try:
                    return n.assembly.sample_and_share()
                finally:
                    leave()

            futures = {n.index: pool.submit(one, n) for n in nodes}
            return {i: f.result() for i, f in futures.items()}


def build_node(scn: Scenario, variant: Variant, seed: int, root: Path, i: int, stats: NodeStats,
               transport: Transport, samplers: CellSamplers, resume: bool = False, keep_checkpoints: int | None = None,
               pool: type[ExperiencePool] = ExperiencePool,
               exchange: type[TransportExchange] = TransportExchange) -> SimNode:
    """Scenario node i as a SAPO peer over `transport` (the assembly of `join`: its exchange guarded as there);
    `resume`: from the newest checkpoint in its run dir (a resumed cell, snapshots.py)."""
    spec = scn.node_spec(i)
    cfg = scn.node_config(variant, i, seed, root / peer_name(i))
    cfg = cfg.with_values({"run.resume": resume, "run.keep_checkpoints": keep_checkpoints or cfg.run.keep_checkpoints})
    assembly = assemble(cfg, Sharing.SAPO, transport=transport, stats=stats,
                        events=NodeEvents(log=lambda _m: None), model_dir=Path(spec.model) if spec.model else None,
                        sampler=samplers.for_node(i), pool=pool, exchange=exchange)
    stats.update(peer_id=transport.peer_id, total_steps=scn.rounds, phase="training")
    assert assembly.exchange is not None
    leave = float(spec.leave_round) if spec.leave_round else float("inf")
    return SimNode(i, assembly, transport, assembly.exchange, float(spec.join_round), leave)


def build_nodes(scn: Scenario, variant: Variant, seed: int, root: Path, stats: list[NodeStats],
                transport_for: TransportFor, samplers: CellSamplers,
                exchange: type[TransportExchange] = TransportExchange, resume: bool = False,
                keep_checkpoints: int | None = None) -> list[SimNode]:
    """Every scenario node (`build_node`), node i over `transport_for(i)`."""
    return [build_node(scn, variant, seed, root, i, stats[i], transport_for(i), samplers, resume, keep_checkpoints,
                       exchange=exchange) for i in range(scn.nodes)]


def row(variant: str, seed: int, n: SimNode, rnd: int, t: float, m: dict[str, Any]) -> dict[str, Any]:
    dropped = m.get("external_dropped") or {}
    return {"variant": variant, "seed": seed, "node": n.index, "round": rnd, "time_s": round(t, 6),
            "reward_mean": m.get("reward_mean"), "accuracy": m.get("accuracy"), "groups_used": m.get("groups_used"),
            "external_used": m.get("external_used"), "external_reward_mean": m.get("external_reward_mean"),
            "pool_size": m.get("pool_size"), "received": m.get("received"), "dropped": sum(dropped.values()),
            "loss": m.get("loss"), "step_s": m.get("step_s"), "gen_tokens": m.get("gen_tokens"),
            "groups_total": m.get("groups_total"), "external_signal": m.get("external_signal")}


def train_round(active: list[SimNode], drafts: dict[int, Any], variant: str, seed: int, rnd: int, t: float,
                rows: list[dict[str, Any]]) -> float | None:
    """Every active node trains on its draft (in index order); their metrics rows are appended to `rows`. The
    round's mean local reward over the nodes that have one (None: no node has)."""
    rewards = []
    for n in active:
        metrics = n.assembly.mix_and_train(drafts[n.index])
        rows.append(row(variant, seed, n, rnd, t, metrics))
        if metrics.get("reward_mean") is not None:
            rewards.append(metrics["reward_mean"])
    return statistics.fmean(rewards) if rewards else None


def drop_totals(nodes: list[SimNode]) -> dict[str, int]:
    """External groups the nodes dropped, summed per reason over senders and nodes."""
    drops: dict[str, int] = {}
    for n in nodes:
        for (_sender, reason), count in n.assembly.peer_drops.items():
            drops[reason] = drops.get(reason, 0) + count
    return drops


def cumulative_rewards(rows: list[dict[str, Any]], nodes: int) -> list[float]:
    """Per node: sum over its rounds of the mean reward per local completion."""
    totals = [0.0] * nodes
    for r in rows:
        if r["reward_mean"] is not None:
            totals[int(r["node"])] += float(r["reward_mean"])
    return totals



def shared_engine(scn: Scenario, variant: Variant, root: Path, log: LogFn) -> SharedLoRAEngine | None:
    """The cell's shared LoRA engine when the scenario asks for one (scenario.check_shared_lora held)."""
    if scn.sampler != "shared-lora":
        return None
    try:  # vLLM only when asked for
        from swarm_node.sampler.shared_lora import SharedLoRAEngine
    except (ImportError, RuntimeError, OSError) as exc:
        raise UserError(f"simulation.sampler 'shared-lora' needs vLLM, which does not import: {exc}") from exc
    cfg = scn.node_config(variant, 0, 0, root)
    model = scn.base_model(variant, 0)
    model_dir = Path(model) if model else ensure_default_model(recipe=cfg.model.recipe)
    engine = SharedLoRAEngine(model_dir, load_tokenizer(model_dir), sampler_settings(cfg.sampler),
                              scn.nodes, cfg.train.lora_rank, cfg.train.lora_alpha, root / "adapters")
    log(f"sampler: {engine.summary()}")
    return engine



def start_status_servers(scn: Scenario, stats: list[NodeStats], log: LogFn) -> list[Any]:
    """Node i's status API on STATUS_HOST:status_port+i (none when status_port is 0)."""
    if not scn.status_port:
        return []
    from swarm_node.status.server import StatusServer  # aiohttp, only when asked for

    servers: list[StatusServer] = []
    try:
        for i, node_stats in enumerate(stats):
            server = StatusServer(node_stats, host=STATUS_HOST, port=scn.status_port + i)
            log(f"status {peer_name(i)}: {server.start()}")
            servers.append(server)
    except BaseException:
        for server in servers:
            server.stop()
        raise
    return servers
