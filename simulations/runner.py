"""Run a scenario: N nodes in one process, over the in-memory transport with the network model or over real libp2p.

Contract:
- A scenario runs once per (variant, seed) "cell"; each cell writes `<run_dir>/<variant>/seed<k>/` with one node
  directory per node (its run dir), `metrics.csv` (one row per node per round) and, last, `result.json`. A cell
  with a result.json is complete and is skipped when the scenario runs again (resumable sweeps); an incomplete
  cell directory is removed and redone.
- sync mode: a round is one lockstep update per active node: every node samples and publishes, the network
  runs for `round_s` virtual seconds (what arrives later is delivered in a later round), then every node mixes
  and trains. Compute speed does not matter in lockstep (everyone waits for the slowest).
- transport "libp2p" (sync mode only): each node has a real libp2p host (a child process) on 127.0.0.1 and all
  nodes share one asyncio loop in this process; node work (sampling, training) runs on one worker thread so the
  loop keeps answering the hosts. A round: every node samples and publishes, then the runner waits until each
  node has received the groups of every other up node for this round, or `round_s` real seconds pass, then every
  node mixes and trains. No network model: latency, bandwidth and loss are real loopback's. `time_s` is real
  seconds since the cell started (memory: virtual seconds).
- async mode: virtual clock; node i takes round_s / speed_i virtual seconds per step, draining whatever has
  arrived by then; each node makes `rounds` steps.
- Churn: a node is up during [join_round, leave_round) (rounds in sync mode, round_s units in async mode).
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

import asyncio
import csv
import dataclasses
import hashlib
import heapq
import json
import shutil
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from protocol.limits import Limits
from simulations.loopback import TrackingExchange, connect_mesh, loopback_transport, wait_round
from simulations.network import LinkModel, NetworkHub
from simulations.scenario import Scenario, Variant
from swarm_node.errors import UserError
from swarm_node.identity import IDENTITY_FILENAME
from swarm_node.model.default_model import DefaultModelRecipe, ensure_default_model, load_tokenizer
from swarm_node.node.core import Node, NodeEvents
from swarm_node.sampler.base import Sampler, SamplerSettings
from swarm_node.sharing.exchange import TransportExchange, accept_policy_for
from swarm_node.status.stats import NodeStats
from swarm_node.transport.base import Transport, TransportError
from swarm_node.transport.libp2p_transport import LibP2PTransport
from swarm_node.transport.memory import MemoryTransport, memory_addr
from swarm_node.types import Draft

if TYPE_CHECKING:
    from swarm_node.sampler.shared_lora import SharedLoRAEngine

CSV_FIELDS = ["variant", "seed", "node", "round", "time_s", "reward_mean", "accuracy", "groups_used",
              "external_used", "external_reward_mean", "pool_size", "received", "dropped", "loss", "step_s"]
RESULT_FILE = "result.json"

RoundFn = Callable[[str, int, int, int, float | None], None]  # variant, seed, round done, rounds, mean reward
LogFn = Callable[[str], None]
STATUS_HOST = "127.0.0.1"


@dataclass
class SimNode:
    index: int
    node: Node
    transport: Transport
    exchange: TransportExchange
    join: float
    leave: float
    up: bool = False


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

    def sample_all(self, nodes: list[SimNode]) -> dict[int, Draft | dict[str, Any]]:
        """Every node's `sample_and_share`, by node index."""
        if self.engine is None or not self.engine.batches_policies or len(nodes) < 2:
            return {n.index: n.node.sample_and_share() for n in nodes}
        with self.engine.gather(len(nodes)) as leave, ThreadPoolExecutor(len(nodes), "sim-sample") as pool:
            def one(n: SimNode) -> Draft | dict[str, Any]:
                try:
                    return n.node.sample_and_share()
                finally:
                    leave()

            futures = {n.index: pool.submit(one, n) for n in nodes}
            return {i: f.result() for i, f in futures.items()}


def _build(scn: Scenario, variant: Variant, seed: int, root: Path, stats: list[NodeStats], transport_for: TransportFor,
           samplers: CellSamplers, exchange_cls: type[TransportExchange] = TransportExchange) -> list[SimNode]:
    nodes = []
    for i in range(scn.nodes):
        spec = scn.node_spec(i)
        cfg = scn.node_config(variant, i, seed, root / peer_name(i))
        node = Node(cfg, stats[i], events=NodeEvents(log=lambda _m: None),
                    model_dir=Path(spec.model) if spec.model else None, sampler=samplers.for_node(i))
        node.setup()
        transport = transport_for(i)
        stats[i].update(peer_id=transport.peer_id, total_steps=scn.rounds, phase="training")
        exchange = exchange_cls(transport, Limits(vocab_size=len(node.tokenizer)),
                                accept_policy_for(node.task_source))
        node.exchange = exchange
        leave = float(spec.leave_round) if spec.leave_round else float("inf")
        nodes.append(SimNode(i, node, transport, exchange, float(spec.join_round), leave))
    return nodes


