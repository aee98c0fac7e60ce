"""The attack cell (mode "attack"): honest SAPO nodes and malicious ones over the in-memory network model.

Contract: lockstep rounds as in memory_cell.py's sync mode (every active node samples and publishes, the network
runs `round_s` virtual seconds, every honest node mixes and trains), except that the scenario's `[[attacker]]`
nodes are not `Node`s: each forges and publishes what its kind (simulations/byzantine.py) sends, from a context
taken from an honest node, and drains what it receives (a replay attacker keeps it to copy). A Sybil gets a new
peer id (`node<i>s<k>`) every `rotate_rounds` rounds. Honest nodes are built as every simulation builds them
(cells.build_node: the assembly of `join`, graylisted, banned and denied signers ignored unread).
Counted per cell (`AttackTally`, attack_tally.py): groups of each attack kind that reached an honest node's loss,
and the round each attacker identity was first blocked by every honest node. Only honest nodes have metrics rows
and a final eval.

Resumable like a sync memory cell (snapshots.py: the same snapshots and resume rule): an attacker is a stand-in
node at step 0 whose forging random stream is its `share_rng`, so a snapshot keeps it; the tally is the round
loop's state. Lost on resume, like the honest pools: a replay attacker's copies and messages in flight.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from pathlib import Path
from typing import Any

from protocol.codec import encode
from protocol.messages import TOPIC_ROLLOUTS, RolloutBatch
from simulations.attack_tally import AttackTally, TallyPool
from simulations.byzantine import ATTACKS, ForgeContext
from simulations.cells import (
    CellSamplers,
    LogFn,
    RoundFn,
    SimNode,
    build_node,
    cumulative_rewards,
    drop_totals,
    peer_name,
    train_round,
)
from simulations.memory_cell import set_membership
from simulations.network import NetworkHub
from simulations.results import cell_fingerprint
from simulations.scenario import Scenario, Variant
from simulations.snapshots import KEEP_CHECKPOINTS, PROGRESS_FILE, CellSnapshots, read_snapshot, restore
from swarm_node.errors import UserError
from swarm_node.node.assembly import Assembly
from swarm_node.node.core import Node
from swarm_node.node.resume import RandomStreams
from swarm_node.sharing.exchange import TransportExchange, accept_policy_for
from swarm_node.sharing.wire import content_key
from swarm_node.status.stats import NodeStats
from swarm_node.tasks import TaskRef
from swarm_node.transport.memory import MemoryTransport

MAX_SEEN = 256  # groups a replay attacker keeps to copy


class AttackerNode:
    """What the round loop and snapshots ask of a node, for an attacker: step 0, its random streams (its assembly
    has no SAPO peer: no drops)."""

    def __init__(self, run_dir: Path, seed: int) -> None:
        self.run_dir = run_dir
        self.step = 0
        # The share stream is the forging stream (saved and restored by snapshots); the others are unused.
        self.streams = RandomStreams(random.Random(seed + 2), random.Random(seed + 1), random.Random(seed))

    def close(self) -> None:
        pass


class Attacker:
    """One malicious node: its kind, its current identity, what it received."""

    def __init__(self, sim: SimNode, kind: str, hub: NetworkHub, ctx: ForgeContext) -> None:
        self.sim, self.kind, self.hub, self.ctx = sim, kind, hub, ctx
        self.attack = ATTACKS[kind]
        self.seen: list[Any] = []
        self.rng: random.Random = sim.node.streams.share

    def identity(self, rnd: int) -> str:
        return identity_name(self.sim.index, self.kind, rnd)

    async def rotate(self, rnd: int) -> str | None:
        """A Sybil's fresh identity at the start of each period (down until `set_membership` connects it);
        returns it when it changed."""
        name = self.identity(rnd)
        if name == self.sim.transport.peer_id:
            return None
        if self.sim.up:
            await self.sim.transport.stop()
        self.sim.transport = MemoryTransport(self.hub, name)
        self.sim.exchange = attacker_exchange(self.sim.transport, self.ctx)
        self.sim.up = False
        return name

    def forge(self, now: float) -> list[Any]:
        signer = self.sim.transport.peer_id
        out = []
        for _ in range(self.attack.per_round):
            out.extend(self.attack.forge(self.ctx, self.rng, signer, now, self.seen))
        return out

    async def publish(self, groups: list[Any]) -> None:
        for g in groups:  # one group per message: a maximal-length group is most of a message's size limit
            await self.sim.transport.publish(TOPIC_ROLLOUTS, encode(RolloutBatch((g,))))

    def receive(self) -> None:
        got = [r.group for r in self.sim.exchange.drain() if r.group is not None]
        if self.kind == "replay":
            self.seen = (self.seen + got)[-MAX_SEEN:]


def identity_name(index: int, kind: str, rnd: int) -> str:
    """Attacker `index`'s peer id in round `rnd` (a Sybil's changes every `rotate_rounds`)."""
    every = ATTACKS[kind].rotate_rounds
    return peer_name(index) + (f"s{rnd // every}" if every else "")


def attacker_exchange(transport: MemoryTransport, ctx: ForgeContext) -> TransportExchange:
    from protocol.limits import Limits

    return TransportExchange(transport, Limits(vocab_size=ctx.vocab_size), accept_policy_for(ctx.source))


def honest_node(scn: Scenario, variant: Variant, seed: int, root: Path, i: int, stats: NodeStats, hub: NetworkHub,
                resume: bool) -> SimNode:
    """Node i as every simulation builds it (cells.build_node: its exchange guarded as in `join`), with a tallying
    pool."""
    return build_node(scn, variant, seed, root, i, stats, MemoryTransport(hub, peer_name(i)), CellSamplers(), resume,
                      KEEP_CHECKPOINTS, pool=TallyPool)


async def _round(rnd: int, scn: Scenario, variant: str, seed: int, nodes: list[SimNode], attackers: list[Attacker],
                 hub: NetworkHub, tally: AttackTally, rows: list[dict[str, Any]]) -> float | None:
    round_s = scn.network.round_s
    t0 = rnd * round_s
    await hub.advance_to(t0)
    for a in attackers:
        if (name := await a.rotate(rnd)) is not None:
            tally.identity(name, a.kind)
    await set_membership(nodes, rnd)
    honest = [n for n in nodes if n.up and isinstance(n.node, Node)]
    drafts = {n.index: n.assembly.sample_and_share() for n in honest}
    for n in honest:
        await n.exchange.flush()
    now = time.time()
    for a in attackers:
        forged = a.forge(now)
        for g in forged if a.kind == "forged_reward" else ():
            ref = TaskRef(g.task.dataset, g.task.config, g.task.seed, g.task.index)
            tally.claimed(content_key(ref, [c.token_ids for c in g.completions]), [c.claimed_reward
                                                                                   for c in g.completions])
        await a.publish(forged)
    await hub.advance_to(t0 + round_s)
    mean_reward = train_round(honest, drafts, variant, seed, rnd + 1, t0 + round_s, rows)
    for a in attackers:
        a.receive()
    tally.blocked(rnd + 1, [n.assembly.guard for n in honest if n.assembly.guard is not None], time.time())
    return mean_reward


def attack_cell(scn: Scenario, variant: Variant, seed: int, root: Path, on_round: RoundFn | None,
                log: LogFn) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The cell runner of mode "attack" (simulations/runner.py CELL_RUNNERS): rows of honest nodes, the result."""
    if scn.transport != "memory" or scn.sampler != "per-node":
        raise UserError("simulation.mode 'attack' runs over transport 'memory' with sampler 'per-node'")
    started = time.monotonic()
    resumed = read_snapshot(root) if (root / PROGRESS_FILE).exists() else None  # the runner accepted it
    snaps = CellSnapshots(root, cell_fingerprint(scn, variant), scn.checkpoint_rounds, resumed, log)
    kinds = dict(scn.attackers)
    rows: list[dict[str, Any]] = []
    tally = AttackTally.from_state(snaps.loop_state())

    async def main() -> list[SimNode]:
        hub = NetworkHub(scn.network.link(), seed)
        nodes: list[SimNode] = []
        for i in range(scn.nodes):
            if i not in kinds:
                nodes.append(honest_node(scn, variant, seed, root, i, NodeStats(), hub, resumed is not None))
        ctx = ForgeContext.from_assembly(nodes[0].assembly)
        attackers = []
        for i, kind in kinds.items():
            transport = MemoryTransport(hub, identity_name(i, kind, snaps.start_round))
            stand_in = Assembly(AttackerNode(root / peer_name(i), seed * 1000 + i))  # type: ignore[arg-type]
            sim = SimNode(i, stand_in, transport, attacker_exchange(transport, ctx), 0.0, float("inf"))
            attackers.append(Attacker(sim, kind, hub, ctx))
            tally.identity(transport.peer_id, kind)
        everyone = sorted(nodes + [a.sim for a in attackers], key=lambda n: n.index)
        for n in honest_of(everyone):
            assert n.assembly.peer is not None
            tally.watch(n.assembly.peer.pool)
        if resumed is not None:
            rows.extend(resumed.rows)
            restore(resumed.progress, everyone, hub)
        try:
            for rnd in range(snaps.start_round, scn.rounds):
                reward = await _round(rnd, scn, variant.name, seed, everyone, attackers, hub, tally, rows)
                if snaps.due(rnd + 1, scn.rounds):
                    snaps.save(rnd + 1, everyone, rows, hub, tally.state())
                if on_round is not None:
                    on_round(variant.name, seed, rnd + 1, scn.rounds, reward)
        finally:
            for n in everyone:
                if n.up:
                    await n.transport.stop()
        return everyone

    everyone = asyncio.run(main())
    honest = honest_of(everyone)
    try:
        finals = {n.index: n.node.evaluate() for n in honest} if scn.eval_problems else {}
        drops = drop_totals(honest)
    finally:
        for n in everyone:
            n.node.close()
    cum = cumulative_rewards(rows, scn.nodes)
    honest_ids = [n.index for n in honest]
    external = [float(r["external_used"] or 0) for r in rows]
    result = {"variant": variant.name, "seed": seed, "nodes": scn.nodes, "rounds": scn.rounds,
              "attackers": {str(i): k for i, k in kinds.items()}, "honest": honest_ids,
              "cum_reward_per_node": [cum[i] for i in honest_ids],
              "final_eval_acc_per_node": {str(i): e.greedy_acc for i, e in finals.items()},
              "final_eval_outcomes_per_node": {str(i): e.by_question() for i, e in finals.items()},
              "final_eval_acc": statistics.fmean(e.greedy_acc for e in finals.values()) if finals else None,
              "external_groups_trained_per_step": statistics.fmean(external) if external else 0.0,
              "external_drops": drops, **tally.result(), "wall_s": time.monotonic() - started}
    return rows, result


def honest_of(nodes: list[SimNode]) -> list[SimNode]:
    return [n for n in nodes if isinstance(n.node, Node)]
