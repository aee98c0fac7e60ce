"""Prometheus exposition of a node's stats, built with prometheus-client from one `NodeStats.snapshot()`.

Contract: `render_metrics(snapshot, accept)` returns (body, content type): the exposition of the metric families
named in `METRICS`, made by a prometheus-client collector over a fresh registry (never hand formatted), in the
format prometheus-client's own encoder picks for the scraper's Accept header (text 0.0.4 by default,
OpenMetrics when asked). A family with nothing to report (e.g. no step yet) is still listed (HELP/TYPE) so
dashboards can rely on the names; values that are None are left out. Counter families carry the `_total`
suffix on their samples. Peer labels are bounded by `view.MAX_PEERS`, so a swarm cannot blow up the series count.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.exposition import choose_encoder
from prometheus_client.utils import floatToGoString

from swarm_node.status.view import MAX_KEYS, MAX_PEERS

# Family name -> (type, label names, help). The documented names; tests parse the exposition back and check them.
METRICS: dict[str, tuple[str, tuple[str, ...], str]] = {
    "swarm_node": ("info", ("peer_id", "role", "phase"), "Node identity and current phase."),
    "swarm_node_uptime_seconds": ("gauge", (), "Seconds since the node started."),
    "swarm_node_step": ("gauge", (), "Optimizer steps done."),
    "swarm_node_total_steps": ("gauge", (), "Steps the node was asked to run (absent when unbounded)."),
    "swarm_node_policy_version": ("gauge", (), "Current policy version."),
    "swarm_node_reward": ("gauge", ("window",), "Mean sampled reward: window=recent (last step) or moving_avg."),
    "swarm_node_accuracy": ("gauge", ("window",), "Exact-answer accuracy: window=recent or moving_avg."),
    "swarm_node_tokens_per_second": ("gauge", (), "Generated tokens per second at the last step."),
    "swarm_node_train_loss": ("gauge", (), "Policy loss at the last step."),
    "swarm_node_train_kl": ("gauge", (), "KL estimate at the last step: to the reference policy when "
                            "train.kl_coef > 0, else to the behaviour policy over the tokens both sample."),
    "swarm_node_train_entropy": ("gauge", (), "Mean token entropy at the last step."),
    "swarm_node_train_clip_fraction": ("gauge", (), "Fraction of clipped ratios at the last step."),
    "swarm_node_rollout_groups": ("counter", ("kind",), "Rollout groups by kind: produced, received, used."),
    "swarm_node_rollout_groups_dropped": ("counter", ("reason",), "Rollout groups dropped, by reason."),
    "swarm_node_errors": ("counter", ("kind",), "Errors by kind."),
    "swarm_node_experience_pool_size": ("gauge", (), "Rollout groups waiting in the experience pool."),
    "swarm_node_rollout_staleness": ("histogram", (), "Version lag of the rollouts used for updates."),
    "swarm_node_peers_connected": ("gauge", (), "Connected peers."),
    "swarm_node_peer_latency_seconds": ("gauge", ("peer_id",), "Round-trip latency to a peer."),
    "swarm_node_peer_messages": ("counter", ("peer_id", "verdict"),
                                 "Messages received from a peer, by verdict: accepted, rejected."),
    "swarm_node_peer_score": ("gauge", ("peer_id",), "A peer's score as this node sees it."),
    "swarm_node_broadcast": ("gauge", ("field",), "Numeric fields of the policy broadcast progress."),
    "swarm_node_last_checkpoint_step": ("gauge", (), "Step of the last checkpoint written."),
}
# The family names as the Prometheus text format (and its parser) shows them: an info family gains `_info`.
TEXT_FAMILY_NAMES = tuple(name + "_info" if kind == "info" else name for name, (kind, _, _) in METRICS.items())
_FAMILY = {"info": InfoMetricFamily, "counter": CounterMetricFamily, "gauge": GaugeMetricFamily}

_TRAIN_KEYS = {  # history key -> family
    "loss": "swarm_node_train_loss",
    "kl": "swarm_node_train_kl",
    "entropy": "swarm_node_train_entropy",
    "clip_frac": "swarm_node_train_clip_fraction",
}


def render_metrics(snapshot: dict[str, Any], accept: str = "") -> tuple[bytes, str]:
    """(exposition of one snapshot, its Content-Type) for a scraper sending `accept`."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(snapshot))
    encoder, content_type = choose_encoder(accept)
    return encoder(registry), content_type


