"""A gossip-only stand-in of a bounded fan-in node: realistic groups, the node's FaninExchange, no model (issue 32).

Contract:
- `sized_group(sender, group_id, task_index, signal, created_at, rng, group_bytes)`: a RolloutGroup whose
  canonical encoding (`encode_group`, what a pull carries) is `group_bytes` long within one token's bytes; 8
  completions of a char tokenizer's ids (no model, no tokenizer download); with `signal`, 1 to 7 of them have
  reward 1 (the variance differs from group to group), else all 0.
- `StandIn(exchange, setup, rng)`: one node of the issue's setting (`simulations.scale_model.ScaleSetup`: I groups
  per round, signal with probability `signal_p`, `tasks` task indices). `await step(round_index)` publishes the
  round's I groups and flushes (pulls what the digests heard since the last flush offered, pushes the unpulled,
  publishes the new digests), like `join` once per training step, then records the round: `rounds` holds one
  dict per finished round with the exchange's RoundStats fields, the wire counters' deltas (`WireCounters`) and
  the usable groups that arrived (signal-bearing, per their digest) and from whom; `published` the groups of
  each round.
- `WireCounters` and `count_libp2p_wire(counters)`: measurement only, in this process (the libp2p host on a trio
  thread, isolation "thread"): every byte read from a TCP connection (`wire_bytes`: Noise, yamux, identify,
  gossipsub, streams), every gossipsub RPC read (`rpcs`, `rpc_bytes`: data, IHAVE/IWANT/GRAFT/PRUNE/IDONTWANT,
  subscriptions; `rpc_<kind>`: the RPCs carrying each kind) and every pull/push frame read (`frames`,
  `frame_bytes`: requests served, answers, pushes), and how our own pulls ended (answered, failed, groups refused).
  It also keeps the gossipsub router(s) this process builds (`ROUTERS`), so that each recorded round carries
  `router_state()`: the mesh size and topic peers of each digest topic and the heartbeat interval at that moment
  (py-libp2p's adaptive gossip changes it; docs/SWARM_SCALE.md, "Real against simulated at N = 16").
- `python -m bench.fanin_standin --index I --seed S` (what bench/fanin_real.py starts): prints one JSON line
  {"peer_id", "addr"}, reads one JSON line {"dial": [addrs], "start_at", "round_s", "rounds", ...} from stdin,
  dials, runs `rounds` rounds flushing at `start_at + r * round_s + U(0, publish_spread_s)` (the simulator's
  publish offsets), then prints {"rounds": [...], "rss_kb": peak RSS} and exits.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import resource
import sys
import time
from dataclasses import asdict, dataclass, fields
from typing import Any

from protocol.codec import encode_group
from protocol.limits import Limits
from protocol.messages import CompletionWire, RolloutGroup, TaskRefWire
from simulations.scale_model import ScaleSetup
from swarm_node import tasks
from swarm_node.model.tokenizer import build_char_tokenizer, tokenizer_hash
from swarm_node.sharing.exchange import RoundStats, accept_policy_for
from swarm_node.sharing.fanin import FanInParams
from swarm_node.sharing.fanin_exchange import FaninExchange

COMPLETIONS = 8
TOKENIZER = build_char_tokenizer()
SOURCE = tasks.TaskSource()
LIMITS = Limits(vocab_size=len(TOKENIZER))


def _group(sender: str, group_id: bytes, task_index: int, rewards: list[float], tokens: int, created_at: float,
           rng: random.Random) -> RolloutGroup:
    completions = []
    for reward in rewards:
        ids = tuple(rng.randrange(3, len(TOKENIZER)) for _ in range(tokens)) + (TOKENIZER.eos_token_id,)
        completions.append(CompletionWire(ids, TOKENIZER.decode(list(ids)), tuple(-0.5 for _ in ids), reward))
    return RolloutGroup(group_id, sender, 0, TaskRefWire(SOURCE.name, SOURCE.config, SOURCE.seed, task_index),
                        tuple(completions), tokenizer_hash(TOKENIZER), "qwen2", created_at)


def sized_group(sender: str, group_id: bytes, task_index: int, signal: bool, created_at: float,
                rng: random.Random, group_bytes: int) -> RolloutGroup:
    """See the module contract (sizes are measured by encoding, per token count, not assumed)."""
    winners = rng.randint(1, COMPLETIONS - 1) if signal else 0
    rewards = [1.0] * winners + [0.0] * (COMPLETIONS - winners)
    probe = random.Random(0)
    one, two = (len(encode_group(_group(sender, group_id, task_index, rewards, t, created_at, probe))) for t in (1, 2))
    tokens = max(1, 1 + round((group_bytes - one) / max(two - one, 1)))
    return _group(sender, group_id, task_index, rewards, tokens, created_at, rng)


@dataclass
class WireCounters:
    wire_bytes: int = 0
    rpcs: int = 0
    rpc_bytes: int = 0
    frames: int = 0
    frame_bytes: int = 0
    rpc_publish: int = 0  # RPCs carrying data messages, and the RPCs that carry each kind of control
    rpc_ihave: int = 0
    rpc_iwant: int = 0
    rpc_graft: int = 0
    rpc_prune: int = 0
    rpc_idontwant: int = 0
    rpc_subscriptions: int = 0
    publish_msgs: int = 0  # data messages (a digest batch, a copy of one) in those RPCs
    pulls_answered: int = 0  # our pull requests that got a PullResponse ...
    pulls_failed: int = 0  # ... or none (PullFailed: a timeout, a stream that broke off) ...
    pulls_timed_out: int = 0  # ... of which: no complete answer within pull_timeout_s
    groups_refused: int = 0  # groups refused in those answers (NOT_HELD, BUSY, ...)

    def snapshot(self) -> dict[str, int]:
        return asdict(self)

    def count_rpc(self, data: bytes) -> None:
        from libp2p.pubsub.pb import rpc_pb2

        rpc = rpc_pb2.RPC()
        rpc.ParseFromString(data)
        self.rpcs += 1
        self.rpc_bytes += len(data)
        self.publish_msgs += len(rpc.publish)
        self.rpc_publish += bool(rpc.publish)
        self.rpc_subscriptions += bool(rpc.subscriptions)
        for kind in ("ihave", "iwant", "graft", "prune", "idontwant"):
            if rpc.HasField("control") and len(getattr(rpc.control, kind)):
                setattr(self, f"rpc_{kind}", getattr(self, f"rpc_{kind}") + 1)


ROUTERS: list[Any] = []  # the SharingGossipSub instances built in this process (count_libp2p_wire)


def router_state() -> dict[str, Any]:
    """{"digest_mesh": [mesh size per digest topic], "digest_topic_peers": [...], "heartbeat_s": float}, or {}
    without a router; read from the host's thread, so retried if a dict changes while it is read."""
    from protocol.messages import TOPIC_DIGESTS_PREFIX

    for _ in range(5):
        try:
            out: dict[str, Any] = {}
            for router in ROUTERS:
                topics = sorted(t for t in list(router.mesh) if t.startswith(TOPIC_DIGESTS_PREFIX))
                peers = router.pubsub.peer_topics if router.pubsub is not None else {}
                out = {"digest_mesh": [len(router.mesh.get(t, ())) for t in topics],
                       "digest_topic_peers": [len(peers.get(t, ())) for t in topics],
                       "heartbeat_s": float(router.heartbeat_interval)}
            return out
        except RuntimeError:  # changed size during iteration
            continue
    return {}


