"""ECHO-2 deltas from hostile peers (issue 14 item 8): only the followed learner's updates are applied, an update
that moves the policy past `echo.max_delta_norm` is refused, and a relay that sends bad chunks is scored."""

from __future__ import annotations

import asyncio
import time
import types
from collections import deque
from typing import Any

import pytest
import torch
from torch import nn

from protocol.chunks import PROTOCOL_ID, AnnounceFrame, encode_frame
from protocol.codec import encode
from protocol.limits import Limits
from protocol.messages import TOPIC_POLICY, PolicyAnnounce
from swarm_node.config import EchoConfig
from swarm_node.echo.worker import Worker
from swarm_node.policy_sync.delta import DeltaTooLarge, PolicyFollower, PolicyPublisher, PolicyUpdate, state_hash
from swarm_node.policy_sync.store import BroadcastError
from swarm_node.roles.worker import WorkerSource
from swarm_node.sharing.ingest import PeerGuard
from swarm_node.sharing.reputation import DEFAULT_WEIGHTS, Reputation, ReputationParams
from swarm_node.status.stats import NodeStats
from swarm_node.transport.base import Stream
from tests.unit.test_broadcast import LEARNER, STATE, WORKERS, payload_of, publish, received, swarm

pytestmark = pytest.mark.timeout(60)

BASE = {"w": torch.ones(4), "b": torch.zeros(2)}


def step(publisher: PolicyPublisher, by: float) -> PolicyUpdate:
    """Publish W_pub + `by` on every entry of "w" (exact in bf16): a delta of L2 norm 2 * by."""
    state = publisher.published_state()
    return publisher.publish({"w": state["w"] + by, "b": state["b"]})


# ------------------------------------------------------------------------------------------------ the norm bound
@pytest.mark.parametrize(("bound", "refused"), [(1.001, False), (0.999, True), (0.0, False)])
def test_a_delta_over_the_bound_is_refused_and_leaves_the_follower_as_it_was(bound: float, refused: bool) -> None:
    publisher = PolicyPublisher(BASE, encoding="dense-bf16")
    update = step(publisher, 0.5)  # norm exactly 1.0
    follower = PolicyFollower(BASE, max_delta_norm=bound)
    if not refused:
        follower.apply(update)
        assert follower.version == 1 and follower.state_sha256 == update.state_sha256
        return
    with pytest.raises(DeltaTooLarge, match=r"delta v0->v1 moves the policy by L2 norm 1, over the bound 0.999") \
            as info:
        follower.apply(update)
    assert (info.value.norm, info.value.bound) == (1.0, 0.999)
    assert follower.version == 0 and follower.state_sha256 == state_hash(BASE)


def test_a_snapshot_is_bounded_by_the_steps_it_stands_for() -> None:
    publisher = PolicyPublisher(BASE, encoding="dense-bf16")
    step(publisher, 0.5)
    step(publisher, 0.5)  # v2 is 2.0 away from v0: two steps of 1.0
    snapshot = publisher.snapshot()
    with pytest.raises(DeltaTooLarge, match=r"snapshot v2 \(2 steps from our v0\)"):
        PolicyFollower(BASE, max_delta_norm=0.99).apply(snapshot)  # 2.0 > 2 * 0.99
    assert PolicyFollower(BASE, max_delta_norm=1.01).apply(snapshot)["w"].tolist() == [2.0] * 4
    # A follower with no state (a joiner after a lineage reset) has nothing to measure a snapshot against.
    empty = PolicyFollower(None, shapes={n: tuple(t.shape) for n, t in BASE.items()}, max_delta_norm=1e-9)
    empty.apply(snapshot)
    assert empty.version == 2
    with pytest.raises(ValueError, match="max_delta_norm"):
        PolicyFollower(BASE, max_delta_norm=float("nan"))


class Host:
    """A worker's sampling side with a tiny model; records what reaches its sampler."""

    def __init__(self) -> None:
        self.model = nn.Linear(2, 2)
        with torch.no_grad():
            self.model.weight.fill_(1.0)
            self.model.bias.zero_()
        self.loaded: list[int] = []

    def load_policy(self, state: dict[str, torch.Tensor], version: int) -> None:
        self.loaded.append(version)

    def generate_groups(self) -> Any:
        raise AssertionError("not used")


def publisher_for(host: Host) -> PolicyPublisher:
    from swarm_node.policy_sync.delta import model_state

    return PolicyPublisher(model_state(host.model), encoding="dense-bf16")


