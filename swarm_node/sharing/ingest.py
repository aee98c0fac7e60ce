"""The one ingest path for received rollouts, used by every role (SAPO peer, ECHO-2 learner).

Contract: `Ingest(ctx, stats, delegates, keep_no_signal)(received, now, sink)` takes what an `Exchange` drained
(wire validation already done there: a `Received` without a group is a wire drop with its reason), re-scores
every group with our own verifier (`rescore.accept_external`), hands each accepted group to `sink` (the
experience pool, the learner's buffer), and counts: `NodeStats` drops per reason, accepted/rejected messages per
peer, forged rewards, and `peer_drops` per (sender, reason). `sink(external, sender)` returns the drops that
putting the group caused (e.g. pool evictions, a learner refusing a version it never published), counted the same
way. Returns this call's drop counts by reason. No I/O: the caller drains and passes the time.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping

from swarm_node.sharing.exchange import Received
from swarm_node.sharing.rescore import External, ShareContext, accept_external
from swarm_node.status.stats import NodeStats

Sink = Callable[[External, str], Iterable[tuple[str, str]]]  # (group, sender) -> drops it caused: (sender, reason)


class Ingest:
    def __init__(self, ctx: ShareContext, stats: NodeStats, delegates: Mapping[str, frozenset[str]] | None = None,
                 keep_no_signal: bool = False) -> None:
        self.ctx = ctx
        self.stats = stats
        self.delegates = delegates  # read at each call: a learner admits workers as they join
        self.keep_no_signal = keep_no_signal
        self.peer_drops: Counter[tuple[str, str]] = Counter()  # (sender, reason), incl. forged_reward

    def drop(self, sender: str, reason: str, dropped: dict[str, int]) -> None:
        """Count one dropped group of `sender` (also into this call's `dropped`)."""
        dropped[reason] = dropped.get(reason, 0) + 1
        self.stats.count("dropped", reason)
        self.peer_drops[(sender, reason)] += 1

    def __call__(self, received: list[Received], now: float, sink: Sink) -> dict[str, int]:
        dropped: dict[str, int] = {}
        for item in received:
            if item.group is None:
                self.drop(item.sender, item.reason, dropped)
                self.stats.count_peer_message(item.sender, accepted=False)
                continue
            self.stats.count("groups", "received")
            outcome = accept_external(item.group, item.sender, self.ctx, now, self.delegates,
                                      keep_no_signal=self.keep_no_signal)
            if outcome.forged_reward:
                self.stats.count("errors", "forged_reward")
                self.peer_drops[(item.sender, "forged_reward")] += 1
            self.stats.count_peer_message(item.sender, accepted=outcome.external is not None
                                          and not outcome.forged_reward)
            if outcome.external is None:
                self.drop(item.sender, outcome.reason, dropped)
                continue
            for sender, reason in sink(outcome.external, item.sender):
                self.drop(sender, reason, dropped)
        return dropped
