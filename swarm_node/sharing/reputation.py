"""Peer reputation: what re-scoring reveals about a peer, as a decaying score and a state.

Contract: `Reputation` is a pure state machine (no clock, no I/O; `now` is wall seconds passed in). Events in:
`record(peer, kind, now, n)` with `kind` a drop reason ("forged_attribution", "duplicate", "peer_budget", ...),
"forged_reward" (claimed rewards that our verifier contradicts) or "accepted"; each adds `weight(kind) * n` to the
peer's score (`DEFAULT_WEIGHTS`, overridable per kind; a reason not listed costs `default_weight`). Scores decay
toward 0 with half-life `half_life_s` and never exceed `max_score` (good behaviour cannot be banked to pay for a
later flood). States out, `state(peer, now)`:
- "denied": on the deny list, always (its messages are ignored);
- "allowed": on the allow list: never graylisted nor banned, whatever its score;
- "banned": its score reached `ban_score` (<= graylist_score), until `now + ban_s`; a lapsed ban lapses;
- "graylisted": its score is at or below `graylist_score` (recovers as the score decays: its messages are
  ignored meanwhile, so nothing new is held against it);
- "ok" otherwise.
`BLOCKED` states are the ones whose messages the node ignores before decoding. `app_scores(now)` is what the node
pushes to its gossipsub router as the application-specific score (blocked peers far below any threshold).
Bounded: at most `max_peers` peers are tracked; `expire(now)` lapses bans and forgets peers whose score has
decayed to about 0 (and, past the cap, the mildest ones first).

Bans persist across restarts as JSON (`read_bans` / `write_bans`, the only I/O here): `{"version": 1, "bans":
{peer_id: until_epoch_s}}`, written atomically (temporary file, fsync, rename); expired entries are dropped on load.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from swarm_node.sharing.fanin_ledger import FANIN_WEIGHTS

OK, GRAYLISTED, BANNED, ALLOWED, DENIED = "ok", "graylisted", "banned", "allowed", "denied"
STATES = (OK, GRAYLISTED, BANNED, ALLOWED, DENIED)
BLOCKED = frozenset({GRAYLISTED, BANNED, DENIED})
BLOCKED_APP_SCORE = -1000.0  # pushed for blocked peers: below all gossipsub thresholds (libp2p.ipc.HostSettings)
MIN_SCORE = -1000.0  # scores are clipped here (numerical sanity; far past any ban threshold)
FORGET_BELOW = 0.01  # |score| under which an unbanned peer's state is forgotten
PEERS_FILE = "peers.json"
MAX_BANS = 100_000  # entries read from a ban file

# Score change per event. A lie our verifier catches costs most; configurations that differ from ours (another
# group size, generation budget, task, tokenizer, prompt format) or the network's own churn (stale, replays via
# other forwarders, our pool's evictions) cost little or nothing, so honest peers of another setup are not
# graylisted.
DEFAULT_WEIGHTS: Mapping[str, float] = MappingProxyType({
    "accepted": 0.05,
    "forged_reward": -5.0,
    "forged_attribution": -10.0,
    "bad_chunk": -5.0,  # a policy-broadcast relay served a chunk that failed its SHA-256 (streams are authenticated)
    # Honest peers can produce the same group: a duplicate or a copy alone costs nothing; a sender that copies
    # others at a high rate (sharing/copying.py) re-signs what it heard.
    "duplicate": 0.0, "copied": 0.0, "copycat": -5.0,
    "peer_budget": -0.1,  # a flood: its groups were refused before any work
    "flood": 0.0,  # past its message rate: ignored unread (ingest.PeerGuard); a fast honest peer may be, too
    "group_size": -0.2, "group_tokens": -0.2, "over_length": -0.2, "task_not_allowed": -0.2,
    "task_index_out_of_range": -0.2, "future": -0.2, "replay": -0.2,
    # Its re-scored groups imply pass rates far from ours on the same instances (tasks/pass_rates.py): cherry-picked
    # completions steering our difficulty estimates, or a very different policy. Once per episode.
    "pass_rate_disagreement": -2.0,
    "stale": 0.0, "zero_advantage": 0.0, "heldout": 0.0, "tokenizer_mismatch": 0.0, "unknown_version": 0.0,
    "prompt_format_mismatch": 0.0,
    "too_old": 0.0, "pool_full": 0.0, "peer_cap": 0.0, "node_budget": 0.0,
    GRAYLISTED: 0.0, BANNED: 0.0, DENIED: 0.0,
    # bounded fan-in: a server lying about a group's content or statistics, greedy or probing requesters
    **FANIN_WEIGHTS,
})
DEFAULT_WEIGHT = -1.0  # any other drop reason: malformed or out-of-bounds data, bad log-probs, non-finite rewards


@dataclass(frozen=True)
class ReputationParams:
    half_life_s: float = 600.0
    graylist_score: float = -20.0
    ban_score: float = -50.0
    ban_s: float = 3600.0
    max_score: float = 5.0
    weights: Mapping[str, float] = field(default_factory=dict)  # overrides of DEFAULT_WEIGHTS
    default_weight: float = DEFAULT_WEIGHT
    allow: frozenset[str] = frozenset()
    deny: frozenset[str] = frozenset()
    max_peers: int = 4096

    def __post_init__(self) -> None:
        numbers = {name: getattr(self, name) for name in ("half_life_s", "ban_s", "graylist_score", "ban_score",
                                                           "max_score", "default_weight")}
        numbers.update({f"weights[{kind!r}]": value for kind, value in self.weights.items()})
        for name, value in numbers.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"ReputationParams.{name} must be a finite number, got {value!r}")
        if self.half_life_s <= 0 or self.ban_s <= 0:
            raise ValueError("ReputationParams.half_life_s and ban_s must be > 0")
        if not self.ban_score <= self.graylist_score < 0 <= self.max_score:
            raise ValueError(f"ReputationParams needs ban_score <= graylist_score < 0 <= max_score, got "
                             f"{self.ban_score}, {self.graylist_score}, {self.max_score}")
        if self.allow & self.deny:
            raise ValueError(f"peer {sorted(self.allow & self.deny)[0]} is on both the allow and the deny list")


@dataclass
class _Score:
    value: float
    updated: float


@dataclass
class Reputation:
    """See the module contract."""

    params: ReputationParams = field(default_factory=ReputationParams)
    scores: dict[str, _Score] = field(default_factory=dict)
    bans: dict[str, float] = field(default_factory=dict)  # peer -> ban end (epoch seconds)

    def weight(self, kind: str) -> float:
        if kind in self.params.weights:
            return float(self.params.weights[kind])
        return DEFAULT_WEIGHTS.get(kind, self.params.default_weight)

    def score(self, peer: str, now: float) -> float:
        entry = self.scores.get(peer)
        if entry is None:
            return 0.0
        elapsed = max(0.0, now - entry.updated)
        return entry.value * 0.5 ** (elapsed / self.params.half_life_s)

    def record(self, peer: str, kind: str, now: float, n: int = 1) -> str:
        """Apply `n` events of `kind`; returns the peer's state afterwards (a ban starts here)."""
        delta = self.weight(kind) * n
        if delta == 0.0:
            return self.state(peer, now)
        value = min(self.params.max_score, max(MIN_SCORE, self.score(peer, now) + delta))
        if peer in self.scores or len(self.scores) < self.params.max_peers or self._make_room(now):
            self.scores[peer] = _Score(value, now)
        if (value <= self.params.ban_score and peer not in self.params.allow and peer not in self.params.deny
                and self.bans.get(peer, -math.inf) <= now):
            self.bans[peer] = now + self.params.ban_s
        return self.state(peer, now)

    def state(self, peer: str, now: float) -> str:
        if peer in self.params.deny:
            return DENIED
        if peer in self.params.allow:
            return ALLOWED
        if self.bans.get(peer, -math.inf) > now:
            return BANNED
        if self.score(peer, now) <= self.params.graylist_score:
            return GRAYLISTED
        return OK

    def ban(self, peer: str, until: float) -> None:
        """Ban `peer` until `until` (e.g. read back from the ban file); allow-listed peers are never banned."""
        if peer not in self.params.allow:
            self.bans[peer] = max(until, self.bans.get(peer, -math.inf))

    def unban(self, peer: str) -> None:
        """Lift a ban and forget the score (an operator's decision: the peer starts again at 0)."""
        self.bans.pop(peer, None)
        self.scores.pop(peer, None)

    def active_bans(self, now: float) -> dict[str, float]:
        return {peer: until for peer, until in self.bans.items() if until > now}

    def peers(self, now: float) -> dict[str, tuple[float, str]]:
        """Every peer with state: id -> (score now, state), banned and listed ones included."""
        ids = set(self.scores) | set(self.active_bans(now)) | self.params.allow | self.params.deny
        return {peer: (self.score(peer, now), self.state(peer, now)) for peer in ids}

    def app_scores(self, now: float, limit: int) -> dict[str, float]:
        """The application-specific scores for the gossipsub router: at most `limit` peers, blocked ones first."""
        out: dict[str, float] = {}
        for peer, (score, state) in self.peers(now).items():
            if state in BLOCKED:
                out[peer] = BLOCKED_APP_SCORE
            elif state == ALLOWED:
                out[peer] = max(0.0, score)
            else:
                out[peer] = score
        ranked = sorted(out.items(), key=lambda item: (-abs(item[1]), item[0]))
        return dict(ranked[:limit])

    def expire(self, now: float) -> list[str]:
        """Lapse expired bans and forget scores decayed to about 0; returns the peers whose ban lapsed."""
        lapsed = [peer for peer, until in self.bans.items() if until <= now]
        for peer in lapsed:
            del self.bans[peer]
        for peer in [p for p in self.scores if abs(self.score(p, now)) < FORGET_BELOW]:
            del self.scores[peer]
        return lapsed

    def _make_room(self, now: float) -> bool:
        """At the cap: forget decayed peers, else the one closest to 0 (never a banned one); True if room."""
        self.expire(now)
        if len(self.scores) < self.params.max_peers:
            return True
        candidates = [p for p in self.scores if p not in self.bans]
        if not candidates:
            return False
        del self.scores[min(candidates, key=lambda p: abs(self.score(p, now)))]
        return True


def read_bans(path: Path, now: float) -> dict[str, float]:
    """The unexpired bans in a ban file ({} if there is none); ValueError naming the file if it is malformed."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON ({exc}); fix or delete it") from exc
    bans = obj.get("bans") if isinstance(obj, dict) else None
    if not isinstance(bans, dict) or len(bans) > MAX_BANS:
        raise ValueError(f"{path} is not a ban file (expected {{\"version\": 1, \"bans\": {{peer_id: until}}}})")
    out: dict[str, float] = {}
    for peer, until in bans.items():
        if not isinstance(until, (int, float)) or isinstance(until, bool) or not math.isfinite(until):
            raise ValueError(f"{path}: the ban of {peer!r} has no finite end time ({until!r})")
        if until > now:
            out[str(peer)] = float(until)
    return out


def write_bans(path: Path, bans: Mapping[str, float]) -> None:
    """Write the ban file atomically: a crash leaves the old file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    body = json.dumps({"version": 1, "bans": dict(sorted(bans.items()))}, indent=1, allow_nan=False)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(body + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
