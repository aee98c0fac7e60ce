"""The silence under a flood, reproduced (issue 14 item 7): a validation backlog starves an honest peer's messages.

    python -m simulations.attack_backlog [--cost-ms 10] [--flood 3000] [--seconds 60]

Node A (this process, a `LibP2PTransport` like every node's) validates every gossip message on its own loop with a
fixed cost, as a node's rollout validator does (decode, schema, limits). Peer B (a process) publishes one honest
message every 0.5 s; peer C (another process) publishes `--flood` messages as fast as it can. The host of A sends a
VALIDATE per message to the node over one socket, in arrival order, and IGNOREs a message whose VERDICT has not come
back within `validation_timeout_s` (5 s), without marking it seen. Once C's messages arrive faster than A validates
them, B's VALIDATEs queue behind C's: they time out, are IGNOREd, never delivered and never re-requested; A also
keeps validating the flood's expired VALIDATEs, so the backlog drains no faster. B is silent until it has drained.
Prints one JSON line: B's longest silence at A and when it began, what A validated, A's host counters.
`run_peer` is the peer processes' side (`python -m simulations.attack_backlog peer ADDR COUNT INTERVAL`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time

from swarm_node.identity import generate
from swarm_node.transport.base import ValidationResult
from swarm_node.transport.libp2p.ipc import HostSettings
from swarm_node.transport.libp2p.launch import LibP2PConfig
from swarm_node.transport.libp2p.transport import LibP2PTransport

TOPIC = "backlog-test"


def transport() -> LibP2PTransport:
    return LibP2PTransport(generate(), LibP2PConfig(host=HostSettings(listen=("/ip4/127.0.0.1/tcp/0",))))


async def run_peer(addr: str, count: int, interval_s: float) -> None:
    """Connect to `addr`, say "ready <peer id>", publish `count` messages `interval_s` apart, say "done"."""
    t = transport()
    await t.start()
    try:
        await t.subscribe(TOPIC, lambda _d: None)
        await t.connect(addr)
        while not any(TOPIC in p.topics for p in await t.peers()):
            await asyncio.sleep(0.1)
        await asyncio.sleep(1.0)  # the mesh grafts
        print("ready", t.peer_id, flush=True)
        sys.stdin.readline()  # go
        for i in range(count):
            await t.publish(TOPIC, f"{i}:".encode() + os.urandom(1000))
            if interval_s:
                await asyncio.sleep(interval_s)
        print("done", flush=True)
        await asyncio.sleep(3600)
    finally:
        await t.stop()


def peer(addr: str, count: int, interval_s: float) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "simulations.attack_backlog", "peer", addr, str(count),
                             str(interval_s)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            start_new_session=True)


async def experiment(cost_s: float, flood: int, seconds: float) -> dict[str, object]:
    a = transport()
    await a.start()
    procs: list[subprocess.Popen[str]] = []
    try:
        got: list[tuple[float, str]] = []
        await a.subscribe(TOPIC, lambda d: got.append((time.monotonic(), d.from_peer)))
        procs = [peer(a.listen_addrs()[0], int(seconds / 0.5), 0.5), peer(a.listen_addrs()[0], flood, 0.0)]
        ids = [await asyncio.to_thread(lambda p=p: p.stdout.readline().split()[1]) for p in procs]  # type: ignore
        honest = ids[0]

        def validate(signer: str, data: bytes) -> ValidationResult:
            started = time.perf_counter()
            while time.perf_counter() - started < cost_s:
                pass
            return ValidationResult.ACCEPT if signer == honest else ValidationResult.IGNORE

        a.set_validator(TOPIC, validate)
        t0 = time.monotonic()
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        await asyncio.sleep(seconds + 5)
        mine = [t - t0 for t, who in got if who == honest]
        gaps = [(round(y - x, 1), round(x, 1)) for x, y in zip([0.0, *mine], mine, strict=False)]
        return {"cost_ms": cost_s * 1000, "flood": flood, "honest_sent": int(seconds / 0.5),
                "honest_delivered": len(mine), "longest_silence_s": max(gaps)[0] if gaps else None,
                "silence_began_s": max(gaps)[1] if gaps else None, "validated": dict(a.stats.validated),
                "host": await a.host_counters()}
    finally:
        for p in procs:
            p.kill()
            p.wait()
        await a.stop()


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "peer":
        asyncio.run(run_peer(sys.argv[2], int(sys.argv[3]), float(sys.argv[4])))
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cost-ms", type=float, default=10.0, help="validation cost per message on the node's loop")
    ap.add_argument("--flood", type=int, default=3000)
    ap.add_argument("--seconds", type=float, default=60.0)
    args = ap.parse_args()
    print(json.dumps(asyncio.run(experiment(args.cost_ms / 1000, args.flood, args.seconds))))


if __name__ == "__main__":
    main()
