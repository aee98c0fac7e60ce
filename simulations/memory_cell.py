"""The in-memory cell: N nodes over `MemoryTransport` through the network model (simulations/network.py).

sync mode: a round is one lockstep update per active node: every node samples and publishes, the network runs
for `round_s` virtual seconds (what arrives later is delivered in a later round), then every node mixes and
trains. async mode: virtual clock; node i takes round_s / speed_i virtual seconds per step, draining whatever
has arrived by then. Churn: a node is up during [join_round, leave_round).

Snapshots (simulations/snapshots.py): every `checkpoint_rounds` rounds (async: every that many steps per node, in
total) and after the last one, before `on_round` is told; a cell whose snapshot the runner accepted resumes from it
(`read_snapshot`): its nodes from their checkpoints, its rows, network model and (async) event queue as saved.
"""

from __future__ import annotations

import asyncio
import heapq
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from simulations.cells import CellSamplers, LogFn, RoundFn, SimNode, build_nodes, peer_name, row, train_round
from simulations.network import LinkModel, NetworkHub
from simulations.results import cell_fingerprint
from simulations.scenario import Scenario, Variant
from simulations.snapshots import KEEP_CHECKPOINTS, PROGRESS_FILE, CellSnapshots, read_snapshot, restore
from swarm_node.status.stats import NodeStats
from swarm_node.transport.memory import MemoryTransport, memory_addr


async def set_membership(nodes: list[SimNode], at: float) -> None:
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



async def _run_sync(scn: Scenario, variant: str, seed: int, nodes: list[SimNode], hub: NetworkHub,
                    samplers: CellSamplers, rows: list[dict[str, Any]], on_round: RoundFn | None,
                    snaps: CellSnapshots) -> None:
    round_s = scn.network.round_s
    for rnd in range(snaps.start_round, scn.rounds):
        t0 = rnd * round_s
        await hub.advance_to(t0)
        await set_membership(nodes, rnd)
        active = [n for n in nodes if n.up]
        drafts = samplers.sample_all(active)
        for n in active:
            await n.exchange.flush()
        await hub.advance_to(t0 + round_s)
        mean_reward = train_round(active, drafts, variant, seed, rnd + 1, t0 + round_s, rows)
        if snaps.due(rnd + 1, scn.rounds):
            snaps.save(rnd + 1, nodes, rows, hub)
        if on_round is not None:
            on_round(variant, seed, rnd + 1, scn.rounds, mean_reward)


async def _run_async(scn: Scenario, variant: str, seed: int, nodes: list[SimNode], hub: NetworkHub,
                     samplers: CellSamplers, rows: list[dict[str, Any]], on_round: RoundFn | None,
                     snaps: CellSnapshots) -> None:
    # Nodes step at their own virtual times, one at a time: nothing to batch across nodes.
    round_s = scn.network.round_s
    saved = snaps.loop_state()
    queue = [(float(t), int(i)) for t, i in saved["queue"]] if saved else [(n.join * round_s, n.index) for n in nodes]
    heapq.heapify(queue)
    steps = dict(enumerate(saved["steps"])) if saved else dict.fromkeys(range(len(nodes)), 0)
    done_total = int(saved["done"]) if saved else 0
    while queue:
        t, i = heapq.heappop(queue)
        n = nodes[i]
        await hub.advance_to(t)
        await set_membership(nodes, t / round_s)
        if not n.up:
            continue
        draft = n.node.sample_and_share()
        await n.exchange.flush()
        metrics = n.node.mix_and_train(draft)
        steps[i] += 1
        rows.append(row(variant, seed, n, steps[i], t, metrics))
        done_total += 1
        if steps[i] < scn.rounds:
            heapq.heappush(queue, (t + round_s / scn.node_spec(i).speed, i))
        if snaps.every and (done_total % (snaps.every * len(nodes)) == 0 or not queue):
            snaps.save(done_total // len(nodes), nodes, rows, hub,
                       {"queue": queue, "steps": [steps[k] for k in range(len(nodes))], "done": done_total})
        if on_round is not None and done_total % len(nodes) == 0:
            on_round(variant, seed, done_total // len(nodes), scn.rounds, metrics.get("reward_mean"))




RoundLoop = Callable[[Scenario, str, int, list[SimNode], NetworkHub, CellSamplers, list[dict[str, Any]],
                      RoundFn | None, CellSnapshots], Awaitable[None]]
ROUND_LOOPS: dict[str, RoundLoop] = {"sync": _run_sync, "async": _run_async}  # by scenario mode


def link_model(scn: Scenario) -> LinkModel:
    net = scn.network
    return LinkModel(net.latency_ms / 1000, net.uplink_mbps * 1e6, net.downlink_mbps * 1e6, net.loss)



def memory_cell(scn: Scenario, variant: Variant, seed: int, root: Path, stats: list[NodeStats], samplers: CellSamplers,
                 rows: list[dict[str, Any]], on_round: RoundFn | None, log: LogFn) -> list[SimNode]:
    resumed = read_snapshot(root) if (root / PROGRESS_FILE).exists() else None  # the runner accepted it
    snaps = CellSnapshots(root, cell_fingerprint(scn, variant), scn.checkpoint_rounds, resumed, log)

    async def main() -> list[SimNode]:
        hub = NetworkHub(link_model(scn), seed)
        nodes = build_nodes(scn, variant, seed, root, stats, lambda i: MemoryTransport(hub, peer_name(i)), samplers,
                            resume=resumed is not None)
        for n in nodes:
            n.node.cfg = n.node.cfg.with_values({"run.keep_checkpoints": KEEP_CHECKPOINTS})
        if resumed is not None:
            rows.extend(resumed.rows)
            restore(resumed.progress, nodes, hub)
        try:
            await ROUND_LOOPS[scn.mode](scn, variant.name, seed, nodes, hub, samplers, rows, on_round, snaps)
        finally:
            for n in nodes:
                if n.up:
                    await n.transport.stop()
        return nodes

    return asyncio.run(main())
