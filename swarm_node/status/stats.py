"""Live node statistics: the single object the node updates and the status API, metrics and dashboard read.

Plain data plus counters, no I/O. The node thread writes; readers call `snapshot()` (a JSON-ready dict) which
copies under a lock, so a reader never sees a half-updated step. `peers` holds every peer heard from or scored (its
counters and reputation, kept across reconnections); `set_connected` records which peers are connected now, as the
network last reported them: the snapshot's `peers_connected` counts those (all known peers until the first report).
"""

from __future__ import annotations

import threading
import time
from collections import Counter, deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

HISTORY = 500  # step points kept for curves


@dataclass
class PeerStats:
    peer_id: str
    latency_ms: float | None = None
    accepted: int = 0
    rejected: int = 0
    score: float = 0.0  # reputation (sharing/reputation.py): decays to 0, lower is worse
    state: str = "ok"  # ok | graylisted | banned | allowed | denied


@dataclass
class NodeStats:
    phase: str = "starting"
    peer_id: str | None = None
    role: str = "peer"
    listen_addrs: list[str] = field(default_factory=list)
    policy_version: int = 0
    step: int = 0
    total_steps: int | None = None
    tokens_per_s: float = 0.0
    last_checkpoint: dict[str, Any] | None = None
    pool_size: int = 0
    training_signal: dict[str, Any] | None = None  # set while no group has had signal for a while (train/signal.py)
    broadcast: dict[str, Any] = field(default_factory=dict)
    # the rollout exchange's last finished round: inbound messages, bytes, pulls (sharing/exchange.RoundStats)
    exchange: dict[str, Any] = field(default_factory=dict)
    network: dict[str, Any] = field(default_factory=dict)  # reachability, relays, relayed bytes (transport.nat_report)
    groups: Counter = field(default_factory=Counter)  # produced / received / used
    dropped: Counter = field(default_factory=Counter)  # reason -> count
    errors: Counter = field(default_factory=Counter)  # kind -> count
    staleness: Counter = field(default_factory=Counter)  # version lag -> count of rollouts used
    peers: dict[str, PeerStats] = field(default_factory=dict)
    connected: frozenset[str] | None = None  # peers connected now (set_connected); None: never reported
    history: deque = field(default_factory=lambda: deque(maxlen=HISTORY))  # per-step dicts
    started_at: float = field(default_factory=time.time)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def set_phase(self, phase: str) -> None:
        with self._lock:
            self.phase = phase

    def record_step(self, metrics: dict[str, Any]) -> None:
        """Record one training step's metrics (the same dict written to metrics.jsonl)."""
        with self._lock:
            self.step = int(metrics.get("step", self.step))
            self.policy_version = int(metrics.get("policy_version", self.policy_version))
            self.tokens_per_s = float(metrics.get("tokens_per_s", self.tokens_per_s))
            self.history.append(dict(metrics))

    def count(self, counter: str, key: str | int, n: int = 1) -> None:
        with self._lock:
            getattr(self, counter)[key] += n

    def update(self, **fields: Any) -> None:
        with self._lock:
            for name, value in fields.items():
                setattr(self, name, value)

    def upsert_peer(self, peer_id: str, **fields: Any) -> None:
        """Add a connected peer or update its latency_ms / score / counters."""
        unknown = set(fields) - set(PeerStats.__dataclass_fields__)
        if unknown:
            raise AttributeError(f"PeerStats has no field {sorted(unknown)[0]!r}")
        with self._lock:
            peer = self.peers.setdefault(peer_id, PeerStats(peer_id))
            for name, value in fields.items():
                setattr(peer, name, value)

    def count_peer_message(self, peer_id: str, accepted: bool, n: int = 1) -> None:
        """Count a message received from a peer as accepted or rejected (the peer is added if new)."""
        with self._lock:
            peer = self.peers.setdefault(peer_id, PeerStats(peer_id))
            if accepted:
                peer.accepted += n
            else:
                peer.rejected += n

    def set_connected(self, latency_ms: Mapping[str, float | None]) -> None:
        """The peers connected now (peer id -> latency in ms, None if not measured): they are added if new and their
        latency updated; every other known peer stays known but no longer counts as connected."""
        with self._lock:
            self.connected = frozenset(latency_ms)
            for peer_id, latency in latency_ms.items():
                peer = self.peers.setdefault(peer_id, PeerStats(peer_id))
                if latency is not None:
                    peer.latency_ms = latency

    def remove_peer(self, peer_id: str) -> None:
        """Forget a disconnected peer (no error if it was not known)."""
        with self._lock:
            self.peers.pop(peer_id, None)

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            recent = list(self.history)
            rewards = [h["reward_mean"] for h in recent if "reward_mean" in h]
            accs = [h["accuracy"] for h in recent if "accuracy" in h]
            return {
                "phase": self.phase,
                "peer_id": self.peer_id,
                "role": self.role,
                "listen_addrs": list(self.listen_addrs),
                "policy_version": self.policy_version,
                "step": self.step,
                "total_steps": self.total_steps,
                "reward": {"recent": rewards[-1] if rewards else None, "moving_avg": _tail_mean(rewards)},
                "accuracy": {"recent": accs[-1] if accs else None, "moving_avg": _tail_mean(accs)},
                "per_task": _per_task(recent),
                "tokens_per_s": self.tokens_per_s,
                "groups": dict(self.groups),
                "dropped": dict(self.dropped),
                "errors": dict(self.errors),
                "pool_size": self.pool_size,
                "training_signal": self.training_signal,
                "staleness": {str(k): v for k, v in sorted(self.staleness.items())},
                "broadcast": dict(self.broadcast),
                "exchange": dict(self.exchange),
                "network": dict(self.network),
                "last_checkpoint": self.last_checkpoint,
                "peers": [vars(p).copy() for p in self.peers.values()],
                "peers_connected": len(self.peers) if self.connected is None else len(self.connected),
                "history": recent,
                "uptime_s": time.time() - self.started_at,
            }


def _per_task(history: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per specialty (dataset) of the task mix: recent and moving-average reward and accuracy of the local groups,
    from the steps' "per_task" metrics (a step without groups of a specialty does not count for it); groups: the
    local groups of that specialty over the kept history."""
    series: dict[str, dict[str, list[float]]] = {}
    for h in history:
        for name, m in (h.get("per_task") or {}).items():
            s = series.setdefault(name, {"reward": [], "accuracy": [], "groups": []})
            s["reward"].append(m["reward_mean"])
            s["accuracy"].append(m["accuracy"])
            s["groups"].append(m["groups"])
    return {name: {"reward": {"recent": s["reward"][-1], "moving_avg": _tail_mean(s["reward"])},
                   "accuracy": {"recent": s["accuracy"][-1], "moving_avg": _tail_mean(s["accuracy"])},
                   "groups": int(sum(s["groups"]))}
            for name, s in sorted(series.items())}


def _tail_mean(values: list[float], window: int = 20) -> float | None:
    tail = values[-window:]
    return sum(tail) / len(tail) if tail else None
