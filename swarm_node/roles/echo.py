"""`swarm-node join --role learner|worker`: the ECHO-2 roles of `echo.py` on a real libp2p network.

Wiring only (the logic is in echo.py, staleness.py, delta.py, broadcast.py, activation.py):
- Learner: its workers publish rollout groups for the learner's policy (policy id = the learner's peer id,
  signed by the worker, accepted because the worker announced on the status topic that it follows us); every group
  is re-scored by our verifier; `Learner` trains on B groups within the bound S; each update goes out through the
  pipelined broadcast to the workers heard from recently, and a full snapshot every `echo.snapshot_every` updates
  (and at start) is kept for late joiners. A `WorkerActivator` sends start/stop control messages by measured
  throughput (and cost, if workers report one).
- Worker: heartbeats a Status (follows = the learner) every `echo.heartbeat_s`; applies the learner's updates in
  order as the broadcast completes them (a gap or a hash mismatch fetches the newest snapshot instead); generates
  when `Worker.may_generate()` and the learner has not stopped it; publishes its groups tagged with the published
  version it sampled with. It runs `run.steps` batches (or until Ctrl-C).
A network failure never stops either role: a call that fails is counted and logged, and the loop goes on.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import math
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from protocol.codec import decode, encode
from protocol.limits import Limits
from protocol.messages import TOPIC_CONTROL, TOPIC_STATUS, PolicyAnnounce, Status, WorkerControl
from protocol.validation import AcceptPolicy, ReplayGuard, validate_gossip
from swarm_node.config import NodeConfig
from swarm_node.echo.activation import Demand, WorkerActivator, WorkerReport
from swarm_node.echo.learner import Learner
from swarm_node.echo.worker import Worker
from swarm_node.node.core import METRICS_FILE, Node, NodeEvents, RunSummary
from swarm_node.policy_sync.broadcast import BroadcastError, PolicyBroadcaster
from swarm_node.policy_sync.delta import DeltaError, PolicyUpdate
from swarm_node.roles.peer import BackgroundExchange, start_libp2p
from swarm_node.sharing.exchange import TransportExchange, accept_policy_for
from swarm_node.sharing.rescore import accept_external
from swarm_node.sharing.wire import group_id_for, to_wire
from swarm_node.status.stats import NodeStats
from swarm_node.transport.background import BackgroundTransport
from swarm_node.transport.base import TransportError, ValidationResult


def _gossip_validator(topic: str, limits: Limits, cfg_policy: AcceptPolicy) -> Callable[[str, bytes], ValidationResult]:
    replay = ReplayGuard(limits.max_age_s)

    def validate(signer: str, data: bytes) -> ValidationResult:
        result = validate_gossip(topic, data, signer, limits=limits, policy=cfg_policy, now=time.time(),
                                 replay=replay)
        return ValidationResult.of(result.verdict)
    return validate


COST_CAPABILITY = "cost_per_hour:"  # a worker's price travels as a Status capability, e.g. "cost_per_hour:0.35"


def reported_cost(capabilities: tuple[str, ...]) -> float:
    """The price a worker states in its Status (0 if absent or malformed: it is untrusted and only ranks workers)."""
    for cap in capabilities:
        if cap.startswith(COST_CAPABILITY):
            try:
                value = float(cap.removeprefix(COST_CAPABILITY))
            except ValueError:
                return 0.0
            return value if math.isfinite(value) and value >= 0 else 0.0
    return 0.0


def _update_of(announce: PolicyAnnounce, payload: bytes) -> PolicyUpdate:
    return PolicyUpdate(announce.version, announce.base_version, announce.encoding, payload, announce.sha256,
                        announce.state_sha256)


def _start_channels(net: BackgroundTransport, cfg: NodeConfig, limits: Limits, policy: AcceptPolicy, follows: str,
                    inbox_topic: str) -> tuple[TransportExchange, PolicyBroadcaster]:
    """Both roles: the rollout exchange, the policy broadcast for `follows`' lineage, and a validated inbox for
    the small messages this role receives (status for a learner, control for a worker), all started."""
    echo = cfg.echo
    exchange = TransportExchange(net.transport, limits, policy)
    broadcaster = PolicyBroadcaster(net.transport, limits=limits, chunk_bytes=echo.chunk_bytes,
                                    schedule=echo.schedule, keep=echo.keep_versions, follows=[follows])
    net.set_validator(inbox_topic, _gossip_validator(inbox_topic, limits, policy))
    net.subscribe_queue(inbox_topic)
    net.call(lambda _t: exchange.start())
    net.call(lambda _t: broadcaster.start())
    return exchange, broadcaster


def run_echo_role(cfg: NodeConfig, stats: NodeStats, events: NodeEvents) -> RunSummary:
    identity, net = start_libp2p(cfg, stats, events)
    node: Node | None = None
    try:
        node = Node(cfg, stats, events)
        node.setup()
        if cfg.network.role == "learner":
            return _run_learner(cfg, node, net, identity.peer_id, stats, events)
        return _run_worker(cfg, node, net, identity.peer_id, stats, events)
    finally:
        if node is not None:
            node.close()
        net.stop()


# ----------------------------------------------------------------------------------------------------- learner
def _run_learner(cfg: NodeConfig, node: Node, net: BackgroundTransport, me: str, stats: NodeStats,
                 events: NodeEvents) -> RunSummary:
    echo = cfg.echo
    limits = Limits(vocab_size=len(node.tokenizer))
    learner = Learner(node, echo.encoding, echo.publish_every, echo.keep_versions)
    delegates: dict[str, frozenset[str]] = {me: frozenset()}
    policy = dataclasses.replace(accept_policy_for(node.task_source, frozenset({node.tokenizer_hash})),
                                 delegates=delegates)
    exchange, broadcaster = _start_channels(net, cfg, limits, policy, follows=me, inbox_topic=TOPIC_STATUS)
    activator = WorkerActivator()
    workers: dict[str, WorkerReport] = {}
    active: set[str] = set()
    updates = [0]
    completion_tokens = [0, 0]  # tokens, completions received: converts workers' tokens/s into rollouts/s
    train_s: list[float] = []
    events.log(f"learner: workers follow this node with --role worker --learner {me}")

    published: set[tuple[int, int]] = set()

    def publish(update: PolicyUpdate, receivers: list[str]) -> None:
        key = (update.version, update.base_version)
        if key in published:  # held and served already (e.g. two workers joined at one version)
            return
        try:
            net.call(lambda _t: broadcaster.publish(me, update.version, update.base_version, update.encoding,
                                                    update.payload, update.state_sha256, receivers))
            published.add(key)
        except (TransportError, BroadcastError, TimeoutError, ValueError) as exc:
            stats.count("errors", "publish_failed")
            events.log(f"warning: policy v{update.version} not published: {exc}")

    publish(learner.publisher.snapshot(), [])  # version 0 for joiners whose base differs

    def poll_workers() -> None:
        now = time.time()
        for delivery in net.drain(TOPIC_STATUS):
            msg = decode(delivery.data, limits)
            if isinstance(msg, Status) and msg.role == "worker" and msg.follows == me:
                per_rollout = completion_tokens[0] / completion_tokens[1] if completion_tokens[1] else 0.0
                rate = msg.throughput / per_rollout if per_rollout > 0 and msg.throughput > 0 else None
                workers[delivery.from_peer] = WorkerReport(delivery.from_peer, reported_cost(msg.capabilities), now,
                                                           rate)
                if delivery.from_peer not in delegates[me]:
                    events.log(f"learner: worker {delivery.from_peer} joined")
                    delegates[me] = delegates[me] | {delivery.from_peer}
                    active.add(delivery.from_peer)
                    if learner.publisher.version > 0:  # a late joiner starts from a snapshot of the current policy
                        publish(learner.publisher.snapshot(), [])
        if not workers:
            return
        demand = Demand(rollouts_per_step=cfg.run.prompts_per_step * cfg.run.group_size,
                        learner_step_s=max(statistics.median(train_s[-10:]), 1e-3) if train_s else 1.0,
                        kappa=echo.publish_every)
        decision = activator.decide(now, demand, list(workers.values()))
        for peer, action in [(p, "start") for p in decision.start] + [(p, "stop") for p in decision.stop]:
            try:
                net.publish(TOPIC_CONTROL, encode(WorkerControl(peer, action, now)))
                (active.add if action == "start" else active.discard)(peer)
            except TransportError as exc:
                events.log(f"warning: could not send {action} to {peer}: {exc}")

    def step() -> dict[str, Any] | None:
        poll_workers()
        now = time.time()
        for item in exchange.drain():
            if item.group is None:
                stats.count("dropped", item.reason)
                continue
            outcome = accept_external(item.group, item.sender, node.share_ctx, now, delegates,
                                              keep_no_signal=True)
            if outcome.forged_reward:
                stats.count("errors", "forged_reward")
            if outcome.external is None:
                stats.count("dropped", outcome.reason)
                continue
            group = outcome.external.group
            completion_tokens[0] += sum(len(c.token_ids) for c in group.completions)
            completion_tokens[1] += len(group.completions)
            learner.offer([group])
        if not learner.ready():
            time.sleep(0.05)
            return None
        metrics, update = learner.train()
        train_s.append(metrics["train_s"])
        if update is not None:
            updates[0] += 1
            publish(update, sorted(active & delegates[me]))
            if updates[0] % echo.snapshot_every == 0:
                publish(learner.publisher.snapshot(), [])
        metrics["workers"] = len(active)
        return metrics

    node.stepper = step
    return node.run()


# ------------------------------------------------------------------------------------------------------ worker
def _run_worker(cfg: NodeConfig, node: Node, net: BackgroundTransport, me: str, stats: NodeStats,
                events: NodeEvents) -> RunSummary:
    echo = cfg.echo
    learner_id = cfg.network.learner
    limits = Limits(vocab_size=len(node.tokenizer))
    worker = Worker(node, echo.keep_versions)
    # Workers started with the same --seed would draw the same tasks and samples: salt both with the peer id.
    salt = int.from_bytes(hashlib.sha256(me.encode()).digest()[:4], "little")
    node.rng.seed(cfg.run.seed * 2**32 + salt)
    node.draws = salt << 16
    exchange, broadcaster = _start_channels(net, cfg, limits, accept_policy_for(node.task_source),
                                            follows=learner_id, inbox_topic=TOPIC_CONTROL)
    outbox = BackgroundExchange(exchange, net, events, stats)
    state = {"active": True, "last_heartbeat": 0.0, "busy_s": 0.0, "tokens": 0}
    metrics_path = Path(cfg.run.run_dir) / METRICS_FILE
    events.log(f"worker: following learner {learner_id}")

    def heartbeat() -> None:
        now = time.time()
        if now - state["last_heartbeat"] < echo.heartbeat_s:
            return
        state["last_heartbeat"] = now
        rate = state["tokens"] / state["busy_s"] if state["busy_s"] > 0 else 0.0  # tokens/s while generating
        try:
            net.publish(TOPIC_STATUS, encode(Status("worker", (f"sampler:{cfg.sampler.kind}",
                                                               f"{COST_CAPABILITY}{echo.cost_per_hour:g}"), rate,
                                                    max(worker.version, 0), learner_id, now)))
        except TransportError as exc:
            events.log(f"warning: status not sent: {exc}")

    def take_updates() -> None:
        async def drain() -> list[tuple[PolicyAnnounce, bytes]]:
            got = []
            while not broadcaster.completed.empty():
                got.append(broadcaster.completed.get_nowait())
            return got

        for announce, payload in sorted(net.call(lambda _t: drain()), key=lambda x: x[0].version):
            if announce.version <= worker.version:
                continue
            try:
                worker.apply(_update_of(announce, payload))
            except DeltaError as exc:
                events.log(f"worker: update v{announce.version} not applicable ({exc}); catching up")
                catch_up()
        for delivery in net.drain(TOPIC_CONTROL):
            msg = decode(delivery.data, limits)
            if isinstance(msg, WorkerControl) and delivery.from_peer == learner_id and msg.target == me:
                state["active"] = msg.action == "start"
                events.log(f"worker: learner says {msg.action}")

    def catch_up() -> None:
        """Fetch what we missed from the learner: the kept deltas from our version on, else its newest snapshot."""
        try:
            while True:
                held = net.call(lambda _t: broadcaster.catalog(learner_id, learner_id))
                if held and (max(a.version for a in held) < worker.version or any(
                        a.version == a.base_version == worker.version and a.state_sha256 != worker.state_sha256()
                        for a in held)):
                    events.log("worker: the learner restarted its policy lineage; following it from a snapshot")
                    worker.reset()
                delta = next((a for a in held if a.base_version == worker.version < a.version), None)
                snaps = [a for a in held if a.base_version == a.version > worker.version]
                pick = delta or (max(snaps, key=lambda a: a.version) if snaps else None)
                if pick is None:
                    return
                version, base = pick.version, pick.base_version
                announce, payload = net.call(lambda _t, v=version, b=base: broadcaster.fetch(
                    learner_id, v, [learner_id], base_version=b))
                worker.apply(_update_of(announce, payload))
        except (TransportError, BroadcastError, DeltaError, TimeoutError, asyncio.TimeoutError) as exc:
            stats.count("errors", "catch_up_failed")
            events.log(f"warning: could not catch up with the learner: {exc}")

    stats.set_phase("sampling")
    catch_up()  # joining a learner that already trained: start from its current policy
    waiting_since = time.monotonic()
    with open(metrics_path, "a") as out:
        try:
            while worker.batches < cfg.run.steps:
                heartbeat()
                take_updates()
                if not (state["active"] and worker.may_generate()):
                    if time.monotonic() - waiting_since > 2 * echo.heartbeat_s:  # updates stopped reaching us
                        before = worker.version
                        catch_up()
                        if worker.version == before and state["active"]:
                            worker.forgiven += 1  # nothing newer exists: the learner waits for a batch it lost
                        waiting_since = time.monotonic()
                    time.sleep(0.05)
                    continue
                waiting_since = time.monotonic()
                version = worker.version
                groups, gen_s, tokens = worker.generate()
                state["busy_s"] += gen_s
                state["tokens"] += tokens
                now = time.time()
                outbox.publish([to_wire(g, learner_id, version, node.tokenizer_hash, "", now,
                                                group_id_for(me, worker.batches, i, cfg.run.seed))
                                for i, g in enumerate(groups)])
                rewards = [r for g in groups for r in g.rewards]
                row = {"step": worker.batches, "policy_version": version, "reward_mean": sum(rewards) / len(rewards),
                       "accuracy": sum(g.accuracy for g in groups) / len(groups), "gen_s": gen_s,
                       "tokens_per_s": tokens / gen_s if gen_s > 0 else 0.0, "time": now}
                out.write(json.dumps(row) + "\n")
                out.flush()
                node.step = worker.batches
                stats.record_step(row)
                if events.on_step is not None:
                    events.on_step(row)
        except KeyboardInterrupt:
            events.log("interrupted")
            raise
    return RunSummary(worker.batches, None, None, None, Path(cfg.run.run_dir), 0)
