"""Run the node's UPnP attempt alone (transport.libp2p.upnp.PortMapper, no libp2p), inside a home namespace:
`python -m tests.netns.upnp_probe PORT`.

Prints one JSON line once the first attempt has an outcome: {"state", "line", "external_addr", "elapsed_s"}; then
keeps the mapping until a line arrives on stdin (or stdin closes), stops the mapper as the host's shutdown does
(cancellation: it deletes the mapping) and prints {"stopped_after_s": seconds the stop took}.
"""

from __future__ import annotations

import json
import sys
import time

import trio

from swarm_node.transport.libp2p.upnp import PortMapper


async def main(port: int) -> None:
    mapper = PortMapper()
    started = time.monotonic()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(mapper.run, port)
        await mapper.settled.wait()
        print(json.dumps({**mapper.outcome.status(), "elapsed_s": time.monotonic() - started}), flush=True)
        await trio.to_thread.run_sync(sys.stdin.readline, abandon_on_cancel=True)
        stopping = time.monotonic()
        nursery.cancel_scope.cancel()
    print(json.dumps({"stopped_after_s": time.monotonic() - stopping}), flush=True)


if __name__ == "__main__":
    trio.run(main, int(sys.argv[1]))
