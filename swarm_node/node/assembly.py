"""One assembly for every role, simulation and benchmark: a node and what it shares with, built once from config.

Contract: `assemble(cfg, sharing, transport=..., ...) -> Assembly`, the only place a node is put together with its
collaborators; nothing is patched into a node after it is built (a set-up node refuses attribute assignment).
`sharing` (`Sharing`) says what the node has besides itself:
- `NONE` (solo): the node alone: no pool, no peer guard, no share context.
- `ROLLOUTS` (ECHO-2 learner and worker, benchmarks): the peer guard (per-peer budgets and reputation, bans in
  RUN_DIR/peers.json, scores pushed by `push`), the share context received groups are re-scored with, and the group
  signer our groups go on the wire with. `open_exchange(transport, policy)` gives a role its rollout exchange with the
  guard's hook (graylisted, banned and denied signers IGNOREd before decoding); `learner()` / `worker()` the ECHO-2
  logic with the config's bound, batch, codec and publish interval (the one place they are built).
- `SAPO` (`join --role peer`, simulations): that, and the SAPO peer over `transport` (sharing/peer.py): its
  exchange (started by the caller on the transport's loop; by default the config's `share.fanin` from
  sharing/exchanges.EXCHANGES; `exchange`, a class or factory: a simulation's tracks rounds), the
  experience pool (`pool`, a class: a simulation may count what it hands out), the one ingest path. `outbox` adapts
  the exchange the peer publishes through (`join` flushes on the network thread: roles/wiring.BackgroundExchange).
Once the node is set up, one line says how its model's completions are read: the prompt format (the model's own or
`--prompt-format`) and every EOS id (`model_line`).
A node whose config has no run seed runs with 0; `join` first gives it one derived from the node's identity
(node/build.seeded), so that peers left at the defaults draw different tasks (an explicit seed reproduces a run).
`Assembly.source()` is what `node.run` iterates (the node's own generation, around which a SAPO peer publishes and
mixes in); `sample_and_share()` and `mix_and_train(item)` are its two halves for a lockstep simulation.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from protocol.validation import AcceptPolicy
from swarm_node import tasks
from swarm_node.config import NodeConfig
from swarm_node.echo.learner import Learner
from swarm_node.echo.worker import Worker
from swarm_node.node.core import Node
from swarm_node.node.run_files import NodeEvents, RunSummary
from swarm_node.node.sources import Item, RolloutSource, SharingSource
from swarm_node.sampler.base import Sampler
from swarm_node.sharing.exchange import Exchange, TransportExchange, accept_policy_for
from swarm_node.sharing.exchanges import EXCHANGES, ExchangeFactory, NetworkExchange
from swarm_node.sharing.ingest import Ingest, PeerGuard, ScorePush
from swarm_node.sharing.peer import SapoPeer
from swarm_node.sharing.pool import ExperiencePool
from swarm_node.sharing.rescore import CompletionBounds, ShareContext
from swarm_node.sharing.wire import GroupSigner
from swarm_node.status.stats import NodeStats
from swarm_node.transport.base import Transport


class Sharing(enum.Enum):
    NONE = "none"  # solo
    ROLLOUTS = "rollouts"  # hears from peers: guard, share context, signer (ECHO-2 roles)
    SAPO = "sapo"  # and shares rollouts as a SAPO peer over a transport


@dataclass(frozen=True)
class Assembly:
    node: Node
    guard: PeerGuard | None = None
    context: ShareContext | None = None
    signer: GroupSigner | None = None
    exchange: NetworkExchange | None = None  # the SAPO peer's, not started
    peer: SapoPeer | None = None

    def source(self) -> RolloutSource:
        if self.peer is None:
            return self.node.local_source()
        return SharingSource(self.node.local_source(self.peer.publish), self.peer)

    def run(self) -> RunSummary:
        return self.node.run(self.source())

    def sample_and_share(self) -> Item:
        """A lockstep step's first half: the node's draft, published by the SAPO peer (if any)."""
        item = self.node.draft()
        return self.peer.publish(item) if self.peer is not None else item

    def mix_and_train(self, item: Item) -> dict[str, Any]:
        """Its second half: the SAPO peer's external groups mixed in, one update, the step recorded."""
        return self.node.mix_and_train(self.peer.mix_in(item) if self.peer is not None else item)

    @property
    def peer_drops(self) -> dict[tuple[str, str], int]:
        return self.peer.peer_drops if self.peer is not None else {}

    def ingest(self, delegates: Mapping[str, frozenset[str]] | None = None, keep_no_signal: bool = False) -> Ingest:
        """The one ingest path with this node's guard (an ECHO-2 learner's: its workers' groups, signal or not)."""
        assert self.context is not None, "ingest() needs an assembly that hears from peers"
        return Ingest(self.context, self.node.stats, delegates, keep_no_signal=keep_no_signal, guard=self.guard)

    def open_exchange(self, transport: Transport, policy: AcceptPolicy | None = None) -> TransportExchange:
        """A rollout exchange over `transport` (not started) whose blocked signers are ignored unread."""
        return exchange_for(self.node, transport, self.guard, policy)

    def learner(self) -> Learner:
        cfg = self.node.cfg
        return Learner(self.node, batch_groups=self.node.hardware.sizes.prompts_per_step,
                       max_staleness=cfg.train.max_staleness,
                       max_new_tokens=cfg.sampler.max_new_tokens, encoding=cfg.echo.encoding,
                       publish_every=cfg.echo.publish_every, keep=cfg.echo.keep_versions)

    def worker(self, mid_apply: Callable[[int], None] | None = None) -> Worker:
        cfg = self.node.cfg
        return Worker(self.node, kappa=cfg.echo.publish_every, max_staleness=cfg.train.max_staleness,
                      keep=cfg.echo.keep_versions, max_delta_norm=cfg.echo.max_delta_norm, mid_apply=mid_apply)

    def close(self) -> None:
        self.node.close()


