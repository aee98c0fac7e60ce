"""The gaps the byzantine simulation found (issue 14 item 6), closed: a simulation's exchange ignores blocked signers
as `join`'s does, a node never trains on its own groups replayed back to it, a graylisted relay is never pulled
from, and a refused delta never holds an ECHO-2 worker back from a later snapshot."""

from __future__ import annotations

import random
import time
import types
from pathlib import Path

import pytest

from protocol.codec import encode
from protocol.messages import RolloutBatch
from protocol.validation import ReplayGuard
from simulations.byzantine import ForgeContext, fair
from simulations.cells import CellSamplers, build_nodes, peer_name
from simulations.scenario import parse_scenario
from swarm_node.echo.catch_up import CatchUp, plan_catch_up
from swarm_node.echo.worker import Worker
from swarm_node.policy_sync.delta import DeltaError, DeltaTooLarge
from swarm_node.sharing.pool import ExperiencePool
from swarm_node.sharing.wire import content_key
from swarm_node.status.stats import NodeStats
from swarm_node.transport.base import ValidationResult
from swarm_node.transport.memory import MemoryHub, MemoryTransport
from swarm_node.types import Draft, PoolEntry
from tests.unit.test_broadcast import LEARNER, WORKERS, payload_of, publish, received, swarm
from tests.unit.test_delta_guard import Host, announce_of, fake_source, publisher_for, step_weight

TINY = {"run": {"group_size": 4, "prompts_per_step": 2}, "sampler": {"kind": "hf", "max_new_tokens": 8},
        "train": {"threads": 1, "minibatches": 1}, "share": {"local_groups": 2, "external_groups": 2}}


# ------------------------------------------------------------------------------------ simulations guard like join
def test_a_simulated_nodes_exchange_ignores_blocked_signers_unread(tmp_path: Path, tiny_model_dir: Path) -> None:
    scn = parse_scenario({"simulation": {"nodes": 2, "rounds": 1, "eval_problems": 0},
                          "config": TINY, "node": [{"index": i, "model": str(tiny_model_dir)} for i in range(2)]}, "t")
    hub = MemoryHub()
    nodes = build_nodes(scn, scn.variants[0], 0, tmp_path, [NodeStats(), NodeStats()],
                        lambda i: MemoryTransport(hub, peer_name(i)), CellSamplers())
    node, exchange, guard = nodes[0].node, nodes[0].exchange, nodes[0].assembly.guard
    assert guard is not None
    now = time.time()
    [group] = fair(ForgeContext.from_assembly(nodes[0].assembly), random.Random(0), "node1", now, [])
    data = encode(RolloutBatch((group,)))
    assert exchange._validate("node1", data) is ValidationResult.ACCEPT
    exchange.replay = ReplayGuard(exchange.limits.max_age_s)  # the same message again, as if not seen
    guard.reputation.ban("node1", until=now + 3600)
    guard.settle(now)
    assert exchange._validate("node1", data) is ValidationResult.IGNORE
    assert exchange.drain() == [] and node.stats.dropped["banned"] == 1  # ignored unread: nothing queued
    for n in nodes:
        n.node.close()


# ------------------------------------------------------------------------------------- our own groups, replayed
def test_our_own_groups_replayed_back_are_duplicates() -> None:
    pool = ExperiencePool(8, 8, 4)
    pool.mark_seen([b"ours" * 8])
    group = types.SimpleNamespace(has_signal=True)  # the pool only asks whether a group has signal
    entry = PoolEntry(group, "mallory", b"ours" * 8, 0)  # type: ignore[arg-type]
    assert pool.add(entry) == [("mallory", "duplicate")] and len(pool) == 0
    assert pool.add(PoolEntry(group, "mallory", b"new!" * 8, 0)) == [] and len(pool) == 1  # type: ignore[arg-type]


def test_a_node_marks_what_it_publishes_as_seen(tmp_path: Path, tiny_model_dir: Path) -> None:
    scn = parse_scenario({"simulation": {"nodes": 1, "rounds": 1, "eval_problems": 0},
                          "config": TINY, "node": [{"index": 0, "model": str(tiny_model_dir)}]}, "t")
    hub = MemoryHub()
    [sim] = build_nodes(scn, scn.variants[0], 0, tmp_path, [NodeStats()], lambda i: MemoryTransport(hub, "node0"),
                        CellSamplers())
    draft = sim.assembly.sample_and_share()
    assert isinstance(draft, Draft) and sim.assembly.peer is not None
    keys = [content_key(g.inst.ref, [c.token_ids for c in g.completions]) for g in draft.groups]
    assert len(keys) == 2
    for key in keys:  # a replay of one of them, under any name, is a duplicate
        pool = sim.assembly.peer.pool
        assert pool.add(PoolEntry(draft.groups[0], "mallory", key, 0)) == [("mallory", "duplicate")]
    sim.node.close()


# ---------------------------------------------------------------------------------------- graylisted relays
async def test_a_blocked_relay_is_never_pulled_from_and_the_version_still_completes() -> None:
    payload = payload_of(100_000, seed=2)
    async with swarm([LEARNER, *WORKERS], corrupt=("w0",)) as nodes:
        events: dict[str, list[tuple[str, str]]] = {w: [] for w in WORKERS}
        for w in WORKERS:
            nodes[w]._puller.on_peer_event = lambda peer, reason, w=w: events[w].append((peer, reason))
            nodes[w]._puller.blocked = lambda peer: peer == "w0"  # w0 is graylisted by everyone
        nodes["w3"]._puller.blocked = lambda peer: True  # even the learner: the owner is always pulled from
        await publish(nodes[LEARNER], payload, WORKERS)
        for w in WORKERS:
            assert (await received(nodes[w]))[1] == payload
        # w0 relays stripe 0 to w2 and w4 (test_broadcast): without the guard both got a bad chunk from it.
        assert events == {w: [] for w in WORKERS}


