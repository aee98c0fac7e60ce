"""The one ingest path for received rollouts, used by every role (SAPO peer, ECHO-2 learner), and its peer guard.

Contract: `Ingest(ctx, stats, delegates, keep_no_signal, guard)(received, now, sink)` takes what an `Exchange`
drained (wire validation already done there: a `Received` without a group is a wire drop with its reason), asks the
`PeerGuard` (if any) whether the sender may have work done at all (its state, then its budget: refused groups are
dropped BEFORE any work, reason "graylisted" / "banned" / "denied" / "peer_budget" / "node_budget"), re-scores
every admitted group with our own verifier (`rescore.accept_external`, its measured cost charged to the sender's
budget), hands each accepted group to `sink` (the experience pool, the learner's buffer), and counts: `NodeStats`
drops per reason, accepted/rejected messages per peer, forged rewards, and `peer_drops` per (sender, reason).
`sink(external, sender)` returns the drops that putting the group caused (e.g. pool evictions, a learner refusing
a version it never published), counted the same way. Every drop, forged reward and accepted group is also an event
for the sender's reputation. Returns this call's drop counts by reason. The caller drains and passes the time.
With `pass_rates` (a `tasks.PassRateBook`: `[task] adaptive_from_peers`), every group accepted and not forged feeds
the book with OUR re-scored rewards under the sender's name (the book bounds each peer's share), and a sender whose
groups imply pass rates far from ours on the same instances (`PassRateBook.newly_disagreeing`) is recorded once per
episode as "pass_rate_disagreement" against its reputation (counted in `errors`).

`PeerGuard` holds one node's `PeerBudget` (sharing/budget.py) and `Reputation` (sharing/reputation.py). Its
`settle(now)` (after each ingest call) keeps the ban file `RUN_DIR/peers.json` in step: an edit on disk (`swarm-node
peers unban`) is read back first (a ban gone from the file is lifted in the running node), then the node's own
bans are written; it also publishes the blocked peers to `blocked(signer)` (read by the gossip validator on the
network thread: a whole-mapping swap, no lock), each peer's score and state to `NodeStats`, and the scores to
`push` (the libp2p host's application-specific score), at once when the blocked set changes, else every
`push_every_s`. The only I/O is the ban file and `push`. `blocked(signer)` also spends the signer's message rate
(`rate`, a transport/shaping.RequestBudget keyed by signer, if any: `[peers] max_messages_per_s`, `message_burst`;
no total of its own: the libp2p host's per-forwarder budget bounds many identities together): past it, the
message is ignored unread too (counted `dropped`/"flood"), and the next `settle` records each such message as a
"flood" event in the signer's reputation (weight 0 by default: a fast honest peer may exceed the rate; `[peers]
weights` can make floods cost reputation).
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from types import MappingProxyType

from swarm_node.config import PeersConfig
from swarm_node.errors import UserError
from swarm_node.sharing.budget import BudgetParams, PeerBudget
from swarm_node.sharing.exchange import Received
from swarm_node.sharing.reputation import (
    BLOCKED,
    PEERS_FILE,
    Reputation,
    ReputationParams,
    read_bans,
    write_bans,
)
from swarm_node.sharing.rescore import External, ShareContext, accept_external
from swarm_node.status.stats import NodeStats
from swarm_node.tasks import PassRateBook
from swarm_node.transport.shaping import RequestBudget

Sink = Callable[[External, str], Iterable[tuple[str, str]]]  # (group, sender) -> drops it caused: (sender, reason)
ScorePush = Callable[[dict[str, float]], None]
FLOOD = "flood"  # the drop reason and reputation event of a message past its signer's rate
MAX_PUSHED_SCORES = 1024  # peers whose score goes to the libp2p host per push (blocked ones first)


class PeerGuard:
    """Per-peer budgets and reputation around the ingest path; see the module contract."""

    def __init__(self, reputation: Reputation, budget: PeerBudget | None = None, stats: NodeStats | None = None,
                 bans_path: Path | None = None, push_every_s: float = 5.0, rate: RequestBudget | None = None,
                 push: ScorePush | None = None) -> None:
        self.reputation = reputation
        self.budget = budget
        self.stats = stats or NodeStats()
        self.bans_path = bans_path
        self.push_every_s = push_every_s
        self.push = push  # the libp2p host's scores (roles/wiring.push_scores); None: nothing to push to
        self.rate = rate  # messages per signer, spent by `blocked` on the network thread only
        self._flooded: deque[str] = deque(maxlen=1 << 16)  # signers refused by `rate`, for the next settle
        self._blocked: Mapping[str, str] = MappingProxyType({})
        self._file_sig: tuple[int, int, int] | None = None
        self._written: dict[str, float] | None = None
        self._reported: dict[str, tuple[float, str]] = {}
        self._pushed_at: float | None = None
        self._pushed_blocked: frozenset[str] = frozenset()

    @classmethod
    def from_config(cls, cfg: PeersConfig, run_dir: Path, stats: NodeStats, now: float,
                    push: ScorePush | None = None) -> PeerGuard:
        """The guard of a node: `[peers]` settings, bans loaded from RUN_DIR/peers.json (UserError if malformed)."""
        params = ReputationParams(half_life_s=cfg.half_life_s, graylist_score=cfg.graylist_score,
                                  ban_score=cfg.ban_score, ban_s=cfg.ban_s, weights=dict(cfg.weights),
                                  allow=frozenset(cfg.allow), deny=frozenset(cfg.deny))
        budget = PeerBudget(BudgetParams(share=cfg.rescore_share, burst_s=cfg.burst_s,
                                         window_s=cfg.active_window_s))
        rate = RequestBudget(cfg.max_messages_per_s, cfg.message_burst) if cfg.max_messages_per_s > 0 else None
        guard = cls(Reputation(params), budget, stats, run_dir / PEERS_FILE, rate=rate, push=push)
        try:
            guard.settle(now)
        except ValueError as exc:
            raise UserError(str(exc)) from exc
        return guard

    def blocked(self, signer: str) -> bool:
        """True if `signer`'s message is to be ignored unread (graylisted, banned, denied, or past its message
        rate); the network thread (one thread: the rate is its own state)."""
        state = self._blocked.get(signer)
        if state is None and self.rate is not None and self.rate.take(signer) != "ok":
            state = FLOOD
            self._flooded.append(signer)
        if state is None:
            return False
        self.stats.count("dropped", state)
        return True

    def admit(self, sender: str, now: float) -> str:
        """"" if work may be done on the sender's next group, else the drop reason (nothing is charged)."""
        state = self.reputation.state(sender, now)
        if state in BLOCKED:
            return state
        return self.budget.admit(sender, now) if self.budget is not None else ""

    def charge(self, sender: str, cost_s: float, now: float) -> None:
        if self.budget is not None:
            self.budget.charge(sender, cost_s, now)

    def record(self, sender: str, kind: str, now: float, n: int = 1) -> None:
        self.reputation.record(sender, kind, now, n)

    def settle(self, now: float) -> None:
        """Sync the ban file, then publish states to the validator, the stats and the libp2p host."""
        rep = self.reputation
        flooded: Counter[str] = Counter()
        while self._flooded:
            flooded[self._flooded.popleft()] += 1
        for peer, n in flooded.items():
            rep.record(peer, FLOOD, now, n)
        if self.bans_path is not None:
            self._read_file(now)
        rep.expire(now)
        if self.bans_path is not None:
            bans = rep.active_bans(now)
            if bans != self._written:
                if bans or self._file_sig is not None:  # no file is written until there is a ban
                    write_bans(self.bans_path, bans)
                    self._file_sig = _signature(self.bans_path)
                self._written = bans
        peers = rep.peers(now)
        blocked = {peer: state for peer, (_, state) in peers.items() if state in BLOCKED}
        self._blocked = MappingProxyType(blocked)
        reported: dict[str, tuple[float, str]] = {}
        for peer, (score, state) in peers.items():
            reported[peer] = (round(score, 3), state)
        for peer in set(self._reported) - set(reported):
            reported[peer] = (0.0, "ok")  # forgotten: decayed to 0, ban lifted
        for peer, (score, state) in reported.items():
            if self._reported.get(peer) != (score, state):
                self.stats.upsert_peer(peer, score=score, state=state)
        self._reported = {p: v for p, v in reported.items() if p in peers}
        changed = frozenset(blocked) != self._pushed_blocked
        if self.push is not None and (changed or self._pushed_at is None
                                      or now - self._pushed_at >= self.push_every_s):
            self.push(rep.app_scores(now, MAX_PUSHED_SCORES))
            self._pushed_at, self._pushed_blocked = now, frozenset(blocked)

    def _read_file(self, now: float) -> None:
        """Read the ban file back if it changed on disk since we last read or wrote it (an operator's edit)."""
        assert self.bans_path is not None
        sig = _signature(self.bans_path)
        if sig == self._file_sig:
            return
        try:
            on_disk = read_bans(self.bans_path, now)
        except ValueError:
            if self._file_sig is None and self._written is None:
                raise  # at start: the operator must fix it
            self.stats.count("errors", "peers_file")  # while running: keep our state, rewrite the file
            self._written = None
            return
        rep = self.reputation
        if self._written is not None:  # running: a ban gone from the file was lifted by the operator
            for peer in set(rep.active_bans(now)) - set(on_disk):
                rep.unban(peer)
        for peer, until in on_disk.items():
            rep.ban(peer, until)
        self._file_sig = sig
        self._written = rep.active_bans(now)


