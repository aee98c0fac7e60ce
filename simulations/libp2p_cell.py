"""The libp2p cell (sync mode): each node has a real libp2p host (a child process) on 127.0.0.1.

All nodes share one asyncio loop in this process; node work (sampling, training) runs on one worker thread so the
loop keeps answering the hosts. A round: every node samples and publishes, then the runner waits until each node
has received the groups of every other up node for this round, or `round_s` real seconds pass, then every node
mixes and trains. No network model: latency, bandwidth and loss are real loopback's. `time_s` is real seconds
since the cell started.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from simulations.cells import CellSamplers, LogFn, RoundFn, SimNode, build_nodes, peer_name, row
from simulations.loopback import TrackingExchange, connect_mesh, loopback_transport, wait_round
from simulations.scenario import Scenario, Variant
from swarm_node.identity import IDENTITY_FILENAME
from swarm_node.status.stats import NodeStats
from swarm_node.transport.base import TransportError
from swarm_node.transport.libp2p.transport import LibP2PTransport


def libp2p_cell(scn: Scenario, variant: Variant, seed: int, root: Path, stats: list[NodeStats], samplers: CellSamplers,
                 rows: list[dict[str, Any]], on_round: RoundFn | None, log: LogFn) -> list[SimNode]:
    async def main() -> list[SimNode]:
        nodes = build_nodes(scn, variant, seed, root, stats,
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
            metrics = await loop.run_in_executor(pool, n.assembly.mix_and_train, drafts[n.index])
            rows.append(row(variant, seed, n, rnd + 1, t, metrics))
            if metrics.get("reward_mean") is not None:
                rewards.append(metrics["reward_mean"])
        if on_round is not None:
            on_round(variant, seed, rnd + 1, scn.rounds, statistics.fmean(rewards) if rewards else None)
