"""Honest sharing during and after a flood (issue 27 item 3): the longest silence between two honest nodes.

`python -m bench.flood_recovery [--runs 3] [--flood-groups 500] [--flood-seconds 10] [--flood-identities 20]
[--after-s 120] [--label after]` writes bench/results/flood_recovery.json (the runs of `--label`, merged with what the
file already holds for other labels: "before" is the commit before the fix) and prints one line.
- Two honest stand-ins, each an OS process with a LibP2PTransport (network host in its own child process) and the
  node's gossip checks: the protocol's validation and a per-signer message rate (`[peers] max_messages_per_s` 5,
  `message_burst` 50: past it IGNOREd, the node's "flood" drop). They connect to each other and each publishes one
  realistic group (8 completions x 64 tokens) every `--honest-interval-s` for the whole run.
- The flood: `--flood-identities` fresh py-libp2p identities (plain library hosts, as `simulations/attack_peers.py`)
  in one trio process dial honest node A, join the rollout topic and together publish `--flood-groups` validly
  signed, distinct groups over `--flood-seconds`, then leave (their hosts stop: the connections close). 20 is more
  than gossipsub's degree_high (12): the flood over-fills A's mesh, as in issue 27.
- Measured on each honest node: the longest gap between deliveries of the other honest node's groups from the
  flood's start to `--after-s` seconds after its end (the window's two ends count as deliveries, so a silence
  running into the end counts whole). `max_honest_gap_s_<label>` is the worst over both directions and all runs.
  Also per run: the host's connected peers once the flood has gone (`peers_after`), publish errors, and the host
  counters (slow_peer, validation_timeout, forwarder_over_budget, ...).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

from bench import provenance
from bench.child import emit, mesh_commands, serve
from bench.gossip_node import make_validator, rollout_message
from bench.load_guard import add_loaded_flag
from bench.procs import JsonProc, event_is

RESULTS = Path(__file__).resolve().parent / "results"
OUT = RESULTS / "flood_recovery.json"
SIGNER_RATE, SIGNER_BURST = 5.0, 50  # the node's [peers] max_messages_per_s and message_burst defaults


# ------------------------------------------------------------------------------------------- honest stand-in
async def honest() -> None:
    from protocol.messages import TOPIC_ROLLOUTS
    from swarm_node.identity import generate
    from swarm_node.transport.base import Delivery, TransportError, ValidationResult
    from swarm_node.transport.libp2p.ipc import HostSettings
    from swarm_node.transport.libp2p.launch import LibP2PConfig
    from swarm_node.transport.libp2p.transport import LibP2PTransport
    from swarm_node.transport.shaping import RequestBudget

    transport = LibP2PTransport(generate(), LibP2PConfig(host=HostSettings(listen=("/ip4/127.0.0.1/tcp/0",))))
    check = make_validator()
    rate = RequestBudget(SIGNER_RATE, SIGNER_BURST)  # no total: the host's forwarder budget bounds the crowd
    delivered: dict[str, list[float]] = {}
    errors: list[str] = []
    published: list[float] = []

    def validate(signer: str, data: bytes) -> ValidationResult:
        if rate.take(signer) != "ok":
            return ValidationResult.IGNORE  # the node's "flood": past the signer's rate, ignored unread
        return check(signer, data)

    def on_delivery(delivery: Delivery) -> None:
        delivered.setdefault(delivery.from_peer, []).append(time.time())

    async def share(until: float, interval_s: float) -> None:
        index = 0
        next_at = time.time()
        while time.time() < until:
            index += 1
            try:
                await transport.publish(TOPIC_ROLLOUTS, rollout_message(transport.peer_id, index))
                published.append(time.time())
            except TransportError as exc:
                errors.append(str(exc))
            next_at += interval_s
            await asyncio.sleep(max(0.0, next_at - time.time()))

    async def start_sharing(cmd: dict[str, Any]) -> dict[str, Any]:
        asyncio.ensure_future(share(cmd["until"], cmd["interval_s"]))
        return {"event": "sharing"}

    async def stats(_cmd: dict[str, Any]) -> dict[str, Any]:
        peers = [p.peer_id for p in await transport.peers()]
        return {"event": "stats", "delivered": delivered, "errors": errors, "published": published,
                "counters": await transport.host_counters(), "peers": peers}

    transport.set_validator(TOPIC_ROLLOUTS, validate)
    await transport.subscribe(TOPIC_ROLLOUTS, on_delivery)
    await transport.start()
    emit(event="ready", peer_id=transport.peer_id, addr=transport.listen_addrs()[0])
    await serve({**mesh_commands(transport, TOPIC_ROLLOUTS), "share": start_sharing, "stats": stats})
    await transport.stop()


# ------------------------------------------------------------------------------------------- the flood
async def flood_identity(target: str, groups: int, seconds: float, sent: list[int]) -> None:
    import multiaddr
    import trio
    from libp2p import new_host
    from libp2p.crypto.ed25519 import create_new_key_pair
    from libp2p.crypto.x25519 import create_new_key_pair as x25519_key_pair
    from libp2p.peer.peerinfo import info_from_p2p_addr
    from libp2p.pubsub.gossipsub import PROTOCOL_ID_V11, PROTOCOL_ID_V12, GossipSub
    from libp2p.pubsub.pubsub import Pubsub
    from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_ID
    from libp2p.security.noise.transport import Transport as NoiseTransport
    from libp2p.tools.anyio_service import background_trio_service

    from protocol.messages import TOPIC_ROLLOUTS

    key_pair = create_new_key_pair()
    security = {NOISE_ID: NoiseTransport(key_pair, noise_privkey=x25519_key_pair().private_key)}
    host = new_host(key_pair=key_pair, sec_opt=security)
    gossipsub = GossipSub(protocols=[PROTOCOL_ID_V12, PROTOCOL_ID_V11], degree=6, degree_low=4, degree_high=12,
                          heartbeat_interval=1)
    pubsub = Pubsub(host, gossipsub)
    async with host.run([multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")]), background_trio_service(pubsub), \
            background_trio_service(gossipsub):
        await pubsub.wait_until_ready()
        info = info_from_p2p_addr(multiaddr.Multiaddr(target))
        await host.connect(info)
        await pubsub.wait_for_peer(info.peer_id, timeout=20)
        await pubsub.subscribe(TOPIC_ROLLOUTS)  # a member of the topic: the target meshes with it
        signer = host.get_id().to_base58()
        emit(event="identity", peer_id=signer)
        await trio.sleep(1.0)  # subscriptions exchanged, the mesh grafted
        start = trio.current_time()
        for i in range(groups):
            await trio.sleep_until(start + i * seconds / groups)
            await pubsub.publish(TOPIC_ROLLOUTS, rollout_message(signer, i))
            sent[0] += 1
        await trio.sleep(0.5)
    # leaving host.run closes its connections: the target sees them close


async def flood(target: str, identities: int, groups: int, seconds: float) -> None:
    import trio

    sent = [0]
    emit(event="flood_start", t=time.time())
    async with trio.open_nursery() as nursery:
        for k in range(identities):
            nursery.start_soon(flood_identity, target, groups // identities + (k < groups % identities), seconds,
                               sent)
    emit(event="flood_done", t=time.time(), sent=sent[0])


# ------------------------------------------------------------------------------------------- the measurement
def longest_gap(times: list[float], start: float, end: float) -> float:
    """The longest interval in [start, end] without a delivery; the window's ends count as deliveries."""
    points = [start, *sorted(t for t in times if start < t < end), end]
    return max(b - a for a, b in zip(points, points[1:], strict=False))


