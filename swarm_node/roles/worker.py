"""`swarm-node join --role worker`: an ECHO-2 worker following one learner on libp2p (wiring and I/O only).

It heartbeats a Status (follows = the learner) every `echo.heartbeat_s`; applies the learner's updates in order
as the broadcast completes them (a gap or a hash mismatch catches up: echo/catch_up.py decides which held update
to fetch, and when the learner restarted its lineage); generates when `Worker.may_generate()` and the learner has
not stopped it. Only updates of the followed learner (`network.learner`) are applied: the broadcaster keeps
announces its owner signed and that we follow, catch-up asks the learner itself, and every update is checked
again here before it reaches the worker; one that moves the policy past `echo.max_delta_norm` is refused (counted
`dropped`/`delta_norm`) and never fetched again (`Worker.refused`: catch-up waits for a later snapshot instead).
A broadcast relay that sends a bad chunk is scored in the node's reputation (`bad_chunk`), as a bad gossip peer is,
and a relay the node's peer guard blocks (graylisted, banned, denied) is not pulled from. `WorkerSource` is that
loop as a rollout source; `run` publishes each draft it yields (tagged with the published version it sampled with,
the node's tokenizer and model family) and records it as a step. It runs `run.steps` batches (or until Ctrl-C).
A failed network call is counted and logged; the loop goes on.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path

from protocol.codec import decode, encode
from protocol.messages import TOPIC_CONTROL, TOPIC_STATUS, PolicyAnnounce, Status, WorkerControl, policy_owner
from swarm_node.config import NodeConfig
from swarm_node.echo.admission import COST_CAPABILITY
from swarm_node.echo.catch_up import plan_catch_up
from swarm_node.node.assembly import Assembly, Sharing
from swarm_node.node.build import identity_seed
from swarm_node.node.run_files import METRICS_FILE, NodeEvents, RunSummary, StepLog
from swarm_node.policy_sync.broadcast import BroadcastError, PolicyBroadcaster
from swarm_node.policy_sync.delta import DeltaError, DeltaTooLarge, PolicyUpdate
from swarm_node.roles import apply_pause
from swarm_node.roles.wiring import BackgroundExchange, joined, start_exchange, start_inbox
from swarm_node.sharing.exchange import accept_policy_for
from swarm_node.sharing.wire import GroupSigner
from swarm_node.status.stats import NodeStats
from swarm_node.transport.background import BackgroundTransport
from swarm_node.transport.base import TransportError
from swarm_node.types import Draft


def update_of(announce: PolicyAnnounce, payload: bytes) -> PolicyUpdate:
    return PolicyUpdate(announce.version, announce.base_version, announce.encoding, payload, announce.sha256,
                        announce.state_sha256)


def draft_row(draft: Draft, step: int) -> dict[str, object]:
    """A worker's metrics line for one generated batch."""
    groups = draft.groups
    rewards = [r for g in groups for r in g.rewards]
    return {"step": step, "policy_version": draft.version, "reward_mean": sum(rewards) / len(rewards),
            "accuracy": sum(g.accuracy for g in groups) / len(groups), "gen_s": draft.gen_s,
            "tokens_per_s": draft.gen_tokens / draft.gen_s if draft.gen_s > 0 else 0.0, "time": time.time()}