async def _set_membership(nodes: list[SimNode], at: float) -> None:
    for n in nodes:
        should_be_up = n.join <= at < n.leave
        if should_be_up and not n.up:
            await n.transport.start()
            await n.exchange.start()
            for other in nodes:
                if other.up:
                    await n.transport.connect(memory_addr(other.transport.peer_id))
            n.up = True
        elif not should_be_up and n.up:
            await n.transport.stop()
            n.up = False


def _row(variant: str, seed: int, n: SimNode, rnd: int, t: float, m: dict[str, Any]) -> dict[str, Any]:
    dropped = m.get("external_dropped") or {}
    return {"variant": variant, "seed": seed, "node": n.index, "round": rnd, "time_s": round(t, 6),
            "reward_mean": m.get("reward_mean"), "accuracy": m.get("accuracy"), "groups_used": m.get("groups_used"),
            "external_used": m.get("external_used"), "external_reward_mean": m.get("external_reward_mean"),
            "pool_size": m.get("pool_size"), "received": m.get("received"), "dropped": sum(dropped.values()),
            "loss": m.get("loss"), "step_s": m.get("step_s")}


async def _run_sync(scn: Scenario, variant: str, seed: int, nodes: list[SimNode], hub: NetworkHub,
                    samplers: CellSamplers, rows: list[dict[str, Any]], on_round: RoundFn | None) -> None:
    round_s = scn.network.round_s
    for rnd in range(scn.rounds):
        t0 = rnd * round_s
        await hub.advance_to(t0)
        await _set_membership(nodes, rnd)
        active = [n for n in nodes if n.up]
        drafts = samplers.sample_all(active)
        for n in active:
            await n.exchange.flush()
        await hub.advance_to(t0 + round_s)
        rewards = []
        for n in active:
            draft = drafts[n.index]
            metrics = draft if isinstance(draft, dict) else n.node.mix_and_train(draft)
            rows.append(_row(variant, seed, n, rnd + 1, t0 + round_s, metrics))
            if metrics.get("reward_mean") is not None:
                rewards.append(metrics["reward_mean"])
        if on_round is not None:
            on_round(variant, seed, rnd + 1, scn.rounds, statistics.fmean(rewards) if rewards else None)


