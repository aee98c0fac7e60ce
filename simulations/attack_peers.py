"""Live peers against a real node: several py-libp2p identities in one trio process, honest stand-ins or attackers.

    python -m simulations.attack_peers --target MULTIADDR --roles fair fair forged_reward over_length sybil
           [--model DIR] [--config TOML] [--interval-s 2] [--seconds 60] [--seed 0]

A role is "fair" (an honest peer's valid groups: byzantine.fair) or an attack kind (simulations/byzantine.py
ATTACKS), optionally ":N" for N groups per interval instead of the kind's own `per_round` (a flood of valid
distinct groups: "fair:40"). Each identity is its own host (noise, gossipsub) on 127.0.0.1: it connects to the
target, subscribes to the rollout topic (a replay attacker re-sends what it receives), and every `interval_s`
publishes its groups, one group per message, validly signed with its own key. A Sybil's identity lasts
`rotate_rounds` intervals, then a fresh one (new key) takes over. The groups are shaped from the target's
configuration (`--config`, as given to `join`) and model directory (`--model`; default: the embedded model).
Events, JSON lines on stdout: {"event": "identity", "peer_id", "role"} for every identity once it has joined,
{"event": "done", "sent": {role: groups}} at the end. No guard of ours runs here: this is the other side.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

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

from protocol.codec import decode, encode
from protocol.errors import WireError
from protocol.limits import Limits
from protocol.messages import TOPIC_ROLLOUTS, RolloutBatch, RolloutGroup
from simulations.byzantine import ATTACKS, Attack, ForgeContext, fair

FAIR = "fair"
MAX_SEEN = 256


def emit(**event: Any) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def parse_role(text: str) -> tuple[str, Attack]:
    """"kind" or "kind:N" -> (kind, its Attack with N groups per interval)."""
    kind, _, count = text.partition(":")
    attack = Attack(fair) if kind == FAIR else ATTACKS[kind]
    if count:
        attack = Attack(attack.forge, int(count), attack.rotate_rounds)
    return kind, attack


class Peers:
    def __init__(self, ctx: ForgeContext, target: str, interval_s: float, seconds: float, seed: int) -> None:
        self.ctx, self.target, self.interval_s = ctx, target, interval_s
        self.end = trio.current_time() + seconds
        self.rng = random.Random(seed)
        self.sent: Counter[str] = Counter()

    async def role(self, kind: str, attack: Attack) -> None:
        """One role until the end: one identity, or a Sybil's succession of them."""
        lifetime = attack.rotate_rounds * self.interval_s if attack.rotate_rounds else float("inf")
        while trio.current_time() < self.end:
            try:
                await self.identity(kind, attack, min(self.end, trio.current_time() + lifetime))
            except Exception as exc:  # a refused or dropped connection is part of the game: count it, go on
                emit(event="error", role=kind, error=f"{type(exc).__name__}: {exc}")
                await trio.sleep(self.interval_s)

    async def identity(self, kind: str, attack: Attack, until: float) -> None:
        key_pair = create_new_key_pair(self.rng.randbytes(32))
        security = {NOISE_ID: NoiseTransport(key_pair, noise_privkey=x25519_key_pair().private_key)}
        host = new_host(key_pair=key_pair, sec_opt=security)
        gossipsub = GossipSub(protocols=[PROTOCOL_ID_V12, PROTOCOL_ID_V11], degree=6, degree_low=4, degree_high=12,
                              heartbeat_interval=1)
        pubsub = Pubsub(host, gossipsub)
        rng = random.Random(self.rng.random())
        async with host.run([multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")]), background_trio_service(pubsub), \
                background_trio_service(gossipsub):
            await pubsub.wait_until_ready()
            info = info_from_p2p_addr(multiaddr.Multiaddr(self.target))
            await host.connect(info)
            await pubsub.wait_for_peer(info.peer_id, timeout=20)
            sub = await pubsub.subscribe(TOPIC_ROLLOUTS)
            seen: list[RolloutGroup] = []
            signer = host.get_id().to_base58()
            emit(event="identity", peer_id=signer, role=kind)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self.collect, sub, seen)
                await trio.sleep(1.0)  # the mesh forms (subscriptions exchanged)
                while trio.current_time() < until:
                    for _ in range(attack.per_round):
                        for g in attack.forge(self.ctx, rng, signer, time.time(), seen):
                            await pubsub.publish(TOPIC_ROLLOUTS, encode(RolloutBatch((g,))))
                            self.sent[kind] += 1
                    await trio.sleep(self.interval_s)
                nursery.cancel_scope.cancel()

    @staticmethod
    async def collect(sub: Any, seen: list[RolloutGroup]) -> None:
        limits = Limits()
        while True:
            msg = await sub.get()
            try:
                batch = decode(msg.data, limits)
            except WireError:
                continue
            if isinstance(batch, RolloutBatch):
                seen.extend(batch.groups)
                del seen[:-MAX_SEEN]

    async def run(self, roles: list[tuple[str, Attack]]) -> None:
        async with trio.open_nursery() as nursery:
            for kind, attack in roles:
                nursery.start_soon(self.role, kind, attack)
        emit(event="done", sent=dict(self.sent))


def main() -> None:
    from swarm_node.config import load_config
    from swarm_node.model.default_model import ensure_default_model

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True, help="the node's multiaddr, with /p2p/<peer id>")
    ap.add_argument("--roles", nargs="+", required=True)
    ap.add_argument("--model", type=Path)
    ap.add_argument("--config", type=Path)
    ap.add_argument("--interval-s", type=float, default=2.0)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    roles = [parse_role(r) for r in args.roles]
    cfg = load_config(args.config, {})
    ctx = ForgeContext.from_config(cfg, args.model or ensure_default_model(recipe=cfg.model.recipe))

    async def go() -> None:
        await Peers(ctx, args.target, args.interval_s, args.seconds, args.seed).run(roles)

    trio.run(go)


if __name__ == "__main__":
    main()