async def one_run(args: argparse.Namespace) -> dict[str, Any]:
    nodes = [await JsonProc.start("bench.flood_recovery", "--honest", name=f"honest {n}") for n in "AB"]
    flooder: JsonProc | None = None
    try:
        ready = [await n.expect(event_is("ready"), 120) for n in nodes]
        await nodes[1].request("connected", cmd="connect", addrs=[ready[0]["addr"]], timeout=60)
        for n in nodes:
            await n.request("subscribed", cmd="wait_subscribed", n=1, timeout=60)
        await asyncio.sleep(2.0)  # a heartbeat or two: the mesh is grafted
        until = time.time() + 3600  # shares until it is stopped
        for n in nodes:
            await n.request("sharing", cmd="share", until=until, interval_s=args.honest_interval_s)
        await asyncio.sleep(args.warmup_s)
        flooder = await JsonProc.start("bench.flood_recovery", "--flood", ready[0]["addr"], "--identities",
                                       str(args.flood_identities), "--groups", str(args.flood_groups),
                                       "--seconds", str(args.flood_seconds), name="flooder")
        started = await flooder.expect(event_is("flood_start"), 120)
        done = await flooder.expect(event_is("flood_done"), args.flood_seconds + 120)
        await flooder.close()
        flooder = None
        window_end = done["t"] + args.after_s
        await asyncio.sleep(max(0.0, window_end - time.time()) + 1.0)
        stats = [await n.request("stats", cmd="stats", timeout=60) for n in nodes]
    finally:
        if flooder is not None:
            await flooder.close()
        for n in nodes:
            await n.close(quit_grace_s=5)
    ids = [r["peer_id"] for r in ready]
    gaps = {
        "A_from_B": longest_gap(stats[0]["delivered"].get(ids[1], []), started["t"], window_end),
        "B_from_A": longest_gap(stats[1]["delivered"].get(ids[0], []), started["t"], window_end),
    }
    return {
        "max_gap_s": round(max(gaps.values()), 2), "gaps_s": {k: round(v, 2) for k, v in gaps.items()},
        "flood_sent": done["sent"], "flood_s": round(done["t"] - started["t"], 2),
        "peers_after": {"A": len(stats[0]["peers"]), "B": len(stats[1]["peers"])},
        "publish_errors": {"A": len(stats[0]["errors"]), "B": len(stats[1]["errors"])},
        "counters": {"A": stats[0]["counters"], "B": stats[1]["counters"]},
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }


