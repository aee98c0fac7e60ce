"""A node for the NAT tests, run inside a network namespace: LibP2PTransport with the DHT rendezvous on, driven by
JSON lines. It dials only its bootstrap (no peer exchange): every other peer it meets comes through the DHT.

Events: {"event": "ready", "peer_id", "addrs", "started_at"}. Commands (answers carry "rid"): nat -> "nat"
{status}; publish {count} -> "published" {group_ids}; stats -> "stats" {delivered: {signer: [gid hex]},
first_at: {signer: unix time of its first group}, deltas: verified policy payloads received, peers};
echo {peer, data} -> "echo" {reply | error}: a stream to `peer` (through whatever connection we have);
publish_delta {version, size, receivers} -> "delta_published": a policy payload through the ECHO-2 pipelined
broadcast (policy_sync.PolicyBroadcaster: announce on gossip, chunks over streams); quit.
With --publish-every S the node publishes one rollout group every S seconds from its start.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import logging
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

from bench.child import Handler, emit, serve
from swarm_node.identity import generate
from swarm_node.policy_sync.broadcast import PolicyBroadcaster
from swarm_node.transport.base import Delivery, Stream, TransportError
from swarm_node.transport.libp2p.ipc import HostSettings
from swarm_node.transport.libp2p.launch import LibP2PConfig
from swarm_node.transport.libp2p.transport import LibP2PTransport
from swarm_node.transport.supervisor import Backoff
from tests.libp2p_helpers.rollouts import TOPIC, group_ids, protocol_validator, rollout_batch

ECHO = "/swarm-node/test-echo/1.0.0"


async def serve_echo(stream: Stream) -> None:
    data = await stream.read(1 << 16)
    await stream.write(b"echo:" + data)
    await stream.close()
    await stream.read()


async def echo_once(transport: LibP2PTransport, peer: str, data: str) -> dict[str, str]:
    """One round trip on the echo protocol: {"reply": ...} or {"error": ...}."""
    try:
        stream = await transport.open_stream(peer, ECHO)
        await stream.write(data.encode())
        await stream.close()
        reply = b""
        while chunk := await asyncio.wait_for(stream.read(), 10):
            reply += chunk
        return {"reply": reply.decode()}
    except (TransportError, asyncio.TimeoutError) as exc:
        return {"error": str(exc)}


async def publish_groups(transport: LibP2PTransport, numbers: Iterator[int], count: int) -> list[str]:
    """Publish `count` rollout groups, numbered from `numbers` (shared by everything this node publishes); their
    group ids (hex)."""
    gids = []
    for _ in range(count):
        gid, data = rollout_batch(transport.peer_id, next(numbers))
        await transport.publish(TOPIC, data)
        gids.append(gid.hex())
    return gids


def node_commands(transport: LibP2PTransport, numbers: Iterator[int]) -> dict[str, Handler]:
    """The commands every NAT test node answers: nat, publish and echo (the driver adds its own)."""
    async def nat(_cmd: dict[str, Any]) -> dict[str, Any]:
        return {"event": "nat", "status": await transport.nat_status()}

    async def publish(cmd: dict[str, Any]) -> dict[str, Any]:
        return {"event": "published", "group_ids": await publish_groups(transport, numbers, cmd["count"])}

    async def echo(cmd: dict[str, Any]) -> dict[str, Any]:
        return {"event": "echo", **await echo_once(transport, cmd["peer"], cmd["data"])}

    return {"nat": nat, "publish": publish, "echo": echo}


async def keep_bootstrap(transport: LibP2PTransport, addr: str) -> None:
    while True:
        if not await transport.peers():
            try:
                await transport.connect(addr)
            except TransportError:
                pass
        await asyncio.sleep(1.0)


async def main(args: argparse.Namespace) -> None:
    settings = HostSettings(listen=(args.listen,), rendezvous=TOPIC, relay_service=args.relay,
                            dht_interval_s=args.dht_interval, autonat_interval_s=2.0,
                            autonat_confirmations=args.confirmations)
    started_at = time.time()
    transport = LibP2PTransport(generate(), LibP2PConfig(host=settings, restart=Backoff(initial_s=0.2)))
    delivered: dict[str, list[str]] = {}
    first_at: dict[str, float] = {}
    deltas: list[int] = []

    def on_delivery(delivery: Delivery) -> None:
        first_at.setdefault(delivery.from_peer, time.time())
        delivered.setdefault(delivery.from_peer, []).extend(g.hex() for g in group_ids(delivery.data))

    broadcaster = PolicyBroadcaster(transport, chunk_bytes=64 << 10, keep=4,
                                    on_payload=lambda announce, payload: deltas.append(announce.version))
    await broadcaster.start()

    transport.set_validator(TOPIC, protocol_validator())
    await transport.subscribe(TOPIC, on_delivery)
    await transport.serve_stream(ECHO, serve_echo)
    await transport.start()
    tasks = [asyncio.ensure_future(keep_bootstrap(transport, args.bootstrap))] if args.bootstrap else []
    numbers = itertools.count(1)

    async def publish_regularly() -> None:
        while True:
            await asyncio.sleep(args.publish_every)
            try:
                await transport.publish(TOPIC, rollout_batch(transport.peer_id, next(numbers))[1])
            except TransportError:
                pass

    async def stats(_cmd: dict[str, Any]) -> dict[str, Any]:
        return {"event": "stats", "delivered": delivered, "first_at": first_at, "deltas": len(deltas),
                "peers": [p.peer_id for p in await transport.peers()]}

    async def publish_delta(cmd: dict[str, Any]) -> dict[str, Any]:
        await broadcaster.publish(transport.peer_id, cmd["version"], cmd["version"] - 1, "bench",
                                  os.urandom(cmd["size"]), "sha256:bench", cmd["receivers"])
        return {"event": "delta_published"}

    if args.publish_every > 0:
        tasks.append(asyncio.ensure_future(publish_regularly()))
    emit(event="ready", peer_id=transport.peer_id, addrs=transport.listen_addrs(), started_at=started_at)
    await serve({**node_commands(transport, numbers), "stats": stats, "publish_delta": publish_delta})
    for task in tasks:
        task.cancel()
    await broadcaster.stop()
    await transport.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--listen", default="/ip4/0.0.0.0/tcp/4001")
    parser.add_argument("--bootstrap", default="")
    parser.add_argument("--relay", default="auto")
    parser.add_argument("--dht-interval", type=float, default=2.0)
    parser.add_argument("--confirmations", type=int, default=2)
    parser.add_argument("--publish-every", type=float, default=0.0)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    asyncio.run(main(parser.parse_args()))