def test_a_refused_delta_never_reaches_the_sampler() -> None:
    host = Host()
    publisher = publisher_for(host)
    worker = Worker(host, kappa=1, max_staleness=1, max_delta_norm=1.5)
    small = publisher.publish({"weight": publisher.published_state()["weight"] + 0.5,  # norm 1.0
                               "bias": publisher.published_state()["bias"]})
    worker.apply(small)
    big = publisher.publish({"weight": publisher.published_state()["weight"] + 1.0,  # norm 2.0
                             "bias": publisher.published_state()["bias"]})
    with pytest.raises(DeltaTooLarge):
        worker.apply(big)
    assert host.loaded == [1] and worker.version == 1
    worker.reset()
    assert worker.follower.max_delta_norm == 1.5  # a reset keeps the bound


def test_the_default_bound_is_set_and_validated() -> None:
    from swarm_node.errors import ConfigError

    assert EchoConfig().max_delta_norm == 10.0
    with pytest.raises(ConfigError, match="echo.max_delta_norm must be >= 0"):
        EchoConfig(max_delta_norm=-1.0).validate()


# ------------------------------------------------------------------------------- only the followed learner's
async def test_a_forged_announce_for_the_learners_lineage_is_ignored() -> None:
    async with swarm([LEARNER, "mallory", "w0"], follows=[LEARNER]) as nodes:
        worker, mallory = nodes["w0"], nodes["mallory"]
        payload = payload_of(10_000, seed=7)
        forged = PolicyAnnounce(owner=LEARNER, version=2, base_version=1, size=len(payload),
                                sha256=b"\0" * 32, chunk_count=1, encoding="dense-bf16", created_at=time.time(),
                                chunk_sha256=(b"\0" * 32,), state_sha256=STATE, schedule="chain",
                                receivers=("w0",))
        await mallory.transport.publish(TOPIC_POLICY, encode(forged))  # signed by mallory, claims the learner
        with pytest.raises(ValueError, match="not owned by this node"):
            await publish(mallory, payload, ["w0"])
        # mallory's own lineage, relayed to w0: a worker that follows the learner does not take it.
        await mallory.publish("mallory", 1, 0, "dense-bf16", payload, STATE, ["w0"])
        real = await publish(nodes[LEARNER], payload_of(10_000, seed=8), ["w0"])
        announce, _ = await received(worker)
        assert announce == real and worker.held(LEARNER) == [real] and worker.held("mallory") == []
        assert worker.progress(LEARNER, 2, 1) is None  # the forgery was rejected by the gossip validator
        assert worker.completed.empty() and mallory.stats.served_chunks == 0


class CatalogRelay:
    """A relay's chunk-protocol handler answering every catalog request with the given announces."""

    def __init__(self, announces: list[PolicyAnnounce]) -> None:
        self.announces = announces

    async def __call__(self, stream: Stream) -> None:
        await stream.read(1 << 16)  # the request (whatever it asks, the answer is the same)
        for announce in self.announces:
            await stream.write(encode_frame(AnnounceFrame(encode(announce))))
        await stream.close()


async def test_a_relays_catalog_naming_another_owner_or_unsigned_by_the_learner_is_not_used() -> None:
    async with swarm([LEARNER, "relay", "w0"]) as nodes:
        worker = nodes["w0"]
        theirs = await nodes["relay"].publish("relay", 1, 0, "dense-bf16", payload_of(5000), STATE, [])
        claimed = PolicyAnnounce(owner=LEARNER, version=3, base_version=3, size=5000, sha256=b"\1" * 32,
                                 chunk_count=1, encoding="full", created_at=1.0, chunk_sha256=(b"\1" * 32,),
                                 state_sha256=STATE, schedule="", receivers=())
        await nodes["relay"].transport.serve_stream(PROTOCOL_ID, CatalogRelay([theirs, claimed]))
        assert await worker.catalog("relay", LEARNER) == [claimed]  # another owner's entry is dropped
        with pytest.raises(BroadcastError, match="no trusted announce"):
            await worker.fetch(LEARNER, 3, ["relay"])  # the relay's word is not the learner's


