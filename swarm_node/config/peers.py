"""`[peers]`: budgets and reputation for hostile peers (sharing/budget.py, sharing/reputation.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

from swarm_node.config.checks import non_negative, positive
from swarm_node.errors import ConfigError


@dataclass(frozen=True)
class PeersConfig:
    """Hostile peers (sharing/budget.py, sharing/reputation.py). rescore_share: seconds of re-scoring work per wall
    second for all peers together (of one core), split equally among the peers active in the last active_window_s;
    a peer may save up burst_s. Reputation decays with half_life_s; at graylist_score a peer's messages are ignored
    unread, at ban_score it is banned for ban_s (kept in RUN_DIR/peers.json; `swarm-node peers unban`). weights:
    score change per event kind (drop reason, "forged_reward", "accepted"), over the defaults. allow: never
    graylisted nor banned; deny: always ignored."""

    section: ClassVar[str] = "peers"

    rescore_share: float = 0.2
    burst_s: float = 5.0
    # Rollout messages per signer, before any decoding (sharing/ingest.PeerGuard's rate; 0: no limit). A peer sends
    # one message per training step (up to 16 groups); past the rate its messages are ignored unread (not held against
    # it: a fast honest peer may exceed it). Why 5/s: docs/MEASUREMENTS.md.
    max_messages_per_s: float = 5.0
    message_burst: float = 50.0
    active_window_s: float = 60.0
    half_life_s: float = 600.0
    graylist_score: float = -20.0
    ban_score: float = -50.0
    ban_s: float = 3600.0
    weights: dict[str, float] = field(default_factory=dict)
    allow: list[str] = field(default_factory=list)
    deny: list[str] = field(default_factory=list)

    def validate(self) -> None:
        positive(self, "rescore_share", "burst_s", "active_window_s", "half_life_s", "ban_s")
        non_negative(self, "max_messages_per_s")
        if self.message_burst < 1:
            raise ConfigError(f"peers.message_burst must be >= 1, got {self.message_burst}")
        if not self.ban_score <= self.graylist_score < 0:
            raise ConfigError(f"peers needs ban_score <= graylist_score < 0, got ban_score {self.ban_score}, "
                              f"graylist_score {self.graylist_score}")
        for kind, value in self.weights.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ConfigError(f"peers.weights.{kind} must be a finite number, got {value!r}")
        for name in ("allow", "deny"):
            for peer in getattr(self, name):
                if not isinstance(peer, str) or not peer.isalnum():
                    raise ConfigError(f"peers.{name}: {peer!r} is not a peer id (e.g. 12D3KooW...)")
        both = set(self.allow) & set(self.deny)
        if both:
            raise ConfigError(f"peer {sorted(both)[0]} is on both peers.allow and peers.deny")