# ----------------------------------------------------------------------------------------- refused deltas
def test_catch_up_never_picks_a_refused_update() -> None:
    held = [types.SimpleNamespace(version=v, base_version=b, state_sha256=f"h{v}")
            for v, b in [(4, 3), (5, 4), (5, 5), (6, 5)]]
    assert plan_catch_up(held, 3, "h3") == CatchUp(False, (4, 3))
    assert plan_catch_up(held, 3, "h3", {(4, 3)}) == CatchUp(False, (5, 5))  # the snapshot past it
    assert plan_catch_up(held, 3, "h3", {(4, 3), (5, 5)}) == CatchUp(False, None)  # wait for a later one


def test_a_worker_remembers_what_it_refused_and_catches_up_past_it() -> None:
    publisher = publisher_for(Host())
    big = step_weight(publisher, 1.0)  # over the fake worker's bound of 1.5
    small = step_weight(publisher, 0.001)
    snapshot = publisher.snapshot()  # v2, 2 steps from v0: within 2 x 1.5
    source, host, _ = fake_source([], catalog=[announce_of(big, LEARNER), announce_of(small, LEARNER),
                                               announce_of(snapshot, LEARNER)])
    with pytest.raises(DeltaTooLarge):
        source.worker.apply(big)
    assert source.worker.refused == {(1, 0)}
    fetched: list[tuple[int, int | None]] = []

    async def fetch(owner: str, version: int, peers: list[str], base_version: int | None = None) -> object:
        fetched.append((version, base_version))
        return next((announce_of(u, LEARNER), u.payload) for u in (big, small, snapshot)
                    if (u.version, u.base_version) == (version, base_version))

    source.broadcaster.fetch = fetch  # type: ignore[attr-defined]
    source.catch_up()
    assert fetched == [(2, 2)] and source.worker.version == 2 and host.loaded == [2]
    source.worker.reset()
    assert source.worker.refused == set()


def test_only_updates_refused_as_too_large_are_remembered() -> None:
    worker = Worker(Host(), kappa=1, max_staleness=1, max_delta_norm=1.5)
    publisher = publisher_for(Host())
    first, second = step_weight(publisher, 0.1), step_weight(publisher, 0.1)
    with pytest.raises(DeltaError):
        worker.apply(second)  # a gap: fetching v1 first fixes it, so it is not remembered
    worker.apply(first)
    worker.apply(second)
    assert worker.version == 2 and worker.refused == set()


# ---------------------------------------------------------------------------------------------- kill points
def test_kills_land_at_a_time_or_mid_write(tmp_path: Path) -> None:
    import subprocess

    from simulations.attack_kill import kill_when, writing

    assert not writing(tmp_path)
    (tmp_path / "node0" / "checkpoints" / ".tmp-step-00000003-77").mkdir(parents=True)
    assert writing(tmp_path)
    proc = subprocess.Popen(["sleep", "30"], start_new_session=True)
    assert kill_when(proc, tmp_path, mid_write=True, after_s=60.0, limit_s=10.0)  # at once: a write is under way
    assert proc.returncode == -9
    (tmp_path / "node0" / "checkpoints" / ".tmp-step-00000003-77").rmdir()
    (tmp_path / "progress.json.tmp").write_text("{")
    assert writing(tmp_path)
    (tmp_path / "progress.json.tmp").unlink()
    proc = subprocess.Popen(["sleep", "30"], start_new_session=True)
    assert not kill_when(proc, tmp_path, mid_write=False, after_s=0.1, limit_s=10.0)
    assert proc.returncode == -9


# ------------------------------------------------------------------------------------------ message floods
def test_a_signer_past_its_message_rate_is_ignored_unread_and_can_lose_reputation() -> None:
    from swarm_node.sharing.ingest import PeerGuard
    from swarm_node.sharing.reputation import DEFAULT_WEIGHTS, Reputation, ReputationParams
    from swarm_node.transport.shaping import RequestBudget

    assert DEFAULT_WEIGHTS["flood"] == 0.0
    clock = [100.0]
    rep = Reputation(ReputationParams(weights={"flood": -0.1}))  # by default floods cost nothing (a fast peer)
    guard = PeerGuard(rep, rate=RequestBudget(2.0, 3, clock=lambda: clock[0]))
    assert [guard.blocked("flooder") for _ in range(5)] == [False, False, False, True, True]
    assert [guard.blocked("honest") for _ in range(3)] == [False, False, False]  # a bucket per signer
    clock[0] += 0.5  # one message earned
    assert [guard.blocked("flooder") for _ in range(2)] == [False, True]
    assert guard.stats.dropped["flood"] == 3
    guard.settle(clock[0])
    assert guard.reputation.score("flooder", clock[0]) == pytest.approx(-0.3)  # 3 x the "flood" weight
    assert guard.reputation.score("honest", clock[0]) == 0.0


def test_the_message_rate_comes_from_the_config(tmp_path: Path) -> None:
    from swarm_node.config import PeersConfig
    from swarm_node.sharing.ingest import PeerGuard

    guard = PeerGuard.from_config(PeersConfig(), tmp_path, NodeStats(), 0.0)
    assert guard.rate is not None and (guard.rate.rate, guard.rate.burst) == (5.0, 50.0)
    assert PeerGuard.from_config(PeersConfig(max_messages_per_s=0.0), tmp_path, NodeStats(), 0.0).rate is None