def _signature(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_mtime_ns, st.st_size, st.st_ino


class Ingest:
    def __init__(self, ctx: ShareContext, stats: NodeStats, delegates: Mapping[str, frozenset[str]] | None = None,
                 keep_no_signal: bool = False, guard: PeerGuard | None = None,
                 cost_clock: Callable[[], float] = time.perf_counter, pass_rates: PassRateBook | None = None) -> None:
        self.ctx = ctx
        self.stats = stats
        self.delegates = delegates  # read at each call: a learner admits workers as they join
        self.keep_no_signal = keep_no_signal
        self.guard = guard
        self.cost_clock = cost_clock  # measures the re-scoring work charged to a sender's budget
        self.pass_rates = pass_rates  # fed with accepted groups' re-scored rewards (the adaptive selection's)
        self.peer_drops: Counter[tuple[str, str]] = Counter()  # (sender, reason), incl. forged_reward
        self._now = 0.0  # time of the current (or last) call, for drops counted from outside (pool expiry)

    def drop(self, sender: str, reason: str, dropped: dict[str, int]) -> None:
        """Count one dropped group of `sender` (also into this call's `dropped`, and its reputation)."""
        dropped[reason] = dropped.get(reason, 0) + 1
        self.stats.count("dropped", reason)
        self.peer_drops[(sender, reason)] += 1
        if self.guard is not None:
            self.guard.record(sender, reason, self._now)

    def _learn_pass_rates(self, external: External, sender: str, now: float) -> None:
        assert self.pass_rates is not None
        self.pass_rates.record(external.group.inst.ref, external.group.correctness(), peer=sender)
        if self.pass_rates.newly_disagreeing(sender):
            self.stats.count("errors", "pass_rate_disagreement")
            self.peer_drops[(sender, "pass_rate_disagreement")] += 1
            if self.guard is not None:
                self.guard.record(sender, "pass_rate_disagreement", now)

    def __call__(self, received: list[Received], now: float, sink: Sink) -> dict[str, int]:
        self._now = now
        guard = self.guard
        dropped: dict[str, int] = {}
        for item in received:
            if item.group is None:
                self.drop(item.sender, item.reason, dropped)
                self.stats.count_peer_message(item.sender, accepted=False)
                continue
            self.stats.count("groups", "received")
            refused = guard.admit(item.sender, now) if guard is not None else ""
            if refused:  # before any work: its state, or its budget
                self.drop(item.sender, refused, dropped)
                self.stats.count_peer_message(item.sender, accepted=False)
                continue
            started = self.cost_clock()
            outcome = accept_external(item.group, item.sender, self.ctx, now, self.delegates,
                                      keep_no_signal=self.keep_no_signal)
            if guard is not None:
                guard.charge(item.sender, self.cost_clock() - started, now)
            if outcome.forged_reward:
                self.stats.count("errors", "forged_reward")
                self.peer_drops[(item.sender, "forged_reward")] += 1
                if guard is not None:
                    guard.record(item.sender, "forged_reward", now)
            self.stats.count_peer_message(item.sender, accepted=outcome.external is not None
                                          and not outcome.forged_reward)
            if outcome.malformed:  # not well-formed completions, re-scored 0 (counted, not a drop of the group)
                self.stats.count("errors", "malformed_completion", outcome.malformed)
            if outcome.external is None:
                self.drop(item.sender, outcome.reason, dropped)
                continue
            if guard is not None and not outcome.forged_reward:
                guard.record(item.sender, "accepted", now)
            if self.pass_rates is not None and not outcome.forged_reward:
                self._learn_pass_rates(outcome.external, item.sender, now)
            for sender, reason in sink(outcome.external, item.sender):
                self.drop(sender, reason, dropped)
        if guard is not None:
            guard.settle(now)
        return dropped