def count_libp2p_wire(counters: WireCounters) -> None:
    """Wrap py-libp2p's TCP reads and gossipsub's RPC reads, and the pull/push frame reads (see the contract)."""
    import libp2p.io.trio as trio_io  # the host's library: loaded here only, for the thread isolation
    import libp2p.pubsub.pubsub as pubsub

    from swarm_node.sharing import pull_session, pull_stream
    from swarm_node.transport.libp2p import router

    router_init = router.SharingGossipSub.__init__

    def keep_router(self: Any, *args: Any, **kwargs: Any) -> None:
        router_init(self, *args, **kwargs)
        ROUTERS.append(self)

    router.SharingGossipSub.__init__ = keep_router  # type: ignore[method-assign]
    tcp_read = trio_io.TrioTCPStream.read

    async def read(self: Any, n: int | None = None) -> bytes:
        data = await tcp_read(self, n)
        counters.wire_bytes += len(data)
        return data

    rpc_read = pubsub.read_varint_prefixed_bytes_limited

    async def read_rpc(*args: Any, **kwargs: Any) -> bytes:
        data = await rpc_read(*args, **kwargs)
        counters.count_rpc(data)
        return data

    frame_read = pull_stream.read_frame

    async def read_frame(*args: Any, **kwargs: Any) -> bytes:
        data = await frame_read(*args, **kwargs)
        counters.frames += 1
        counters.frame_bytes += len(data) + pull_stream.LENGTH_BYTES
        return data

    request_read = pull_session._next_request  # a pull stream's server reads its requests so (None: the end)

    async def next_request(*args: Any, **kwargs: Any) -> bytes | None:
        data = await request_read(*args, **kwargs)
        if data is not None:
            counters.frames += 1
            counters.frame_bytes += len(data) + pull_stream.LENGTH_BYTES
        return data

    pull = pull_session.PullSessions.request

    async def request_pull(*args: Any, **kwargs: Any) -> Any:
        try:
            response = await pull(*args, **kwargs)
        except pull_stream.PullFailed as failed:
            counters.pulls_failed += 1
            counters.pulls_timed_out += failed.reason == "timeout"
            if counters.pulls_failed <= 3:  # what broke, for the log (the first few)
                print(f"pull failed: {failed}", file=sys.stderr, flush=True)
            raise
        counters.pulls_answered += 1
        counters.groups_refused += len(response.refused)
        return response

    pull_session.PullSessions.request = request_pull  # type: ignore[method-assign]
    trio_io.TrioTCPStream.read = read  # type: ignore[method-assign]
    pubsub.read_varint_prefixed_bytes_limited = read_rpc
    pull_stream.read_frame = read_frame  # type: ignore[assignment]
    pull_session.read_frame = read_frame  # type: ignore[assignment]
    pull_session._next_request = next_request  # type: ignore[assignment]


