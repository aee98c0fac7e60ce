"""A swarm node for the multi-process tests: LibP2PTransport + the protocol's validator, driven by JSON lines.

Events: {"event": "ready", "peer_id", "addr"} at start; answers carry the command's "rid".
Commands: publish {count} -> "published" {group_ids}; stats -> "stats" {delivered: {signer: [gid hex]}, verdicts,
restarts, host_counters, peers}; connect {addr} -> "connected"; wait_subscribed {n} (peers on the topic)
-> "subscribed"; quit. Joins through --bootstrap with connectivity.start_network, as `join` does; the DHT rendezvous
on the topic (transport/libp2p/rendezvous.py) finds the other nodes.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import logging
import sys
from typing import Any

from bench.child import emit, serve
from swarm_node.identity import generate
from swarm_node.transport.base import Delivery, TransportError
from swarm_node.transport.connectivity import start_network
from swarm_node.transport.libp2p.ipc import HostSettings
from swarm_node.transport.libp2p.launch import LibP2PConfig
from swarm_node.transport.libp2p.transport import LibP2PTransport
from swarm_node.transport.supervisor import Backoff
from tests.libp2p_helpers.rollouts import TOPIC, group_ids, protocol_validator, rollout_batch


async def main(args: argparse.Namespace) -> None:
    settings = HostSettings(listen=("/ip4/127.0.0.1/tcp/0",), seen_ttl_s=args.seen_ttl, sweep_s=args.sweep,
                            rendezvous=TOPIC, dht_interval_s=1.0)
    transport = LibP2PTransport(generate(), LibP2PConfig(host=settings, restart=Backoff(initial_s=0.2)))
    delivered: dict[str, list[str]] = {}

    def on_delivery(delivery: Delivery) -> None:
        delivered.setdefault(delivery.from_peer, []).extend(g.hex() for g in group_ids(delivery.data))

    transport.set_validator(TOPIC, protocol_validator())
    await transport.subscribe(TOPIC, on_delivery)
    await transport.start()
    await start_network(transport, [args.bootstrap] if args.bootstrap else [],
                        backoff=Backoff(initial_s=0.2, max_s=1.0), check_interval_s=0.5)
    emit(event="ready", peer_id=transport.peer_id, addr=transport.listen_addrs()[0])

    numbers = itertools.count(1)

    async def publish(cmd: dict[str, Any]) -> dict[str, Any]:
        gids = []
        for _ in range(cmd["count"]):
            gid, data = rollout_batch(transport.peer_id, next(numbers))
            try:
                await transport.publish(TOPIC, data)
                gids.append(gid.hex())
            except TransportError as exc:
                emit(event="publish_error", error=str(exc))
        return {"event": "published", "group_ids": gids}

    async def stats(_cmd: dict[str, Any]) -> dict[str, Any]:
        counters = await transport.host_counters()
        peers = [p.peer_id for p in await transport.peers()]
        return {"event": "stats", "delivered": delivered, "verdicts": transport.stats.validated,
                "restarts": transport.stats.restarts, "host_counters": counters, "peers": peers}

    async def connect(cmd: dict[str, Any]) -> dict[str, Any]:
        return {"event": "connected", "peer_id": await transport.connect(cmd["addr"])}

    async def wait_subscribed(cmd: dict[str, Any]) -> dict[str, Any]:
        while sum(TOPIC in p.topics for p in await transport.peers()) < cmd["n"]:
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.3)  # a moment for the mesh graft
        return {"event": "subscribed"}

    await serve({"publish": publish, "stats": stats, "connect": connect, "wait_subscribed": wait_subscribed})
    await transport.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", default="")
    parser.add_argument("--seen-ttl", type=int, default=120)
    parser.add_argument("--sweep", type=int, default=60)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    asyncio.run(main(parser.parse_args()))