async def _run_async(scn: Scenario, variant: str, seed: int, nodes: list[SimNode], hub: NetworkHub,
                     samplers: CellSamplers, rows: list[dict[str, Any]], on_round: RoundFn | None) -> None:
    # Nodes step at their own virtual times, one at a time: nothing to batch across nodes.
    round_s = scn.network.round_s
    queue = [(n.join * round_s, n.index) for n in nodes]
    heapq.heapify(queue)
    steps = dict.fromkeys(range(len(nodes)), 0)
    done_total = 0
    while queue:
        t, i = heapq.heappop(queue)
        n = nodes[i]
        await hub.advance_to(t)
        await _set_membership(nodes, t / round_s)
        if not n.up:
            continue
        draft = n.node.sample_and_share()
        await n.exchange.flush()
        metrics = draft if isinstance(draft, dict) else n.node.mix_and_train(draft)
        steps[i] += 1
        rows.append(_row(variant, seed, n, steps[i], t, metrics))
        done_total += 1
        if steps[i] < scn.rounds:
            heapq.heappush(queue, (t + round_s / scn.node_spec(i).speed, i))
        if on_round is not None and done_total % len(nodes) == 0:
            on_round(variant, seed, done_total // len(nodes), scn.rounds, metrics.get("reward_mean"))


def cumulative_rewards(rows: list[dict[str, Any]], nodes: int) -> list[float]:
    """Per node: sum over its rounds of the mean reward per local completion."""
    totals = [0.0] * nodes
    for r in rows:
        if r["reward_mean"] is not None:
            totals[int(r["node"])] += float(r["reward_mean"])
    return totals


def _memory_cell(scn: Scenario, variant: Variant, seed: int, root: Path, stats: list[NodeStats], samplers: CellSamplers,
                 rows: list[dict[str, Any]], on_round: RoundFn | None, log: LogFn) -> list[SimNode]:
    async def main() -> list[SimNode]:
        hub = NetworkHub(_link_model(scn), seed)
        nodes = _build(scn, variant, seed, root, stats, lambda i: MemoryTransport(hub, peer_name(i)), samplers)
        try:
            runner = _run_sync if scn.mode == "sync" else _run_async
            await runner(scn, variant.name, seed, nodes, hub, samplers, rows, on_round)
        finally:
            for n in nodes:
                if n.up:
                    await n.transport.stop()
        return nodes

    return asyncio.run(main())


def _libp2p_cell(scn: Scenario, variant: Variant, seed: int, root: Path, stats: list[NodeStats], samplers: CellSamplers,
                 rows: list[dict[str, Any]], on_round: RoundFn | None, log: LogFn) -> list[SimNode]:
    async def main() -> list[SimNode]:
        nodes = _build(scn, variant, seed, root, stats,
                       lambda i: loopback_transport(root / peer_name(i) / IDENTITY_FILENAME), samplers,
                       TrackingExchange)
        # One worker thread for all node work: the loop stays free to answer the hosts' validation requests
        # and health polls while a node samples or trains.
        with ThreadPoolExecutor(1, thread_name_prefix="sim-nodes") as pool:
            try:
                await _run_sync_libp2p(scn, variant.name, seed, nodes, samplers, rows, on_round, log, pool)
            finally:
                await asyncio.gather(*(n.transport.stop() for n in nodes if n.up), return_exceptions=True)
        return nodes

    return asyncio.run(main())


CellLoop = Callable[[Scenario, Variant, int, Path, list[NodeStats], CellSamplers, list[dict[str, Any]], RoundFn | None,
                     LogFn], list[SimNode]]
CELL_LOOPS: dict[str, CellLoop] = {"memory": _memory_cell, "libp2p": _libp2p_cell}  # keys: scenario.TRANSPORTS


def _libp2p(n: SimNode) -> tuple[LibP2PTransport, TrackingExchange]:
    if not isinstance(n.transport, LibP2PTransport) or not isinstance(n.exchange, TrackingExchange):
        raise TypeError(f"{peer_name(n.index)} was not built for the libp2p transport")
    return n.transport, n.exchange


async def _set_membership_libp2p(nodes: list[SimNode], at: float, log: LogFn) -> None:
    """Stop leaving nodes; start joining ones together, then mesh them with everyone up."""
    for n in nodes:
        if n.up and not n.join <= at < n.leave:
            await n.transport.stop()
            n.up = False
    joining = [n for n in nodes if not n.up and n.join <= at < n.leave]  # after leave_round a node stays down
    if not joining:
        return
    up = [n for n in nodes if n.up]
    results = await asyncio.gather(*(n.transport.start() for n in joining), return_exceptions=True)
    failure = next((r for r in results if isinstance(r, BaseException)), None)
    if failure is not None:
        await asyncio.gather(*(n.transport.stop() for n in joining), return_exceptions=True)
        raise failure
    for n in joining:
        n.up = True
        await n.exchange.start()
    names = {_libp2p(n)[0].peer_id: peer_name(n.index) for n in nodes}
    lacking = await connect_mesh([_libp2p(n)[0] for n in joining], [_libp2p(n)[0] for n in up])
    for a, b in lacking:
        log(f"warning: {names[a]} does not see {names[b]} on the rollout topic; gossip between them may be lost")


async def _run_sync_libp2p(scn: Scenario, variant: str, seed: int, nodes: list[SimNode], samplers: CellSamplers,
                           rows: list[dict[str, Any]], on_round: RoundFn | None, log: LogFn,
                           pool: ThreadPoolExecutor) -> None:
    loop = asyncio.get_running_loop()
    started = time.monotonic()
    for rnd in range(scn.rounds):
        await _set_membership_libp2p(nodes, rnd, log)
        active = [n for n in nodes if n.up]
        exchanges = [_libp2p(n)[1] for n in active]
        for ex in exchanges:
            ex.begin_round()
        drafts = await loop.run_in_executor(pool, samplers.sample_all, active)
        for n in active:
            try:
                await n.exchange.flush()
            except TransportError as exc:  # e.g. its host is restarting: the others train without its groups
                log(f"warning: round {rnd + 1}: {peer_name(n.index)}'s groups were not shared: {exc}")
        missing = await wait_round(exchanges, scn.network.round_s)
        if any(missing):
            log(f"round {rnd + 1}: {sum(missing)} group(s) still on the way after round_s = {scn.network.round_s} s; "
                "they count in a later round")
        t = time.monotonic() - started
        rewards = []
        for n in active:
            draft = drafts[n.index]
            metrics = draft if isinstance(draft, dict) else await loop.run_in_executor(pool, n.node.mix_and_train,
                                                                                       draft)
            rows.append(_row(variant, seed, n, rnd + 1, t, metrics))
            if metrics.get("reward_mean") is not None:
                rewards.append(metrics["reward_mean"])
        if on_round is not None:
            on_round(variant, seed, rnd + 1, scn.rounds, statistics.fmean(rewards) if rewards else None)


def _shared_engine(scn: Scenario, variant: Variant, root: Path, log: LogFn) -> SharedLoRAEngine | None:
    """The cell's shared LoRA engine when the scenario asks for one (scenario.check_shared_lora held)."""
    if scn.sampler != "shared-lora":
        return None
    try:  # vLLM only when asked for
        from swarm_node.sampler.shared_lora import SharedLoRAEngine
    except (ImportError, RuntimeError, OSError) as exc:
        raise UserError(f"simulation.sampler 'shared-lora' needs vLLM, which does not import: {exc}") from exc
    cfg = scn.node_config(variant, 0, 0, root)
    model = scn.base_model(variant, 0)
    model_dir = Path(model) if model else ensure_default_model()
    s = cfg.sampler
    engine = SharedLoRAEngine(model_dir, load_tokenizer(model_dir),
                              SamplerSettings(s.threads, s.max_model_len, s.kv_cache_gb, s.max_num_seqs),
                              scn.nodes, cfg.train.lora_rank, cfg.train.lora_alpha, root / "adapters")
    log(f"sampler: {engine.summary()}")
    return engine


def _start_status_servers(scn: Scenario, stats: list[NodeStats], log: LogFn) -> list[Any]:
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


def run_cell(scn: Scenario, variant: Variant, seed: int, run_dir: Path,
             on_round: RoundFn | None = None, log: LogFn | None = None) -> dict[str, Any]:
    """Run one (variant, seed) cell, or load its result if it completed before. `log` gets status URLs and
    warnings (default: dropped)."""
    root = cell_dir(run_dir, variant.name, seed)
    done = root / RESULT_FILE
    fingerprint = cell_fingerprint(scn, variant)
    if done.exists():
        previous = json.loads(done.read_text())
        if previous.get("fingerprint") == fingerprint:
            return previous
        if log is not None:  # another scenario (or default model) ran here before: its result does not count
            log(f"{root}: result of a different scenario or model; running the cell again")
    if root.exists():
        shutil.rmtree(root)  # an interrupted cell restarts from scratch: its nodes kept no checkpoints
    root.mkdir(parents=True)
    if scn.mode == "echo":
        rows, result = _run_echo_cell(scn, variant, seed, root, on_round)
        return _finish_cell(root, rows, {**result, "fingerprint": fingerprint})
    started = time.monotonic()
    rows: list[dict[str, Any]] = []
    stats = [NodeStats() for _ in range(scn.nodes)]
    log = log or (lambda _m: None)
    engine = _shared_engine(scn, variant, root, log)
    servers: list[Any] = []
    try:
        servers = _start_status_servers(scn, stats, log)
        nodes = CELL_LOOPS[scn.transport](scn, variant, seed, root, stats, CellSamplers(engine), rows, on_round, log)
        try:
            evals = [n.node.evaluate().greedy_acc for n in nodes] if scn.eval_problems else []
            drops: dict[str, int] = {}
            for n in nodes:
                for (_sender, reason), count in n.node.peer_drops.items():
                    drops[reason] = drops.get(reason, 0) + count
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
              "external_drops": drops, "wall_s": time.monotonic() - started}
    return _finish_cell(root, rows, {**result, "fingerprint": fingerprint})


