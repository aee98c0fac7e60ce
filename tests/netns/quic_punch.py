"""Does DCUtR over QUIC (py-libp2p 0.8.1) punch through NATs? An experiment, not a test: `python -m
tests.netns.quic_punch [--nat cone|symmetric] [--transports quic|tcp,quic] [--announce] [--force-private]` (root, or a
user namespace with CAP_NET_ADMIN). docs/NAT.md quotes its output.

Builds tests/netns/topology.py's NATs (a relay at pub0, nodes A and B each behind its own router), starts
tests/netns/quic_node.py in each (QUIC enabled in that helper only; our host builds TCP alone), and waits, with a
deadline, until A's connection to B is direct or DCUtR has tried and given up. A counter table added to each router
counts UDP packets arriving from the WAN at port 4001 (the listen port) by conntrack state: "new" ones match no NAT
mapping and are dropped by the router's filter. Prints A's and B's view (reachability, paths, connections and the
transport each runs over, DCUtR attempts), each router's UDP conntrack entries and counters, and each host's UDP
sockets, then a JSON summary line. Logs (DCUtR and QUIC at DEBUG) go to --logdir.

--force-private: A and B call themselves private without asking AutoNAT (ours dials back TCP addresses only, so a
QUIC-only node stays "unknown" and never reserves a relay slot). --announce: A and B advertise their router's public
address at the listen port (/ip4/<router>/udp/4001/quic-v1), the address a cone NAT would map the listen socket
to: without it DCUtR exchanges only their private addresses (identify reports a QUIC peer's observed address as /tcp,
so no QUIC address is ever learnt from peers).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from typing import Any

from bench.procs import REPO, JsonProc
from tests.netns.topology import Topology, namespaces_unavailable

PORT = 4001
COUNTERS = f"""table ip quiccount {{
 chain pre {{ type filter hook prerouting priority -150; policy accept;
  iifname "wan" udp dport {PORT} ct state new counter
  iifname "wan" udp dport {PORT} ct state established,related counter
 }}
}}
"""
T0 = time.monotonic()


def say(*parts: object) -> None:
    print(f"{time.monotonic() - T0:7.2f}s", *parts, flush=True)


def listen_args(transports: str, ip: str) -> list[str]:
    out: list[str] = []
    if "tcp" in transports:
        out += ["--listen", f"/ip4/{ip}/tcp/{PORT}"]
    if "quic" in transports:
        out += ["--listen", f"/ip4/{ip}/udp/{PORT}/quic-v1"]
    return out


async def start(topo: Topology, ns: str, name: str, args: list[str], logdir: str) -> tuple[JsonProc, dict[str, Any]]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with open(f"{logdir}/{name}.stderr", "w") as stderr:
        proc = await asyncio.create_subprocess_exec(
            *topo.ns_argv(ns), sys.executable, "-m", "tests.netns.quic_node", *args, "--log-file",
            f"{logdir}/{name}.log", cwd=REPO, env=env, stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, stderr=stderr, start_new_session=True)
    node = JsonProc(proc, name)
    try:
        return node, await node.expect(lambda e: e.get("event") == "ready", 60)
    except BaseException:
        await node.close()
        raise


def _counters(topo: Topology, ns: str) -> dict[str, int]:
    out = json.loads(topo.exec(ns, "nft", "-j", "list", "table", "ip", "quiccount").stdout)
    found: dict[str, int] = {}
    for item in out["nftables"]:
        rule = item.get("rule")
        if not rule:
            continue
        state = next(e["match"]["right"] for e in rule["expr"] if "match" in e and "ct" in e["match"]["left"])
        packets = next(e["counter"]["packets"] for e in rule["expr"] if "counter" in e)
        found["new" if state == "new" else "established"] = packets
    return found


def _udp_conntrack(topo: Topology, ns: str) -> list[str]:
    lines = topo.exec(ns, "cat", "/proc/net/nf_conntrack").stdout.splitlines()
    return [" ".join(f for f in line.split() if f.startswith(("src=", "dst=", "sport=", "dport=")))
            for line in lines if " udp " in line]


async def run(args: argparse.Namespace) -> dict[str, Any]:
    os.makedirs(args.logdir, exist_ok=True)
    summary: dict[str, Any] = {"nat": args.nat, "transports": args.transports, "announce": args.announce}
    with Topology(homes={"a": args.nat, "b": args.nat}, public=1) as topo:
        for key in ("a", "b"):
            subprocess.run(["ip", "netns", "exec", topo.home(key).router_ns, "nft", "-f", "-"], input=COUNTERS,
                           text=True, check=True, capture_output=True, timeout=30)
        nodes: dict[str, JsonProc] = {}
        try:
            nodes["relay"], ready = await start(topo, topo.pub(0), "relay",
                                                [*listen_args(args.transports, topo.pub_ip(0)), "--relay", "on"],
                                                args.logdir)
            relay = ready["peer_id"]
            boot = [a for a in ready["addrs"] if ("quic" in a) == ("quic" in args.transports)][0]
            ids: dict[str, str] = {}
            for key in ("a", "b"):
                home = topo.home(key)
                extra = ["--quic-relay"] if "quic" in args.transports else []
                extra += ["--force-private"] if args.force_private else []
                extra += ["--announce", f"/ip4/{home.public_ip}/udp/{PORT}/quic-v1"] if args.announce else []
                nodes[key], ready = await start(topo, home.host_ns, key, [
                    *listen_args(args.transports, home.host_ip), "--bootstrap", boot, *extra], args.logdir)
                ids[key] = ready["peer_id"]
                say(key, "listens on", ready["addrs"])
            a = nodes["a"]
            deadline = time.monotonic() + args.timeout
            status: dict[str, Any] = {}
            seen = ""
            tried = connected = False
            while time.monotonic() < deadline:
                status = (await a.request("nat", cmd="nat"))["status"]
                now = (status["reachability"], bool(status["reservations"]), status["paths"].get(ids["b"]),
                       status["hole_punch_attempts"].get(ids["b"], 0), ids["b"] in status["hole_punching"])
                if str(now) != seen:
                    say(f"A: reachability {now[0]}, reserved {now[1]}, path to B {now[2]}, DCUtR attempts {now[3]}"
                        + (", punching" if now[4] else ""))
                    seen = str(now)
                tried |= now[3] >= 1  # (the count restarts at 0 whenever a connection to B closes)
                connected |= now[2] is not None
                if now[2] == "direct" or (tried and not now[4]):
                    break
                await asyncio.sleep(1.0)
            summary["path_a_to_b"] = status["paths"].get(ids["b"])
            summary["dcutr_tried"] = tried
            summary["took_s"] = round(time.monotonic() - T0, 1)
            summary["observed_addrs_a"] = status["observed_addrs"]
            say("A observed as", status["observed_addrs"], "advertises", status["advertised"])
            for key, other in (("a", "b"), ("b", "a")):
                conns = (await nodes[key].request("conns", cmd="conns"))["conns"]
                summary[f"conns_{key}_to_{other}"] = conns.get(ids[other])
                summary[f"conns_{key}_to_relay"] = conns.get(relay)
                say(f"{key.upper()}'s connections to {other.upper()}:", conns.get(ids[other]))
                say(f"{key.upper()}'s connections to the relay:", conns.get(relay))
            if ids["b"] in status["paths"]:
                echo = await a.request("echo", cmd="echo", peer=ids["b"], data="hi")
                summary["echo"] = echo.get("reply") or echo.get("error")
                say("echo A -> B:", summary["echo"])
            for key in ("a", "b"):
                home = topo.home(key)
                summary[f"router_{key}_udp_{PORT}"] = _counters(topo, home.router_ns)
                say(f"router {key}: UDP packets from the WAN to port {PORT}:", summary[f"router_{key}_udp_{PORT}"])
                say(f"router {key}: UDP conntrack:", _udp_conntrack(topo, home.router_ns))
                say(f"host {key}: UDP sockets:", [" ".join(line.split()[3:4]) for line in
                                                  topo.exec(home.host_ns, "ss", "-Huan").stdout.splitlines()])
        finally:
            for node in nodes.values():
                await node.close()
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nat", default="cone", choices=["cone", "symmetric"])
    parser.add_argument("--transports", default="quic", choices=["quic", "tcp,quic"])
    parser.add_argument("--announce", action="store_true")
    parser.add_argument("--force-private", action="store_true")
    parser.add_argument("--timeout", type=float, default=150.0)
    parser.add_argument("--logdir", default="/tmp/quic_punch")
    args = parser.parse_args()
    why = namespaces_unavailable()
    if why is not None:
        sys.exit(f"network namespaces unavailable: {why}")
    print(json.dumps(asyncio.run(run(args))))


if __name__ == "__main__":
    main()
