"""A libp2p node for the UPnP tests, run inside a network namespace: LibP2PTransport (network host in a child
process, DHT rendezvous on) with UPnP on or off, driven by JSON lines.

`python -m tests.netns.upnp_node [--upnp] [--bootstrap ADDR ...] [--confirmations N]`. Events:
{"event": "ready", "peer_id"} once started and connected to every bootstrap. Commands (answers carry "rid"):
nat -> "nat" {status: the host's nat_status()}; connect {addr} -> "connect" {ok, error}: a dial of `addr` (its
own fresh connection: this node holds no other connection to that peer when the test asks); quit.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from bench.child import commands, emit
from swarm_node.identity import generate
from swarm_node.transport.base import TransportError
from swarm_node.transport.libp2p.ipc import HostSettings
from swarm_node.transport.libp2p.launch import LibP2PConfig
from swarm_node.transport.libp2p.transport import LibP2PTransport

PORT = 4001


async def connect_until(transport: LibP2PTransport, addr: str, timeout: float = 60.0) -> None:
    """Bootstraps start before us but their hosts may still be coming up on a loaded machine: retry."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        try:
            await transport.connect(addr)
            return
        except TransportError:
            if asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.5)


async def main(args: argparse.Namespace) -> None:
    settings = HostSettings(listen=(f"/ip4/0.0.0.0/tcp/{PORT}",), rendezvous="upnp-test", upnp=args.upnp,
                            autonat_interval_s=1.0, autonat_confirmations=args.confirmations,
                            connect_timeout_s=args.connect_timeout)
    transport = LibP2PTransport(generate(), LibP2PConfig(host=settings))
    await transport.start()
    for addr in args.bootstrap:
        await connect_until(transport, addr)
    emit(event="ready", peer_id=transport.peer_id)

    async for cmd in commands():
        rid = cmd.get("rid")
        if cmd["cmd"] == "nat":
            emit(event="nat", rid=rid, status=await transport.nat_status())
        elif cmd["cmd"] == "connect":
            try:
                await transport.connect(cmd["addr"])
                emit(event="connect", rid=rid, ok=True, error="")
            except TransportError as exc:
                emit(event="connect", rid=rid, ok=False, error=str(exc))
        elif cmd["cmd"] == "quit":
            break
    await transport.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--upnp", action="store_true")
    parser.add_argument("--bootstrap", action="append", default=[])
    parser.add_argument("--confirmations", type=int, default=2)
    parser.add_argument("--connect-timeout", type=float, default=10.0)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    asyncio.run(main(parser.parse_args()))
