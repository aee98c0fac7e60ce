"""bench.gossip's node process (`python -m bench.gossip --worker --path P --isolation I`): one LibP2PTransport and
one exchange path, answering the orchestrator's JSON-line commands (bench/child.py).

Contract:
- `PATHS[name](transport)`: the node of a path, named as join's `share.fanin`: "flood" (`FloodNode`: RolloutBatches
  on the rollout topic, `gossip_groups.publish_groups`) or "bounded" (`BoundedNode`: bench/gossip_fanin.py's
  FaninNode). Each has `topic` (what the mesh waits on), `deliveries` (`gossip_groups.Deliveries`, in groups),
  `attach()` (before the transport starts), `offer(cmd)` (a "go" command's groups; returns publish errors),
  `stats()` (extra fields of a "stats" answer) and `close()`.
- `worker(isolation, path)`: answers "connect", "wait_subscribed", "go" {t0, count, rate, batch, batch_delay_ms}
  -> "done", "stats" -> {received, latencies, last_rx, counters, ...}, "send_blob" {peer, repeat} -> "blob",
  "train" {seconds} -> "trained", until "quit".
- The groups both paths offer: `rollout_group(peer_id, index)`, 8 completions x 64 tokens (~5 KB), 1 to 7 of them
  right (every group carries a signal), drawn from `COMPLETION_VARIANTS` cached variants (a node has its
  completions in hand when it publishes: drawing them is not timed); `accept_policy()` and `make_validator()` are
  what the nodes accept.
- `train_for(seconds)`: a stand-in training loop (bench.gossip_arch).
"""

from __future__ import annotations

import asyncio
import functools
import os
import random
import time
from typing import Any

from bench.child import emit, mesh_commands, serve
from protocol.messages import TOPIC_ROLLOUTS

STREAM_PROTOCOL = "/swarm-node/bench-blob/1.0.0"
BLOB_BYTES = 20 << 20


def rollout_message(peer_id: str, index: int) -> bytes:
    from protocol.codec import encode
    from protocol.messages import RolloutBatch

    return encode(RolloutBatch((rollout_group(peer_id, index),)))


def rollout_group(peer_id: str, index: int) -> Any:
    from protocol.messages import RolloutGroup, TaskRefWire

    return RolloutGroup(
        group_id=os.urandom(16), policy_id=peer_id, policy_version=index, task=TaskRefWire("chain_sum", "{}", 0, index),
        completions=sample_completions(index % COMPLETION_VARIANTS), tokenizer_hash="char-v1", model_family="qwen2",
        created_at=time.time())


COMPLETION_VARIANTS = 256  # a node has its completions in hand when it publishes: drawing them is not timed


@functools.lru_cache(maxsize=COMPLETION_VARIANTS)
def sample_completions(seed: int) -> tuple[Any, ...]:
    from protocol.messages import CompletionWire

    rng = random.Random(seed)
    winners = 1 + seed % 7  # 1 to 7 of 8 right: every group carries a signal (the bounded path pulls only those)
    return tuple(CompletionWire(tuple(rng.randrange(64) for _ in range(64)), "12+30=42 " * 7,
                                tuple(-rng.random() for _ in range(64)), float(j < winners)) for j in range(8))


def accept_policy() -> Any:
    """The tasks the bench's nodes take (both paths): chain_sum, any index."""
    from protocol.validation import AcceptPolicy

    return AcceptPolicy(tasks=frozenset({("chain_sum", "{}")}), max_index=1 << 30)


def make_validator(accepted: Any = None) -> Any:
    """The node's rollout validator; with `accepted` (an AcceptedMessages), what it accepts is kept for delivery."""
    from protocol.limits import Limits
    from protocol.messages import TOPIC_ROLLOUTS
    from protocol.validation import ReplayGuard, validate_gossip
    from swarm_node.transport.base import ValidationResult

    limits = Limits(vocab_size=64)
    policy = accept_policy()
    replay = ReplayGuard(limits.max_age_s)

    def validate(signer: str, data: bytes) -> ValidationResult:
        result = validate_gossip(TOPIC_ROLLOUTS, data, signer, limits=limits, policy=policy, now=time.time(),
                                 replay=replay)
        if accepted is not None and result.message is not None:
            accepted.remember(data, result.message)
        return ValidationResult[result.verdict.name]

    return validate