class SnapshotCollector:
    """A prometheus-client custom collector over one fixed snapshot."""

    def __init__(self, snapshot: dict[str, Any]) -> None:
        self.snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        s = self.snapshot
        families: dict[str, Metric] = {
            name: (HistogramMetricFamily(name, doc) if kind == "histogram"
                   else _FAMILY[kind](name, doc, labels=list(labels)))
            for name, (kind, labels, doc) in METRICS.items()}
        families["swarm_node"].add_metric(
            [], {"peer_id": str(s.get("peer_id") or ""), "role": str(s.get("role") or ""),
                 "phase": str(s.get("phase") or "")})
        for key, family in (("uptime_s", "swarm_node_uptime_seconds"), ("step", "swarm_node_step"),
                            ("total_steps", "swarm_node_total_steps"),
                            ("policy_version", "swarm_node_policy_version"),
                            ("tokens_per_s", "swarm_node_tokens_per_second"),
                            ("pool_size", "swarm_node_experience_pool_size")):
            _gauge(families[family], [], s.get(key))
        for key, family in (("reward", "swarm_node_reward"), ("accuracy", "swarm_node_accuracy")):
            windows = s.get(key) or {}
            for window in ("recent", "moving_avg"):
                _gauge(families[family], [window], windows.get(window))
        last = (s.get("history") or [{}])[-1]
        for key, family in _TRAIN_KEYS.items():
            _gauge(families[family], [], last.get(key))
        for key, family in (("groups", "swarm_node_rollout_groups"),
                            ("dropped", "swarm_node_rollout_groups_dropped"), ("errors", "swarm_node_errors")):
            for label, value in sorted((s.get(key) or {}).items())[:MAX_KEYS]:
                _gauge(families[family], [str(label)], value)
        _staleness(families["swarm_node_rollout_staleness"], s.get("staleness") or {})

        peers = sorted(s.get("peers") or [], key=lambda p: str(p.get("peer_id")))
        connected = _number(s.get("peers_connected"))  # peers connected now; older snapshots: every known peer
        families["swarm_node_peers_connected"].add_metric([], len(peers) if connected is None else connected)
        for peer in peers[:MAX_PEERS]:
            pid = str(peer.get("peer_id"))
            latency_ms = _number(peer.get("latency_ms"))
            _gauge(families["swarm_node_peer_latency_seconds"], [pid],
                   None if latency_ms is None else latency_ms / 1000.0)
            _gauge(families["swarm_node_peer_score"], [pid], peer.get("score"))
            for verdict in ("accepted", "rejected"):
                _gauge(families["swarm_node_peer_messages"], [pid, verdict], peer.get(verdict))
        for field, value in sorted((s.get("broadcast") or {}).items())[:MAX_KEYS]:
            _gauge(families["swarm_node_broadcast"], [str(field)], value)
        checkpoint = s.get("last_checkpoint") or {}
        _gauge(families["swarm_node_last_checkpoint_step"], [], checkpoint.get("step"))
        yield from families.values()


def _number(value: Any) -> float | None:
    """A real number, or None for None, bools, strings and anything non-numeric."""
    if value is None or isinstance(value, (bool, str)):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _gauge(family: Metric, labels: list[str], value: Any) -> None:
    number = _number(value)
    if number is not None:
        family.add_metric(labels, number)


def _staleness(family: HistogramMetricFamily, staleness: dict[Any, Any]) -> None:
    """Cumulative buckets le=0,1,..,max lag (contiguous, so the bucket set only grows) from {lag: count}.

    Keys may be str after JSON-ing; negative or non-integer lags are not lags and are skipped. At most MAX_KEYS
    buckets are listed; +Inf, count and sum still cover every lag.
    """
    counts: dict[int, float] = {}
    for lag, count in staleness.items():
        try:
            lag_int, n = int(lag), float(count)
        except (TypeError, ValueError):
            continue
        if lag_int >= 0:
            counts[lag_int] = counts.get(lag_int, 0.0) + n
    if not counts:
        return
    buckets, running = [], 0.0
    for lag in range(min(max(counts), MAX_KEYS - 1) + 1):
        running += counts.get(lag, 0.0)
        buckets.append((floatToGoString(lag), running))
    buckets.append(("+Inf", sum(counts.values())))
    family.add_metric([], buckets, sum_value=sum(lag * n for lag, n in counts.items()))