def exchange_for(node: Node, transport: Transport, guard: PeerGuard | None, policy: AcceptPolicy | None = None,
                 kind: ExchangeFactory = TransportExchange) -> NetworkExchange:
    exchange = kind(transport, node.wire_limits(), policy or accept_policy_for(node.task_source))
    exchange.on_round = lambda finished: node.stats.update(exchange=finished.as_status())
    if guard is not None:
        exchange.ignore_signer = guard.blocked
    return exchange


def share_context(node: Node) -> ShareContext:
    """How this node re-scores a received group: our tokenizer and tasks, and our own bounds (a peer's group may
    cost us only what one of ours does: our largest group, generation budget, context, vocabulary)."""
    cfg = node.cfg
    largest = tasks.ROLLOUT_ALLOCATIONS[cfg.run.rollout_allocation].largest(cfg.run.group_size)
    bounds = CompletionBounds(max_completion_tokens=cfg.sampler.max_new_tokens,
                              max_context=int(node.model.config.max_position_embeddings),
                              vocab_size=int(node.model.config.vocab_size), group_size=cfg.run.group_size,
                              max_group_completions=cfg.share.max_group_completions or largest,
                              max_group_tokens=cfg.share.max_group_tokens)
    return ShareContext(node.tokenizer, node.tokenizer_hash, node.task_source, bounds, cfg.train.advantage,
                        require_well_formed=cfg.share.require_well_formed, eos_ids=node.eos_ids,
                        prompter=node.prompter, terms=node.reward_terms)


def model_line(node: Node) -> str:
    """The prompt format a node reads its model's completions in (and whose choice it is), and every EOS id."""
    chosen = "--prompt-format" if node.cfg.task.prompt_format else "the model's own"
    return f"model: prompt format {node.prompter.name} ({chosen}), EOS ids {', '.join(map(str, node.eos_ids))}"


def assemble(cfg: NodeConfig, sharing: Sharing = Sharing.NONE, *, transport: Transport | None = None,
             stats: NodeStats | None = None, events: NodeEvents | None = None, model_dir: Path | None = None,
             sampler: Sampler | None = None, salt: int | None = None, push: ScorePush | None = None,
             outbox: Callable[[TransportExchange], Exchange] | None = None,
             pool: type[ExperiencePool] = ExperiencePool,
             exchange: ExchangeFactory | None = None) -> Assembly:
    """A set-up node and its collaborators (see the module contract); the node is closed if assembly fails."""
    node = Node(cfg, stats, events, model_dir=model_dir, sampler=sampler, salt=salt)
    try:
        node.setup()
        node.events.log(model_line(node))
        if sharing is Sharing.NONE:
            return Assembly(node)
        guard = PeerGuard.from_config(cfg.peers, node.run_dir, node.stats, time.time(), push=push)
        context = share_context(node)
        signer = GroupSigner(node.tokenizer_hash, node.family, cfg.run.seed, node.prompter.name)
        if sharing is Sharing.ROLLOUTS:
            return Assembly(node, guard, context, signer)
        if transport is None:
            raise ValueError("a SAPO peer needs a transport")
        rollouts = exchange_for(node, transport, guard, kind=exchange or EXCHANGES[cfg.share.fanin])
        sh = cfg.share
        peer = SapoPeer(outbox(rollouts) if outbox is not None else rollouts,
                        # Groups without signal reach the pool too: it tells their copies apart, then drops them
                        # (unless [share] filter_no_signal is off).
                        Ingest(context, node.stats, guard=guard, keep_no_signal=True,
                               pass_rates=node.task_source.book if cfg.task.adaptive_from_peers else None),
                        pool(sh.pool_size, sh.per_peer_pool_cap, sh.max_external_age,
                             keep_no_signal=not sh.filter_no_signal), sh, node.streams.share, signer,
                        lambda: node.step)
        return Assembly(node, guard, context, signer, rollouts, peer)
    except BaseException:
        node.close()
        raise
