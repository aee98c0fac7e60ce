"""Per-peer work budgets for re-scoring: no peer may take more than its share of the node's time.

Contract (pure: no clock, no I/O; `now` is wall seconds passed in, costs are measured seconds passed in):
- The node allots `share` seconds of re-scoring work per wall second in total (`[peers] rescore_share`, e.g. 0.2
  of one core). It is split equally among the peers active in the last `window_s` seconds: each earns
  `share / active` seconds of work per second, up to `burst_s` saved.
- `admit(peer, now)` says, BEFORE any work is done on one of the peer's groups, whether it may have some:
  "" (yes), "peer_budget" (its balance is negative: it spent more than it earned) or "node_budget" (the node's
  own bucket, capped at `node_burst_s`, is negative: many identities together spent the node's share). A new peer
  starts with a full bucket (`burst_s`: an honest peer's first batch arrives at once); any peer not in debt is
  admitted.
- `charge(peer, cost_s, now)` debits the measured cost of the work done (a debt-based token bucket: one group may
  take a peer below zero, then it waits until its earnings pay the debt). One group's cost is itself bounded by
  our completion bounds (sharing/rescore.py), so the debt is bounded too.
- Bounded: over any interval of t seconds the node does at most `share * t + node_burst_s` seconds of work plus
  one group per admitted call, however many identities send; one peer gets at most `(share / active) * t +
  burst_s` plus one group. State is kept for at most `max_peers` peers (peers past it are refused until idle
  ones are forgotten: after `window_s` without traffic and with a full bucket again, i.e. exactly as a new one).
- Before any of this, on the network thread, messages per signer are capped before any decoding (`[peers]
  max_messages_per_s`, `message_burst`; a transport/shaping.RequestBudget in ingest.PeerGuard).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

PEER_BUDGET = "peer_budget"
NODE_BUDGET = "node_budget"


@dataclass(frozen=True)
class BudgetParams:
    share: float = 0.2  # seconds of work per wall second for all peers together
    burst_s: float = 5.0  # most work one peer (and the node's own bucket) may save up
    window_s: float = 60.0  # a peer counts as active this long after its last group
    max_peers: int = 4096  # peers with state at once
    node_bursts: int = 4  # the node's own bucket holds this many peers' bursts: one peer alone never empties it

    @property
    def node_burst_s(self) -> float:
        return self.burst_s * self.node_bursts

    def __post_init__(self) -> None:
        for name in ("share", "burst_s", "window_s"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"BudgetParams.{name} must be a finite number > 0, got {value!r}")
        for name in ("max_peers", "node_bursts"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ValueError(f"BudgetParams.{name} must be a positive int, got {value!r}")


@dataclass
class _Account:
    balance: float  # seconds of work it may still take (negative: debt)
    updated: float  # when balance was last brought up to date
    last_seen: float  # when it last sent a group


@dataclass
class PeerBudget:
    """The per-peer token buckets and the node's own bucket; see the module contract."""

    params: BudgetParams = field(default_factory=BudgetParams)
    accounts: dict[str, _Account] = field(default_factory=dict)
    node_balance: float = -1.0  # set to node_burst_s on the first call
    node_updated: float | None = None
    spent: dict[str, float] = field(default_factory=dict)  # peer -> total seconds charged (for reports and tests)
    pruned_at: float | None = None  # idle accounts are forgotten at most once per window

    def active(self, now: float) -> int:
        """Peers that sent a group within the window (at least 1, so a lone peer gets the whole share)."""
        horizon = now - self.params.window_s
        return max(1, sum(1 for a in self.accounts.values() if a.last_seen >= horizon))

    def rate(self, now: float) -> float:
        """Seconds of work one active peer earns per wall second now."""
        return self.params.share / self.active(now)

    def balance(self, peer: str, now: float) -> float:
        """The peer's balance brought up to `now` (burst_s for an unknown peer); does not change state."""
        account = self.accounts.get(peer)
        if account is None:
            return self.params.burst_s
        return self._earned(account, now, self.rate(now))

    def admit(self, peer: str, now: float) -> str:
        """"" if the peer's next group may be worked on, else the drop reason (nothing is charged)."""
        self._refill_node(now)
        if self.pruned_at is None or now - self.pruned_at >= self.params.window_s:
            self.pruned_at = now
            self._forget_idle(now, self.rate(now))
        rate = self.rate(now)
        account = self.accounts.get(peer)
        if account is None:
            if len(self.accounts) >= self.params.max_peers:
                self._forget_idle(now, rate)
            if len(self.accounts) >= self.params.max_peers:
                return PEER_BUDGET
            account = self.accounts[peer] = _Account(self.params.burst_s, now, now)
        account.balance = self._earned(account, now, rate)
        account.updated = max(account.updated, now)
        account.last_seen = max(account.last_seen, now)
        if account.balance < 0:
            return PEER_BUDGET
        if self.node_balance < 0:
            return NODE_BUDGET
        return ""

    def charge(self, peer: str, cost_s: float, now: float) -> None:
        """Debit `cost_s` seconds of work done for `peer` (after `admit`)."""
        cost = cost_s if math.isfinite(cost_s) and cost_s > 0 else 0.0
        self._refill_node(now)
        account = self.accounts.get(peer)
        if account is None:  # charged without admit (or forgotten since)
            account = self.accounts[peer] = _Account(self.params.burst_s, now, now)
        account.balance -= cost
        self.node_balance -= cost
        self.spent[peer] = self.spent.get(peer, 0.0) + cost

    def _earned(self, account: _Account, now: float, rate: float) -> float:
        elapsed = max(0.0, now - account.updated)
        return min(self.params.burst_s, account.balance + elapsed * rate)

    def _refill_node(self, now: float) -> None:
        if self.node_updated is None:
            self.node_balance, self.node_updated = self.params.node_burst_s, now
            return
        elapsed = max(0.0, now - self.node_updated)
        self.node_balance = min(self.params.node_burst_s, self.node_balance + elapsed * self.params.share)
        self.node_updated = max(self.node_updated, now)

    def _forget_idle(self, now: float, rate: float) -> None:
        """Drop the state of peers idle for the window whose bucket is full again (as a new peer's would be)."""
        horizon = now - self.params.window_s
        for peer in [p for p, a in self.accounts.items()
                     if a.last_seen < horizon and self._earned(a, now, rate) >= self.params.burst_s]:
            del self.accounts[peer]
            self.spent.pop(peer, None)

