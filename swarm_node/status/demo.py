"""Synthetic training stats for previewing the dashboard without a model: `python -m swarm_node.status.demo`.

Contract: `demo_step(stats, step, rng)` writes one plausible step into a `NodeStats` (reward rising with noise,
throughput, rollout groups, drops, staleness, three peers, broadcast progress, a checkpoint every 25 steps)
through the same methods the node uses; `feed(stats, steps, interval_s, seed, stop)` does that in a loop. The
numbers are made up; nothing here touches a model or the network. Tests and the screenshot use it.
"""

from __future__ import annotations

import argparse
import math
import random
import threading
import time

from swarm_node.status.stats import NodeStats

DEMO_PEERS = (
    "12D3KooWJbYp5Xm9yLq3hQk8r2VdA7sQe4N1cT6uFzHwGoBpR5a",
    "12D3KooWQx2vL8nHc5fTt9eKa1mYpZ3rDg7uW4sJbN6oEiVhC2d",
    "12D3KooWfR7kT3pYb1zXv9sMq5LwH2nGc8aJdU6eNyKoPtB4x9s",
)
DEMO_PEER_ID = "12D3KooWDemoNodeE8cX3pQ7sL2vF9kT5mR1yH6bN4gJwZaUoYi"


def demo_start(stats: NodeStats, total_steps: int | None) -> None:
    stats.update(peer_id=DEMO_PEER_ID, role="peer", total_steps=total_steps,
                 listen_addrs=[f"/ip4/192.168.1.20/tcp/40111/p2p/{DEMO_PEER_ID}"])
    stats.set_phase("training")


def demo_step(stats: NodeStats, step: int, rng: random.Random) -> None:
    trend = 0.25 + 0.45 * (1 - math.exp(-step / 60))
    reward = min(1.0, max(0.0, trend + rng.gauss(0, 0.05)))
    stats.record_step({
        "step": step, "policy_version": step, "reward_mean": round(reward, 4),
        "accuracy": round(min(1.0, max(0.0, trend - 0.08 + rng.gauss(0, 0.04))), 4),
        "tokens_per_s": round(4200 + 250 * math.sin(step / 9) + rng.gauss(0, 120), 1),
        "loss": round(rng.gauss(0.02, 0.01), 4), "kl": round(0.002 * step ** 0.5, 4),
        "entropy": round(1.6 - 0.4 * (1 - math.exp(-step / 80)), 4), "clip_frac": round(rng.uniform(0, 0.06), 4),
    })
    received = rng.randint(6, 12)
    stats.count("groups", "produced", 8)
    stats.count("groups", "received", received)
    stats.count("groups", "used", 8 + received - 3)
    for reason, p in (("zero-advantage", 0.9), ("stale", 0.5), ("duplicate", 0.25), ("bad-signature", 0.05)):
        if rng.random() < p:
            stats.count("dropped", reason)
    for lag, p in ((0, 1.0), (1, 0.8), (2, 0.45), (3, 0.2), (4, 0.07)):
        if rng.random() < p:
            stats.count("staleness", lag, rng.randint(2, 6))
    for i, peer in enumerate(DEMO_PEERS):
        stats.count_peer_message(peer, accepted=rng.random() > 0.03 * (i + 1), n=rng.randint(2, 5))
        stats.upsert_peer(peer, latency_ms=round(18 + 35 * i + rng.gauss(0, 3), 1),
                          score=round(1.0 - 0.35 * i + rng.gauss(0, 0.05), 2))
    chunks = 64
    stats.update(pool_size=rng.randint(4, 24),
                 broadcast={"version": step, "chunks_done": (step * 7) % (chunks + 1), "chunks_total": chunks,
                            "peers_reached": 3})
    if step % 25 == 0:
        stats.update(last_checkpoint={"step": step, "path": f"runs/demo/checkpoints/step-{step:06d}"})


def feed(stats: NodeStats, steps: int, interval_s: float, seed: int = 0,
         stop: threading.Event | None = None) -> None:
    """Write `steps` demo steps, one every `interval_s` seconds, until done or `stop` is set."""
    rng = random.Random(seed)
    demo_start(stats, steps)
    stop = stop or threading.Event()
    for step in range(1, steps + 1):
        if stop.wait(interval_s):
            return
        demo_step(stats, step, rng)
    stats.set_phase("done")


def main() -> None:
    from swarm_node.status.server import StatusServer  # here so importing the demo data needs no aiohttp

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--steps", type=int, default=100000)
    parser.add_argument("--interval", type=float, default=0.5)
    args = parser.parse_args()
    stats = NodeStats()
    server = StatusServer(stats, port=args.port)
    print(f"status: {server.start()}", flush=True)
    try:
        feed(stats, args.steps, args.interval)
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()


if __name__ == "__main__":
    main()