async def bench(args: argparse.Namespace) -> None:
    started = provenance.begin(timed=True, loaded=args.loaded)  # gaps in seconds: refused on a loaded machine
    runs = []
    for i in range(args.runs):
        run = await one_run(args)
        print(f"run {i + 1}: max gap {run['max_gap_s']} s {run['gaps_s']}, peers after {run['peers_after']}, "
              f"load {run['load_avg_1m']}", flush=True)
        runs.append(run)
    result = json.loads(OUT.read_text()) if OUT.exists() else {}
    result.update({
        "flood_groups": args.flood_groups, "flood_seconds": args.flood_seconds,
        "flood_rate_per_s": round(args.flood_groups / args.flood_seconds, 2),
        "flood_identities": args.flood_identities, "honest_interval_s": args.honest_interval_s,
        "after_s": args.after_s, "loaded": args.loaded,
        f"max_honest_gap_s_{args.label}": max(r["max_gap_s"] for r in runs),
        f"median_honest_gap_s_{args.label}": statistics.median(r["max_gap_s"] for r in runs),
        f"runs_{args.label}": runs,
    })
    RESULTS.mkdir(exist_ok=True)
    OUT.write_text(json.dumps(provenance.stamp(result, started, runs=args.runs), indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if not k.startswith("runs_")}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--label", default="after", help="before | after: which fields of the JSON this run fills")
    parser.add_argument("--flood-groups", type=int, default=500)
    parser.add_argument("--flood-seconds", type=float, default=10.0)
    parser.add_argument("--flood-identities", type=int, default=20)
    parser.add_argument("--honest-interval-s", type=float, default=1.0)
    parser.add_argument("--warmup-s", type=float, default=5.0)
    parser.add_argument("--after-s", type=float, default=120.0)
    add_loaded_flag(parser)
    parser.add_argument("--honest", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--flood", metavar="TARGET", help=argparse.SUPPRESS)
    parser.add_argument("--identities", type=int, default=5, help=argparse.SUPPRESS)
    parser.add_argument("--groups", type=int, default=500, help=argparse.SUPPRESS)
    parser.add_argument("--seconds", type=float, default=10.0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.honest:
        asyncio.run(honest())
    elif args.flood:
        import trio

        trio.run(flood, args.flood, args.identities, args.groups, args.seconds)
    else:
        asyncio.run(bench(args))


if __name__ == "__main__":
    main()