def _run_echo_cell(scn: Scenario, variant: Variant, seed: int, root: Path,
                   on_round: RoundFn | None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
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
        bandwidth_mb_s=(net.uplink_mbps / 8) or 1e6, latency_s=net.latency_ms / 1000,
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


def cell_fingerprint(scn: Scenario, variant: Variant) -> str:
    """What a cell's result depends on besides its seed: the scenario (less seeds and run dir), the variant and the
    embedded default model's recipe. A stored result with another fingerprint is run again, not reused."""
    what = {k: v for k, v in dataclasses.asdict(scn).items() if k not in ("seeds", "run_dir", "variants")}
    if scn.sampler == "per-node":
        del what["sampler"]  # the default: results stored before the option existed stay valid
    what.update(variant=dataclasses.asdict(variant), default_model=DefaultModelRecipe().key())
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _finish_cell(root: Path, rows: list[dict[str, Any]], result: dict[str, Any]) -> dict[str, Any]:
    write_csv(root / "metrics.csv", rows)
    done = root / RESULT_FILE
    tmp = root / (RESULT_FILE + ".tmp")
    tmp.write_text(json.dumps(result, indent=1))
    tmp.replace(done)
    return result


def _link_model(scn: Scenario) -> LinkModel:
    net = scn.network
    return LinkModel(net.latency_ms / 1000, net.uplink_mbps * 1e6, net.downlink_mbps * 1e6, net.loss)


def write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        writer.writeheader()
        writer.writerows(rows)


def read_rows(path: Path) -> list[dict[str, Any]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


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
