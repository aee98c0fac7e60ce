"""`swarm-node join --role learner`: an ECHO-2 learner on a real libp2p network (wiring and I/O only).

Its workers publish rollout groups for the learner's policy (policy id = our peer id, signed by the worker,
accepted because the worker announced on the status topic that it follows us: echo/admission.py decides); every
group goes through the one ingest path (re-scored by our verifier) into the learner's buffer; the buffer is the
node loop's rollout source (`LearnerSource`): B groups within the bound S make a draft. Each update goes out
through the pipelined broadcast to the active workers, and a full snapshot every `echo.snapshot_every` updates
(and at start, when a worker joins late, and when a worker is stranded: echo/catch_up.stranded) is kept for late
joiners. A `WorkerActivator` sends start/stop control messages by measured throughput (and cost, if workers report
one). A failed network call is counted and logged; the loop goes on.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from typing import Any

from protocol.codec import decode, encode
from protocol.messages import TOPIC_CONTROL, TOPIC_STATUS, PolicyAnnounce, Status, WorkerControl
from swarm_node.config import NodeConfig
from swarm_node.echo.activation import WorkerActivator
from swarm_node.echo.admission import Admission
from swarm_node.node.assembly import Assembly, Sharing
from swarm_node.node.run_files import NodeEvents, RunSummary
from swarm_node.node.sources import BaseSource, Item
from swarm_node.policy_sync.broadcast import BroadcastError, PolicyBroadcaster
from swarm_node.policy_sync.delta import PolicyUpdate
from swarm_node.roles.wiring import joined, start_exchange, start_inbox
from swarm_node.sharing.exchange import TransportExchange, accept_policy_for
from swarm_node.sharing.rescore import External
from swarm_node.status.stats import NodeStats
from swarm_node.transport.background import BackgroundTransport
from swarm_node.transport.base import TransportError


class LearnerSource(BaseSource):
    """The learner's buffer as the node loop's rollout source; polls workers and ingests between drafts."""

    def __init__(self, assembly: Assembly, net: BackgroundTransport, me: str, events: NodeEvents) -> None:
        node = assembly.node
        self.cfg, self.net, self.me, self.events, self.stats = node.cfg, net, me, events, node.stats
        self.learner = assembly.learner()
        self.admission = Admission(me)
        self.activator = WorkerActivator()
        self.limits = node.wire_limits()
        policy = dataclasses.replace(accept_policy_for(node.task_source, frozenset({node.tokenizer_hash})),
                                     delegates=self.admission.delegates)
        self.ingest = assembly.ingest(self.admission.delegates, keep_no_signal=True)
        self.exchange: TransportExchange = start_exchange(net, assembly.open_exchange(net.transport, policy))
        echo = self.cfg.echo
        self.broadcaster = PolicyBroadcaster(net.transport, limits=self.limits, chunk_bytes=echo.chunk_bytes,
                                             schedule=echo.schedule, keep=echo.keep_versions, follows=[me])
        start_inbox(net, TOPIC_STATUS, self.limits, policy)
        net.call(lambda _t: self.broadcaster.start())
        self.updates = 0
        self.published_keys: set[tuple[int, int]] = set()
        self.publish(self.learner.publisher.snapshot(), [])  # version 0 for joiners whose base differs

    def publish(self, update: PolicyUpdate, receivers: list[str]) -> None:
        key = (update.version, update.base_version)
        if key in self.published_keys:  # held and served already (e.g. two workers joined at one version)
            return
        try:
            self.net.call(lambda _t: self.broadcaster.publish(self.me, update.version, update.base_version,
                                                              update.encoding, update.payload, update.state_sha256,
                                                              receivers))
            self.published_keys.add(key)
        except (TransportError, BroadcastError, TimeoutError, ValueError) as exc:
            self.stats.count("errors", "publish_failed")
            self.events.log(f"warning: policy v{update.version} not published: {exc}")

    async def held(self) -> list[PolicyAnnounce]:
        return self.broadcaster.held(self.me)  # read on the network loop, which mutates the store

    def poll_workers(self) -> None:
        now = time.time()
        for delivery in self.net.drain(TOPIC_STATUS):
            msg = decode(delivery.data, self.limits)
            if not isinstance(msg, Status):
                continue
            version = self.learner.publisher.version
            held = self.net.call(lambda _t: self.held()) if msg.policy_version < version else []  # else not stranded
            admitted = self.admission.on_status(delivery.from_peer, msg, now, version, held)
            if admitted.joined:
                self.events.log(f"learner: worker {delivery.from_peer} joined")
            if admitted.snapshot:  # a late joiner, or a worker stranded behind what we hold, needs a snapshot
                self.publish(self.learner.publisher.snapshot(), [])
        if not self.admission.workers:
            return
        demand = self.admission.demand(self.learner.batch_groups * self.cfg.run.group_size,
                                       self.cfg.echo.publish_every)
        decision = self.activator.decide(now, demand, list(self.admission.workers.values()))
        for peer, action in [(p, "start") for p in decision.start] + [(p, "stop") for p in decision.stop]:
            try:
                self.net.publish(TOPIC_CONTROL, encode(WorkerControl(peer, action, now)))
                (self.admission.started if action == "start" else self.admission.stopped)(peer)
            except TransportError as exc:
                self.events.log(f"warning: could not send {action} to {peer}: {exc}")

    def _buffer(self, ext: External, sender: str) -> list[tuple[str, str]]:
        group = ext.group
        self.admission.on_rollouts(sum(len(c.token_ids) for c in group.completions), len(group.completions))
        reason = self.learner.admit(group)
        return [(sender, reason)] if reason is not None else []

    def __iter__(self) -> Iterator[Item]:
        while True:
            self.poll_workers()
            self.ingest(self.exchange.drain(), time.time(), self._buffer)
            draft = self.learner.next_draft()
            if draft is None:
                time.sleep(0.05)
                continue
            yield draft

    def trained(self, metrics: dict[str, Any]) -> None:
        self.admission.on_trained(metrics["train_s"])
        update = self.learner.published(metrics)
        if update is not None:
            self.updates += 1
            self.publish(update, self.admission.receivers())
            if self.updates % self.cfg.echo.snapshot_every == 0:
                self.publish(self.learner.publisher.snapshot(), [])
        metrics["workers"] = len(self.admission.active)


def run(cfg: NodeConfig, stats: NodeStats, events: NodeEvents) -> RunSummary:
    with joined(cfg, stats, events, Sharing.ROLLOUTS) as (assembly, net, me):
        source = LearnerSource(assembly, net, me, events)
        events.log(f"learner: workers follow this node with --role worker --learner {me}")
        return assembly.node.run(source)