class StandIn:
    def __init__(self, exchange: FaninExchange, setup: ScaleSetup, rng: random.Random,
                 counters: WireCounters | None = None) -> None:
        self.exchange, self.setup, self.rng = exchange, setup, rng
        self.counters = counters or WireCounters()
        self.rounds: list[dict[str, Any]] = []
        self.published: list[list[RolloutGroup]] = []  # per round: the groups we published
        self._closed: list[RoundStats] = []
        self._mark = self.counters.snapshot()
        exchange.on_round = self._closed.append

    def groups_for(self, round_index: int, now: float) -> list[RolloutGroup]:
        s, me = self.setup, self.exchange.peer_id
        return [sized_group(me, self.rng.randbytes(16), self.rng.randrange(s.tasks), self.rng.random() < s.signal_p,
                            now, self.rng, s.group_bytes) for _ in range(s.groups_per_node)]

    async def step(self, round_index: int) -> None:
        self.published.append(self.groups_for(round_index, time.time()))
        self.exchange.publish(self.published[-1])
        await self.exchange.flush()
        self._record()

    def _record(self) -> None:
        now = self.counters.snapshot()
        delta = {k: now[k] - self._mark[k] for k in now}
        self._mark = now
        got = [r for r in self.exchange.drain() if r.group is not None]
        usable = [r for r in got if len({c.claimed_reward for c in r.group.completions}) > 1]  # type: ignore[union-attr]
        stats = self._closed[-1] if self._closed else RoundStats()
        closed = {f.name: getattr(stats, f.name) for f in fields(RoundStats) if f.name != "by_reason"}
        self.rounds.append({**closed, **delta, "drops": dict(stats.by_reason), "groups": len(got),
                            "usable": len(usable), "senders": sorted({r.sender for r in got}),
                            "router": router_state()})


async def _run(args: argparse.Namespace) -> None:
    from swarm_node.identity import generate
    from swarm_node.transport.libp2p.ipc import HostSettings
    from swarm_node.transport.libp2p.launch import LibP2PConfig
    from swarm_node.transport.libp2p.transport import LibP2PTransport

    counters = WireCounters()
    count_libp2p_wire(counters)
    cfg = LibP2PConfig(host=HostSettings(listen=("/ip4/127.0.0.1/tcp/0",)), isolation="thread")
    transport = LibP2PTransport(generate(), cfg)
    await transport.start()
    try:
        rng = random.Random(f"{args.seed}-{args.index}")
        exchange = FaninExchange(transport, LIMITS, accept_policy_for(SOURCE), FanInParams(), rng.randbytes(32),
                                 n_peers=args.nodes)
        await exchange.start()
        print(json.dumps({"peer_id": transport.peer_id, "addr": transport.listen_addrs()[0]}), flush=True)
        plan = json.loads(await asyncio.to_thread(sys.stdin.readline))
        for addr in plan["dial"]:
            await transport.connect(addr)
        setup = ScaleSetup(n=args.nodes, round_s=plan["round_s"], publish_spread_s=plan["publish_spread_s"])
        standin = StandIn(exchange, setup, rng, counters)
        for r in range(plan["rounds"]):
            due = plan["start_at"] + r * setup.round_s + rng.uniform(0, setup.publish_spread_s)
            await asyncio.sleep(max(0.0, due - time.time()))
            await standin.step(r)
        rss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print(json.dumps({"rounds": standin.rounds, "rss_kb": rss_kb}), flush=True)
    finally:
        await transport.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--nodes", type=int, required=True, help="the swarm's size (the shard count's first guess)")
    parser.add_argument("--seed", type=int, default=0)
    asyncio.run(_run(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