class WorkerSource:
    """Batches generated for the learner, between heartbeats, policy updates, control messages and catch-ups."""

    def __init__(self, assembly: Assembly, net: BackgroundTransport, me: str, events: NodeEvents) -> None:
        node = assembly.node
        assert assembly.guard is not None, "a worker's assembly hears from peers (Sharing.ROLLOUTS)"
        self.cfg, self.net, self.me, self.events, self.stats = node.cfg, net, me, events, node.stats
        self.guard = assembly.guard
        self.learner_id = self.cfg.network.learner
        self.worker = assembly.worker(mid_apply=apply_pause.from_env())  # None: no test hook (the usual case)
        self.limits = node.wire_limits()
        policy = accept_policy_for(node.task_source)
        self.exchange = start_exchange(net, assembly.open_exchange(net.transport, policy))
        echo = self.cfg.echo
        # Bad relays, reported on the network thread, scored on ours (the reputation is not thread-safe).
        self.peer_events: deque[tuple[str, str]] = deque(maxlen=4096)
        self.broadcaster = PolicyBroadcaster(net.transport, limits=self.limits, chunk_bytes=echo.chunk_bytes,
                                             schedule=echo.schedule, keep=echo.keep_versions,
                                             follows=[self.learner_id],
                                             on_peer_event=lambda peer, reason: self.peer_events.append((peer, reason)),
                                             blocked=self.guard.blocked)
        start_inbox(net, TOPIC_CONTROL, self.limits, policy)
        net.call(lambda _t: self.broadcaster.start())
        self.active = True
        self.last_heartbeat = 0.0
        self.busy_s = 0.0
        self.tokens = 0

    def heartbeat(self) -> None:
        now = time.time()
        if now - self.last_heartbeat < self.cfg.echo.heartbeat_s:
            return
        self.last_heartbeat = now
        rate = self.tokens / self.busy_s if self.busy_s > 0 else 0.0  # tokens/s while generating
        caps = (f"sampler:{self.cfg.sampler.kind}", f"{COST_CAPABILITY}{self.cfg.echo.cost_per_hour:g}")
        try:
            self.net.publish(TOPIC_STATUS, encode(Status("worker", caps, rate, max(self.worker.version, 0),
                                                         self.learner_id, now)))
        except TransportError as exc:
            self.events.log(f"warning: status not sent: {exc}")

    def take_updates(self) -> None:
        async def drain() -> list[tuple[PolicyAnnounce, bytes]]:
            got = []
            while not self.broadcaster.completed.empty():
                got.append(self.broadcaster.completed.get_nowait())
            return got

        self.score_peers()
        for announce, payload in sorted(self.net.call(lambda _t: drain()), key=lambda x: x[0].version):
            if announce.version <= self.worker.version or not self.followed(announce):
                continue
            try:
                self.worker.apply(update_of(announce, payload))
            except DeltaTooLarge as exc:  # fetching it again would not change it: wait for a later snapshot
                self.refused(exc)
            except DeltaError as exc:
                self.events.log(f"worker: update v{announce.version} not applicable ({exc}); catching up")
                self.catch_up()
        for delivery in self.net.drain(TOPIC_CONTROL):
            msg = decode(delivery.data, self.limits)
            if isinstance(msg, WorkerControl) and delivery.from_peer == self.learner_id and msg.target == self.me:
                self.active = msg.action == "start"
                self.events.log(f"worker: learner says {msg.action}")

    def followed(self, announce: PolicyAnnounce) -> bool:
        """Whether an update is our learner's (the broadcaster only keeps those; checked again, counted if not)."""
        if announce.owner == self.learner_id and policy_owner(announce.owner) == self.learner_id:
            return True
        self.stats.count("dropped", "not_followed")
        self.events.log(f"warning: ignored policy v{announce.version} of {announce.owner[:80]!r}: we follow "
                        f"{self.learner_id}")
        return False

    def refused(self, exc: DeltaTooLarge) -> None:
        self.stats.count("dropped", "delta_norm")
        self.events.log(f"warning: refused a policy update: {exc}")

    def score_peers(self) -> None:
        """Hand what the broadcaster reported about relays (bad chunks) to the node's reputation."""
        if not self.peer_events:
            return
        now = time.time()
        while self.peer_events:
            peer, reason = self.peer_events.popleft()
            self.guard.record(peer, reason, now)
            self.stats.count("dropped", reason)
        self.guard.settle(now)

    def catch_up(self) -> None:
        """Fetch what we missed from the learner until `plan_catch_up` says we hold its newest policy."""
        learner, worker = self.learner_id, self.worker
        start = worker.version
        try:
            while True:
                held = self.net.call(lambda _t: self.broadcaster.catalog(learner, learner))
                plan = plan_catch_up(held, worker.version, worker.state_sha256(), worker.refused)
                if plan.reset:
                    self.events.log("worker: the learner restarted its policy lineage; following it from a snapshot")
                    worker.reset()
                if plan.fetch is None:
                    if worker.version != start:
                        self.events.log(f"worker: caught up with the learner at v{worker.version}")
                    return
                version, base = plan.fetch
                announce, payload = self.net.call(lambda _t, v=version, b=base: self.broadcaster.fetch(
                    learner, v, [learner], base_version=b))
                if not self.followed(announce):
                    return
                worker.apply(update_of(announce, payload))
        except DeltaTooLarge as exc:
            self.refused(exc)
        except (TransportError, BroadcastError, DeltaError, TimeoutError, asyncio.TimeoutError) as exc:
            self.stats.count("errors", "catch_up_failed")
            self.events.log(f"warning: could not catch up with the learner: {exc}")

    def __iter__(self) -> Iterator[Draft]:
        worker, heartbeat_s = self.worker, self.cfg.echo.heartbeat_s
        self.catch_up()  # joining a learner that already trained: start from its current policy
        waiting_since = time.monotonic()
        while True:
            self.heartbeat()
            self.take_updates()
            if not (self.active and worker.may_generate()):
                if time.monotonic() - waiting_since > 2 * heartbeat_s:  # updates stopped reaching us
                    before = worker.version
                    self.catch_up()
                    if worker.version == before and self.active:
                        worker.forgiven += 1  # nothing newer exists: the learner waits for a batch it lost
                    waiting_since = time.monotonic()
                time.sleep(0.05)
                continue
            waiting_since = time.monotonic()
            version = worker.version
            started = time.monotonic()
            groups, gen_s, tokens = worker.generate()
            self.busy_s += gen_s
            self.tokens += tokens
            yield Draft(groups, gen_s, tokens, started, version)


def publish_draft(signer: GroupSigner, outbox: BackgroundExchange, learner_id: str, me: str, draft: Draft,
                  batch: int) -> None:
    """A worker's batch on the wire: the learner's policy id, the version sampled with, signed by us."""
    outbox.publish(signer.wire(draft.groups, learner_id, draft.version, me, batch))


def run(cfg: NodeConfig, stats: NodeStats, events: NodeEvents) -> RunSummary:
    # Workers started with the same --seed would draw the same tasks and samples: each salts both with its id.
    with joined(cfg, stats, events, Sharing.ROLLOUTS, salt=identity_seed) as (assembly, net, me):
        source = WorkerSource(assembly, net, me, events)
        outbox = BackgroundExchange(source.exchange, net, events, stats)
        assert assembly.signer is not None
        events.log(f"worker: following learner {source.learner_id}")
        stats.set_phase("sampling")
        worker = source.worker
        with StepLog(Path(cfg.run.run_dir) / METRICS_FILE, stats, events) as log:
            try:
                for draft in source:
                    publish_draft(assembly.signer, outbox, source.learner_id, me, draft, worker.batches)
                    log.write(draft_row(draft, worker.batches))
                    if worker.batches >= cfg.run.steps:
                        break
            except KeyboardInterrupt:
                events.log("interrupted")
                raise
        return RunSummary(worker.batches, None, None, None, Path(cfg.run.run_dir), 0)
