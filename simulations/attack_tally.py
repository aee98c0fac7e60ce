"""What an attack cell counts: attacker groups that reached an honest node's loss, and when attackers were blocked.

Contract: `TallyPool` is the node's `ExperiencePool` that reports every group it hands to an update
(`take`) to `on_take`, with the content the node had already trained on or published itself (`mark_seen`) before
it: those are exactly the external groups trained on. `AttackTally` maps each attacker identity to its kind
(`identity`), keeps the rewards a forged_reward attacker claimed per content key (`claimed`), and counts, per
kind: groups trained on (`attacker_groups_trained`) and bad groups trained on (`bad_groups_trained`: for
forged_reward only those whose CLAIMED rewards are the rewards trained on, i.e. a claim that reached the loss; for
replay only content the node had trained on or published before, i.e. a replay that made it count twice; for every
other kind any of its groups). A replay attacker also re-sends what it got from other attackers: such content,
which the node never saw because it ignored its first sender unread, is re-scored with our rewards and may be
trained on once; `replays_of_attackers` counts those that were. `blocked(round, nodes, now)` records the first
round at which every honest node blocks (graylisted, banned, denied) an identity. `state()` / `from_state` are
the JSON a cell snapshot keeps (claims and each pool's `before` are not kept: a resume loses the pools anyway, and
a replay of content trained before the resume would be counted as a first use). Pure apart from the pools it watches.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from simulations.variants import ATTACKS
from swarm_node.sharing.ingest import PeerGuard
from swarm_node.sharing.pool import ExperiencePool
from swarm_node.sharing.reputation import BLOCKED
from swarm_node.types import PoolEntry


class TallyPool(ExperiencePool):
    """An experience pool that reports what it hands to an update."""

    def __init__(self, capacity: int, per_peer_cap: int, max_age: int, keep_no_signal: bool = False) -> None:
        super().__init__(capacity, per_peer_cap, max_age, keep_no_signal)
        self.on_take: Callable[[list[PoolEntry], set[bytes]], None] | None = None
        self.before: set[bytes] = set()  # content trained on or published by this node so far

    @classmethod
    def like(cls, pool: ExperiencePool) -> TallyPool:
        """An empty pool with `pool`'s bounds (a node's pool is empty until its first ingest)."""
        return cls(pool.capacity, pool.per_peer_cap, pool.max_age, pool.keep_no_signal)

    def mark_seen(self, keys: Iterable[bytes]) -> None:
        keys = list(keys)
        self.before.update(keys)
        super().mark_seen(keys)

    def take(self, *args: Any, **kwargs: Any) -> list[PoolEntry]:
        picked = super().take(*args, **kwargs)
        if self.on_take is not None:
            self.on_take(picked, self.before)
        self.before.update(e.key for e in picked)
        return picked


class AttackTally:
    def __init__(self) -> None:
        self.kinds: dict[str, str] = {}  # attacker identity -> kind
        self.claims: dict[bytes, list[float]] = {}  # content key -> claimed rewards (forged_reward)
        self.trained: Counter[str] = Counter()  # kind -> its groups trained on
        self.bad: Counter[str] = Counter()  # kind -> bad groups trained on (module contract)
        self.external = 0  # external groups trained on, every sender
        self.laundered = 0  # replayed content first sent by another attacker, trained on
        self.blocked_round: dict[str, int] = {}  # identity -> first round every honest node blocked it

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> AttackTally:
        tally = cls()
        saved = state.get("tally")
        if saved:
            tally.kinds = dict(saved["kinds"])
            tally.trained = Counter(saved["trained"])
            tally.bad = Counter(saved["bad"])
            tally.external = int(saved["external"])
            tally.laundered = int(saved.get("laundered", 0))
            tally.blocked_round = {k: int(v) for k, v in saved["blocked_round"].items()}
        return tally

    def state(self) -> dict[str, Any]:
        return {"tally": {"kinds": self.kinds, "trained": dict(self.trained), "bad": dict(self.bad),
                          "external": self.external, "laundered": self.laundered,
                          "blocked_round": self.blocked_round}}

    def identity(self, peer: str, kind: str) -> None:
        self.kinds[peer] = kind

    def claimed(self, key: bytes, rewards: list[float]) -> None:
        self.claims[key] = rewards

    def watch(self, pool: ExperiencePool) -> None:
        assert isinstance(pool, TallyPool)
        pool.on_take = self.took

    def took(self, entries: list[PoolEntry], before: set[bytes]) -> None:
        """Groups one node trains on; `before`: the content it had trained on or published before them."""
        self.external += len(entries)
        for e in entries:
            kind = self.kinds.get(e.sender)
            if kind is None:
                continue
            self.trained[kind] += 1
            if kind == "forged_reward":
                self.bad[kind] += self.claims.get(e.key) == list(e.group.rewards)
            elif kind == "replay":
                self.bad[kind] += e.key in before
                self.laundered += e.key in self.claims
            else:
                self.bad[kind] += 1

    def blocked(self, rnd: int, guards: list[PeerGuard], now: float) -> None:
        """Record identities that every honest node (its peer guard) blocks as of round `rnd`."""
        for peer in self.kinds:
            if peer in self.blocked_round or not guards:
                continue
            if all(g.reputation.state(peer, now) in BLOCKED for g in guards):
                self.blocked_round[peer] = rnd

    def result(self) -> dict[str, Any]:
        present = sorted(set(self.kinds.values()), key=ATTACKS.index)
        rounds: dict[str, list[int | None]] = {k: [] for k in present}
        for peer, kind in self.kinds.items():
            rounds[kind].append(self.blocked_round.get(peer))
        return {"bad_groups_trained": {k: self.bad[k] for k in present},
                "attacker_groups_trained": {k: self.trained[k] for k in present},
                "external_groups_trained": self.external, "replays_of_attackers": self.laundered,
                "rounds_to_block": rounds}