def fake_source(updates: list[tuple[PolicyAnnounce, bytes]], catalog: list[PolicyAnnounce] | None = None,
                fetched: tuple[PolicyAnnounce, bytes] | None = None,
                guard: PeerGuard | None = None) -> tuple[WorkerSource, Host, list[str]]:
    """A WorkerSource over fakes: a broadcaster whose queue holds `updates`, a net that runs calls at once."""
    host, logs = Host(), []
    source = WorkerSource.__new__(WorkerSource)
    completed: asyncio.Queue[tuple[PolicyAnnounce, bytes]] = asyncio.Queue()
    for item in updates:
        completed.put_nowait(item)

    async def get_catalog(peer: str, owner: str) -> list[PolicyAnnounce]:
        return catalog or []

    async def fetch(owner: str, version: int, peers: list[str], base_version: int | None = None) -> Any:
        assert fetched is not None
        return fetched

    source.broadcaster = types.SimpleNamespace(completed=completed, catalog=get_catalog, fetch=fetch)  # type: ignore
    source.net = types.SimpleNamespace(call=lambda fn: asyncio.run(fn(None)), drain=lambda topic: [])  # type: ignore
    source.events = types.SimpleNamespace(log=logs.append)  # type: ignore[assignment]
    source.guard = guard  # type: ignore[assignment]
    source.stats, source.learner_id, source.me, source.limits = NodeStats(), LEARNER, "w0", Limits()
    source.worker = Worker(host, kappa=1, max_staleness=1, max_delta_norm=1.5)
    source.peer_events = deque()
    return source, host, logs


def announce_of(update: PolicyUpdate, owner: str) -> PolicyAnnounce:
    return PolicyAnnounce(owner=owner, version=update.version, base_version=update.base_version, size=update.size,
                          sha256=update.sha256, chunk_count=1, encoding=update.encoding, created_at=1.0,
                          chunk_sha256=(update.sha256,), state_sha256=update.state_sha256, schedule="",
                          receivers=())


def test_the_worker_applies_only_its_learners_updates_and_refuses_oversized_ones() -> None:
    publisher = publisher_for(Host())
    update = step_weight(publisher, 0.5)
    source, host, _ = fake_source([(announce_of(update, "mallory"), update.payload)])
    source.take_updates()  # another owner's update, however it got here, is not applied
    assert host.loaded == [] and source.stats.dropped["not_followed"] == 1
    # A catch-up whose fetched announce names another owner is not applied either.
    source, host, _ = fake_source([], catalog=[announce_of(update, LEARNER)],
                                  fetched=(announce_of(update, "relay"), update.payload))
    source.catch_up()
    assert host.loaded == [] and source.stats.dropped["not_followed"] == 1
    # The learner's own update, over the bound: refused and counted, the sampler never sees it.
    big = step_weight(publisher_for(Host()), 1.0)
    source, host, logs = fake_source([(announce_of(big, LEARNER), big.payload)])
    source.take_updates()
    assert host.loaded == [] and source.stats.dropped["delta_norm"] == 1 and "over the bound 1.5" in logs[-1]
    source, host, _ = fake_source([(announce_of(update, LEARNER), update.payload)])
    source.take_updates()
    assert host.loaded == [1] and not source.stats.dropped


def step_weight(publisher: PolicyPublisher, by: float) -> PolicyUpdate:
    state = publisher.published_state()
    return publisher.publish({"weight": state["weight"] + by, "bias": state["bias"]})


# ------------------------------------------------------------------------------------------ bad relays are scored
async def test_a_relay_sending_a_corrupted_chunk_is_reported_and_the_version_still_completes() -> None:
    payload = payload_of(100_000, seed=2)
    async with swarm([LEARNER, *WORKERS], corrupt=("w0",)) as nodes:
        events: dict[str, list[tuple[str, str]]] = {w: [] for w in WORKERS}
        for w in WORKERS:
            nodes[w]._puller.on_peer_event = lambda peer, reason, w=w: events[w].append((peer, reason))
        await publish(nodes[LEARNER], payload, WORKERS)
        for w in WORKERS:
            assert (await received(nodes[w]))[1] == payload
        # w0 relays stripe 0 to w2 and w4 (see test_broadcast): each reports it once, then pulls from the learner.
        assert events == {"w0": [], "w1": [], "w2": [("w0", "bad_chunk")], "w3": [], "w4": [("w0", "bad_chunk")],
                          "w5": []}


def test_a_bad_chunk_costs_reputation_through_the_worker() -> None:
    assert DEFAULT_WEIGHTS["bad_chunk"] < 0
    guard = PeerGuard(Reputation(ReputationParams()))
    source, _, _ = fake_source([], guard=guard)
    for _ in range(4):  # four bad chunks within the half-life: graylisted (-20), like a bad gossip peer
        source.peer_events.append(("w0", "bad_chunk"))
    source.score_peers()
    assert source.stats.dropped["bad_chunk"] == 4 and guard.blocked("w0")
    assert not source.peer_events
