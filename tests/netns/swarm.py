"""Start swarm nodes (tests/libp2p_helpers/nat_node.py) inside a Topology's namespaces, as JSON-line processes.

Contract: `await start_node(topo, ns, name, bootstrap=..., relay=...)` starts one node in namespace `ns`, waits
for its "ready" event and returns (JsonProc, ready event). The process is in its own session; `JsonProc.close()`
kills it, and `Topology.teardown` kills whatever is left in its namespaces anyway.
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

from bench.procs import REPO, JsonProc
from tests.netns.topology import Topology

PORT = 4001


async def start_node(topo: Topology, ns: str, name: str, bootstrap: str = "", relay: str = "auto",
                     confirmations: int = 2, publish_every: float = 0.0,
                     timeout: float = 60.0) -> tuple[JsonProc, dict[str, Any]]:
    args = ["--listen", f"/ip4/0.0.0.0/tcp/{PORT}", "--relay", relay, "--confirmations", str(confirmations),
            "--publish-every", str(publish_every)]
    if bootstrap:
        args += ["--bootstrap", bootstrap]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = await asyncio.create_subprocess_exec(
        *topo.ns_argv(ns), sys.executable, "-m", "tests.libp2p_helpers.nat_node", *args, cwd=REPO, env=env,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, start_new_session=True)
    node = JsonProc(proc, name)
    try:
        ready = await node.expect(lambda e: e.get("event") == "ready", timeout)
    except BaseException:
        await node.close()
        raise
    return node, ready


def public_addr(ip: str, peer_id: str) -> str:
    return f"/ip4/{ip}/tcp/{PORT}/p2p/{peer_id}"
