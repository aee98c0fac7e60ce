"""Nodes behind real NATs: discovery, reachability, relays, hole punching and ECHO-2 deltas, measured.

`python -m bench.nat` (root, or CAP_NET_ADMIN; needs `ip` and `nft`) writes bench/results/nat.json:
  {"scenarios": [{"name", "nat_a", "nat_b", "nat_rule_a", "nat_rule_b", "discovered_via", "reachability_a",
   "reachability_b", "direct_dial_before_punch", "connected", "path", "time_to_first_external_group_s",
   "groups_exchanged", "deltas_received", "relayed_bytes", ...}], "load_avg", "note"}
and prints one line per scenario.

Each scenario builds its own topology with tests/netns (Linux network namespaces: a bridge as the internet, three
public nodes, nodes A and B each behind its own router with nft `masquerade` (cone) or `masquerade
random,fully-random` (symmetric)), runs one tests/libp2p_helpers/nat_node.py process per node (LibP2PTransport
with the DHT rendezvous, AutoNAT, circuit relay v2 and DCUtR on), and always removes the namespaces. A and B are
given only the bootstrap's address and publish one rollout group per second.
  - cone / symmetric: A and B must find each other through the DHT, connect through a relay, exchange groups;
    cone must end "direct" (DCUtR), symmetric stays "relay".
  - echo_worker_behind_nat: a public node acting as the learner sends 3 policy payloads of 256 KiB through the
    ECHO-2 pipelined broadcast (policy_sync.PolicyBroadcaster) to A and B, both behind symmetric NATs.
  - relay_leaves: symmetric NATs; once A and B talk through a relay, that relay's process is killed; A and B
    must reconnect through another relay (each re-reserves) and keep exchanging groups.
  - bootstrap_leaves_after_punch (`--runs` times, 3 by default; bench/nat_bootstrap_leaves.py): cone NATs and the
    bootstrap as the only public node; once A and B are direct and the relayed connection has been closed, the
    bootstrap stops: "runs" lists per run the groups each home received from the other in the 2 minutes after
    ([a_from_b, b_from_a]), "groups_each_way_after_bootstrap_stop" is the worst of them (smallest either way),
    "run_details" the rest of each run.
With --scenario, the rows of the other scenarios, "upnp" and "load_avg" are kept from the existing file (the new
rows then carry their own "load_avg").
Fields: direct_dial_before_punch is a plain TCP dial from A's host to B's router at B's listen port, made after
both started and before any hole punch (false: the NAT blocks it). time_to_first_external_group_s runs from A's
process start to the first of B's groups A accepted (these nodes validate groups but do not train: no model).
groups_exchanged counts A's groups at B plus B's at A; relayed_bytes is what A's relayed connections carried.
time_to_a_b_connected_s / time_to_direct_s: from A's start until A holds a connection to B that it found through
the DHT / until that connection is direct (polled once a second, so up to ~1 s late).
"upnp" (beside "scenarios"): the node's UPnP attempt (transport.libp2p.upnp.PortMapper) behind one router per kind of
gateway (tests/netns/upnp.py: miniupnpd that maps, refuses, or sits behind carrier-grade NAT; a fake one answering
garbage, one never answering; none), all at once: per kind {"state", "line", "time_to_outcome_s"}, and for "mapped"
whether stopping the mapper deleted the router's DNAT rule. {"skipped": why} without miniupnpd.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import nat_bootstrap_leaves, provenance
from bench.load_guard import add_loaded_flag
from bench.procs import JsonProc, wait_for
from tests.netns.swarm import PORT, public_addr, start_node
from tests.netns.topology import Topology, namespaces_unavailable
from tests.netns.upnp import igd_unavailable, probe_gateways

RESULTS = Path(__file__).resolve().parent / "results" / "nat.json"
SCENARIOS = {
    "cone": ("cone", "cone"),
    "symmetric": ("symmetric", "symmetric"),
    "echo_worker_behind_nat": ("symmetric", "symmetric"),
    "relay_leaves": ("symmetric", "symmetric"),
}
# Scenarios with a topology and a row of their own, run `--runs` times: name -> one run's row.
REPEATED = {"bootstrap_leaves_after_punch": nat_bootstrap_leaves.run_once}
DELTAS = 3
DELTA_BYTES = 256 << 10


async def nat_status(node: JsonProc) -> dict[str, Any]:
    return (await node.request("nat", cmd="nat", timeout=60))["status"]


async def stats(node: JsonProc) -> dict[str, Any]:
    return await node.request("stats", cmd="stats", timeout=60)


async def run_scenario(name: str) -> dict[str, Any]:
    nat_a, nat_b = SCENARIOS[name]
    started = time.monotonic()
    with Topology(homes={"a": nat_a, "b": nat_b}, public=3) as topo:
        nodes: dict[str, JsonProc] = {}
        ids: dict[str, str] = {}
        ready: dict[str, dict[str, Any]] = {}
        try:
            nodes["boot"], ready["boot"] = await start_node(topo, topo.pub(0), "boot", relay="on")
            boot = public_addr(topo.pub_ip(0), ready["boot"]["peer_id"])
            for node, ns, every in [("pub1", topo.pub(1), 0.0), ("pub2", topo.pub(2), 0.0),
                                    ("a", topo.home("a").host_ns, 1.0), ("b", topo.home("b").host_ns, 1.0)]:
                nodes[node], ready[node] = await start_node(topo, ns, node, bootstrap=boot, publish_every=every)
            ids = {node: event["peer_id"] for node, event in ready.items()}
            a, b = nodes["a"], nodes["b"]
            probe = topo.exec(topo.home("a").host_ns, sys.executable, "-m", "tests.netns.tcp_probe", "dial",
                              topo.home("b").public_ip, str(PORT))
            direct_dial = probe.stdout.split()[:1] == ["ok"]

            async def a_meets_b() -> bool:
                status = await nat_status(a)
                return ids["b"] in status["paths"] and ids["b"] in status["discovered"]
            connected = await wait_for(a_meets_b, 120)
            time_connected = time.time() - ready["a"]["started_at"]
            deltas = 0
            if name == "echo_worker_behind_nat" and connected:
                learner = nodes["pub1"]
                for version in range(1, DELTAS + 1):
                    await learner.request("delta_published", cmd="publish_delta", version=version,
                                          size=DELTA_BYTES, receivers=[ids["a"], ids["b"]], timeout=60)

                async def all_deltas() -> bool:
                    return int((await stats(a))["deltas"]) >= DELTAS
                await wait_for(all_deltas, 90)
                deltas = int((await stats(a))["deltas"])
            leaves: dict[str, Any] = {}
            if name == "relay_leaves" and connected:
                connected, leaves = await relay_leaves(nodes, ids)
            time_direct = None
            if name == "cone" and connected:
                async def direct() -> bool:
                    return (await nat_status(a))["paths"].get(ids["b"]) == "direct"
                if await wait_for(direct, 60):
                    time_direct = round(time.time() - ready["a"]["started_at"], 1)
            if name in ("symmetric", "relay_leaves", "echo_worker_behind_nat") and connected:
                async def punch_tried() -> bool:
                    status = await nat_status(a)
                    return (status["hole_punch_attempts"].get(ids["b"], 0) >= 1
                            and ids["b"] not in status["hole_punching"])
                await wait_for(punch_tried, 60)
            status_a, status_b = await nat_status(a), await nat_status(b)
            stats_a, stats_b = await stats(a), await stats(b)
            first = stats_a["first_at"].get(ids["b"])
            served = [int((await nat_status(nodes[n]))["relay_served_bytes"]) for n in ("boot", "pub1", "pub2")
                      if nodes[n].proc.returncode is None]  # a killed relay's count is gone with it
            via_a, via_b = status_a["discovered"].get(ids["b"]), status_b["discovered"].get(ids["a"])
            return {
                "name": name, "nat_a": nat_a, "nat_b": nat_b,
                "nat_rule_a": topo.home("a").nat_rule, "nat_rule_b": topo.home("b").nat_rule,
                "discovered_via": via_a if via_a == via_b else f"a:{via_a},b:{via_b}",
                "reachability_a": status_a["reachability"], "reachability_b": status_b["reachability"],
                "direct_dial_before_punch": direct_dial,
                "connected": bool(connected and ids["b"] in status_a["paths"]),
                "path": status_a["paths"].get(ids["b"], "none"),
                "time_to_first_external_group_s": round(first - ready["a"]["started_at"], 2) if first else None,
                "time_to_a_b_connected_s": round(time_connected, 1) if connected else None,
                "time_to_direct_s": time_direct,
                "groups_exchanged": len(stats_a["delivered"].get(ids["b"], []))
                + len(stats_b["delivered"].get(ids["a"], [])),
                "deltas_received": deltas,
                "relayed_bytes": int(status_a["relayed_bytes"]),
                "relayed_bytes_b": int(status_b["relayed_bytes"]),
                "relay_served_bytes": sum(served),
                "relayed_streams_refused": int(status_a["relayed_streams_refused"])
                + int(status_b["relayed_streams_refused"]),
                "chunk_streams_served_direct": int(status_a["no_relay_streams_served"])
                + int(status_b["no_relay_streams_served"]),
                "hole_punch_attempts": status_a["hole_punch_attempts"].get(ids["b"], 0),
                "reservations_a": len(status_a["reservations"]),
                "elapsed_s": round(time.monotonic() - started, 1),
                **leaves,
            }
        finally:
            for node in nodes.values():
                await node.close()


async def relay_leaves(nodes: dict[str, JsonProc], ids: dict[str, str]) -> tuple[bool, dict[str, Any]]:
    """Kill the relay carrying A-B. True once A and B talk again through another relay and B's groups reach A
    again; with which relay left, which one carries them after, and how long that took."""
    a = nodes["a"]
    status = await nat_status(a)
    relay = status["relays_in_use"].get(ids["b"])
    if relay is None:  # already direct: nothing to take away
        return True, {"relay_killed": None}
    gone = next((name for name, peer in ids.items() if peer == relay and name in ("boot", "pub1", "pub2")), None)
    if gone is None:
        raise RuntimeError(f"A reaches B through {relay}, which is not one of the public nodes {ids}")
    before = len((await stats(a))["delivered"].get(ids["b"], []))
    await nodes[gone].close()
    killed_at = time.monotonic()
    after: list[str] = []

    async def back() -> bool:
        status = await nat_status(a)
        via = status["relays_in_use"].get(ids["b"])
        more = len((await stats(a))["delivered"].get(ids["b"], [])) >= before + 3
        if ids["b"] in status["paths"] and via != relay and more:
            after.append(next((n for n, p in ids.items() if p == via), str(via)))
            return True
        return False
    ok = await wait_for(back, 150)
    return ok, {"relay_killed": gone, "relay_after": after[0] if after else None,
                "time_to_reconnect_s": round(time.monotonic() - killed_at, 1) if ok else None}


def upnp_outcomes() -> dict[str, Any]:
    why_not = igd_unavailable()
    if why_not is not None:
        return {"skipped": why_not}
    with tempfile.TemporaryDirectory() as workdir:
        probed = probe_gateways(Path(workdir))
    out: dict[str, Any] = {kind: {"state": row["state"], "line": row["line"],
                                  "time_to_outcome_s": round(row["elapsed_s"], 2)} for kind, row in probed.items()}
    out["mapped"]["mapping_removed_on_stop"] = bool(probed["mapped"]["rules_while_mapped"]
                                                    and not probed["mapped"]["rules_after_stop"])
    return out


def repeated_row(name: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One row for `runs` of a REPEATED scenario: each run's pair, the worst pair, the rest of each run."""
    pairs = [run["groups_each_way_after_bootstrap_stop"] for run in runs]
    return {"name": name, "nat_a": "cone", "nat_b": "cone", "runs": pairs,
            "groups_each_way_after_bootstrap_stop": min(pairs, key=min),
            "run_details": [{k: v for k, v in run.items() if k != "groups_each_way_after_bootstrap_stop"}
                            for run in runs]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", action="append", choices=sorted([*SCENARIOS, *REPEATED]),
                        help="run only these (repeatable) [all]")
    parser.add_argument("--runs", type=int, default=3, help="runs of each repeated scenario [3]")
    parser.add_argument("--out", type=Path, default=RESULTS)
    add_loaded_flag(parser)
    args = parser.parse_args(argv)
    run = provenance.begin(timed=True, loaded=args.loaded)  # times to connect, punch and re-reserve
    why_not = namespaces_unavailable()
    if why_not is not None:
        raise SystemExit(f"bench.nat needs network namespaces: {why_not}")
    results = []
    for name in args.scenario or [*SCENARIOS, *REPEATED]:
        if name in REPEATED:
            row = repeated_row(name, [asyncio.run(REPEATED[name]()) for _ in range(args.runs)])
            results.append(row)
            print(f"nat {name}: groups each way after the bootstrap stopped, per run: {row['runs']}", flush=True)
            continue
        row = asyncio.run(run_scenario(name))
        results.append(row)
        print(f"nat {name}: connected={row['connected']} path={row['path']} via={row['discovered_via']} "
              f"reach a/b={row['reachability_a']}/{row['reachability_b']} "
              f"direct_before={row['direct_dial_before_punch']} "
              f"first_group={row['time_to_first_external_group_s']} s groups={row['groups_exchanged']} "
              f"deltas={row['deltas_received']} relayed={row['relayed_bytes']} B", flush=True)
    old = json.loads(args.out.read_text()) if args.scenario and args.out.exists() else {}
    if args.scenario and "upnp" in old:
        upnp = old["upnp"]
    else:
        upnp = upnp_outcomes()
        summary = upnp.get("skipped") or ", ".join(f"{kind}={row['state']} in {row['time_to_outcome_s']} s"
                                                   for kind, row in upnp.items())
        print(f"nat upnp: {summary}", flush=True)
    ran = {row["name"] for row in results}
    kept = [row for row in old.get("scenarios", []) if row["name"] not in ran]
    if kept:  # the file's load average is its other rows'; these rows carry their own
        results = [{**row, "load_avg": os.getloadavg()[0]} for row in results]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result = {"scenarios": kept + results, "upnp": upnp, "load_avg": old.get("load_avg", os.getloadavg()[0]),
              "note": "A and B validate groups but do not train (no model); see docstring"}
    if kept:  # rows of an earlier run stay: so does what is known of the code they measured
        result["kept_rows_provenance"] = old.get("kept_rows_provenance") or old.get("provenance")
    args.out.write_text(json.dumps(provenance.stamp(result, run, runs=1), indent=1) + "\n")


if __name__ == "__main__":
    main()