class FloodNode:
    """The flood path (`share.fanin = "flood"`): every group gossiped on the rollout topic as RolloutBatches of at
    most `batch` groups; `deliveries` counts the groups of each delivery (`gossip_groups.delivered_groups`)."""

    topic = TOPIC_ROLLOUTS

    def __init__(self, transport: Any) -> None:
        from bench.gossip_groups import Deliveries
        from protocol.limits import Limits
        from swarm_node.sharing.accepted import AcceptedMessages

        self.transport = transport
        self.deliveries = Deliveries()
        self.limits = Limits(vocab_size=64)
        self.accepted = AcceptedMessages()  # as the node's exchange does: a delivery is not decoded twice

    async def attach(self) -> None:
        self.transport.set_validator(TOPIC_ROLLOUTS, make_validator(self.accepted))
        await self.transport.subscribe(TOPIC_ROLLOUTS, self.on_delivery)

    def on_delivery(self, delivery: Any) -> None:
        from bench.gossip_groups import delivered_groups

        now = time.time()
        _, group_latencies = delivered_groups(delivery.data, self.limits, now, self.accepted)  # groups, not messages
        self.deliveries.add(delivery.from_peer, group_latencies, now)

    async def offer(self, cmd: dict[str, Any]) -> int:
        from bench.gossip_groups import publish_groups
        from swarm_node.sharing.batching import BatchPolicy

        policy = BatchPolicy(cmd.get("batch", 1), cmd.get("batch_delay_ms", 50) / 1000)
        return await publish_groups(lambda data: self.transport.publish(TOPIC_ROLLOUTS, data),
                                    lambda i: rollout_group(self.transport.peer_id, i), cmd["count"], cmd["t0"],
                                    cmd.get("rate"), policy)

    def stats(self) -> dict[str, Any]:
        return {}

    async def close(self) -> None:
        pass


class BoundedNode:
    """The bounded fan-in path (`share.fanin = "bounded"`, join's default): bench/gossip_fanin.py's FaninNode."""

    def __init__(self, transport: Any) -> None:
        from bench.gossip_fanin import FaninNode
        from protocol.limits import Limits

        self.node = FaninNode(transport, Limits(vocab_size=64), accept_policy(),
                              lambda i: rollout_group(transport.peer_id, i))
        self.topic, self.deliveries = self.node.topic, self.node.deliveries

    async def attach(self) -> None:
        await self.node.attach()

    async def offer(self, cmd: dict[str, Any]) -> int:
        return await self.node.offer(cmd["count"], cmd["t0"], cmd.get("rate"))

    def stats(self) -> dict[str, Any]:
        return self.node.stats()

    async def close(self) -> None:
        await self.node.close()


PATHS: dict[str, Any] = {"bounded": BoundedNode, "flood": FloodNode}  # join's `share.fanin` names


async def worker(isolation: str, path: str) -> None:
    from swarm_node.identity import generate
    from swarm_node.transport.libp2p.ipc import HostSettings
    from swarm_node.transport.libp2p.launch import LibP2PConfig
    from swarm_node.transport.libp2p.transport import LibP2PTransport

    config = LibP2PConfig(host=HostSettings(listen=("/ip4/127.0.0.1/tcp/0",)), isolation=isolation)
    transport = LibP2PTransport(generate(), config)
    node = PATHS[path](transport)
    deliveries = node.deliveries

    async def blob_sink(stream: Any) -> None:
        got = 0
        while chunk := await stream.read(1 << 20):
            got += len(chunk)
        await stream.write(got.to_bytes(8, "big"))
        await stream.close()

    await node.attach()
    await transport.serve_stream(STREAM_PROTOCOL, blob_sink)
    await transport.start()
    loop = asyncio.get_running_loop()
    trainer_steps: list[float] = []

    async def go(cmd: dict[str, Any]) -> dict[str, Any]:
        deliveries.clear()  # each round is measured on its own
        await asyncio.sleep(max(0.0, cmd["t0"] - time.time()))
        errors = await node.offer(cmd)
        return {"event": "done", "t_end": time.time(), "errors": errors}

    async def stats(_cmd: dict[str, Any]) -> dict[str, Any]:
        return {"event": "stats", "received": deliveries.received, "latencies": deliveries.latencies,
                "last_rx": deliveries.last_rx, "counters": await transport.host_counters(),
                "trainer_steps": trainer_steps, **node.stats()}

    async def send_blob(cmd: dict[str, Any]) -> dict[str, Any]:
        blob = os.urandom(BLOB_BYTES)
        times = []
        for _ in range(cmd["repeat"]):
            t0 = time.perf_counter()
            stream = await transport.open_stream(cmd["peer"], STREAM_PROTOCOL)
            await stream.write(blob)
            await stream.close()
            ack = int.from_bytes(await stream.read_exactly(8), "big")
            times.append(time.perf_counter() - t0)
            assert ack == BLOB_BYTES, ack
        return {"event": "blob", "seconds": times}

    async def train(cmd: dict[str, Any]) -> dict[str, Any]:
        # A stand-in training loop on the main thread: torch matmuls (release the GIL) plus Python work
        # (hold it), the mix of a small-model RL step. Gossip keeps arriving on the loop meanwhile.
        trainer_steps[:] = await loop.run_in_executor(None, train_for, cmd["seconds"])
        return {"event": "trained", "steps": len(trainer_steps)}

    emit(event="ready", peer_id=transport.peer_id, addr=transport.listen_addrs()[0])
    await serve({**mesh_commands(transport, node.topic), "go": go, "stats": stats, "send_blob": send_blob,
                 "train": train})
    await node.close()
    await transport.stop()


def train_for(seconds: float) -> list[float]:
    import torch

    torch.set_num_threads(1)
    weight = torch.randn(256, 256)
    x = torch.randn(64, 256)
    steps: list[float] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        for _ in range(20):
            x = torch.tanh(x @ weight)
        _ = sum(i * i for i in range(20_000))  # Python-side work: sampling bookkeeping, batching, logging
        steps.append(time.perf_counter() - t0)
    return steps
