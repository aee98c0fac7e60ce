"""bench.nat's scenario `bootstrap_leaves_after_punch`: two homes behind cone NATs, direct after DCUtR, then the
bootstrap (their only relay and only other peer) stops; do both keep receiving each other's groups?

Contract: `await run_once(watch_s)` builds its own topology (tests/netns: one public node, the bootstrap with
`--relay on`; homes A and B behind cone NATs, each given only the bootstrap's address, publishing one rollout group
a second), waits until A and B hold a direct connection (DCUtR) and the relayed one has been closed on at least one
side (py-libp2p's DCUtR closes it 60 s after the punch), stops the bootstrap, and counts for `watch_s` seconds the
groups each home receives from the other. Returns one run's row: `groups_each_way_after_bootstrap_stop`
([a_from_b, b_from_a]), the per-peer traffic both reported before and after (`traffic_*`), a per-10 s timeline of
the two counts, and the times from A's start. The namespaces are always removed.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from bench.procs import JsonProc, wait_for
from tests.netns.swarm import public_addr, start_node
from tests.netns.topology import Topology

DIRECT_TIMEOUT_S = 240.0
RELAY_CLOSE_TIMEOUT_S = 150.0  # the library closes the relayed connection 60 s after the punch
SAMPLE_S = 10.0


async def _status(node: JsonProc) -> dict[str, Any]:
    return (await node.request("nat", cmd="nat", timeout=60))["status"]


async def _received(node: JsonProc, sender: str) -> int:
    return len((await node.request("stats", cmd="stats", timeout=60))["delivered"].get(sender, []))


async def run_once(watch_s: float = 120.0) -> dict[str, Any]:
    with Topology(homes={"a": "cone", "b": "cone"}, public=1) as topo:
        nodes: dict[str, JsonProc] = {}
        try:
            nodes["boot"], ready = await start_node(topo, topo.pub(0), "boot", relay="on", confirmations=1)
            boot = public_addr(topo.pub_ip(0), ready["peer_id"])
            ids = {"boot": ready["peer_id"]}
            started_at = 0.0
            for name in ("a", "b"):
                nodes[name], ready = await start_node(topo, topo.home(name).host_ns, name, bootstrap=boot,
                                                      confirmations=1, publish_every=1.0)
                ids[name] = ready["peer_id"]
                started_at = started_at or ready["started_at"]
            a, b = nodes["a"], nodes["b"]

            async def traffic(me: str, other: str) -> dict[str, Any]:
                return dict((await _status(nodes[me]))["traffic"].get(ids[other], {}))

            async def direct() -> bool:
                return (await traffic("a", "b")).get("direct", 0) >= 1 and \
                    (await traffic("b", "a")).get("direct", 0) >= 1
            is_direct = await wait_for(direct, DIRECT_TIMEOUT_S)
            time_direct = round(time.time() - started_at, 1) if is_direct else None

            async def relay_closed() -> bool:
                return (await traffic("a", "b")).get("relayed", 1) == 0 or \
                    (await traffic("b", "a")).get("relayed", 1) == 0
            closed = is_direct and await wait_for(relay_closed, RELAY_CLOSE_TIMEOUT_S)
            time_closed = round(time.time() - started_at, 1) if closed else None
            before = {"a": await traffic("a", "b"), "b": await traffic("b", "a")}
            base = (await _received(a, ids["b"]), await _received(b, ids["a"]))
            await nodes["boot"].close()
            timeline = []
            stop_at = time.monotonic()
            while time.monotonic() - stop_at < watch_s:
                await asyncio.sleep(min(SAMPLE_S, watch_s - (time.monotonic() - stop_at)))
                timeline.append([await _received(a, ids["b"]) - base[0], await _received(b, ids["a"]) - base[1]])
            after = {"a": await traffic("a", "b"), "b": await traffic("b", "a")}
            return {
                "groups_each_way_after_bootstrap_stop": timeline[-1],
                "direct": is_direct, "relayed_connection_closed": closed,
                "time_to_direct_s": time_direct, "time_to_relay_closed_s": time_closed,
                "traffic_before_stop": before, "traffic_after": after,
                "timeline_every_10_s": timeline,
            }
        finally:
            for node in nodes.values():
                await node.close()


if __name__ == "__main__":
    import json
    import sys
    print(json.dumps(asyncio.run(run_once(float(sys.argv[1]) if len(sys.argv) > 1 else 120.0)), indent=1))
