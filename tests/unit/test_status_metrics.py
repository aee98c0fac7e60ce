"""Prometheus exposition of a snapshot, parsed back with prometheus-client's own parser: names, types, exact
values, staleness histogram buckets, and label values that come from the network."""

from __future__ import annotations

from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from swarm_node.status.metrics import METRICS, TEXT_FAMILY_NAMES, render_metrics
from swarm_node.status.stats import NodeStats
from swarm_node.status.view import MAX_PEERS


def parse(snapshot: dict[str, Any]) -> dict[str, Any]:
    body, content_type = render_metrics(snapshot)
    assert content_type.startswith("text/plain; version=0.0.4")
    return {f.name: f for f in text_string_to_metric_families(body.decode())}


def samples(family: Any) -> dict[tuple, float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for s in family.samples}


def fed_stats() -> NodeStats:
    stats = NodeStats()
    stats.update(peer_id="12D3KooWSelf", role="learner", total_steps=100, pool_size=7,
                 broadcast={"version": 4, "chunks_done": 3, "chunks_total": 8, "state": "sending"},
                 last_checkpoint={"step": 25, "path": "x"})
    stats.set_phase("training")
    stats.record_step({"step": 1, "policy_version": 1, "reward_mean": 0.2, "accuracy": 0.1, "tokens_per_s": 900.0})
    stats.record_step({"step": 2, "policy_version": 2, "reward_mean": 0.6, "accuracy": 0.3, "tokens_per_s": 1100.0,
                       "loss": -0.125, "kl": 0.01, "entropy": 1.5, "clip_frac": 0.25})
    stats.count("groups", "produced", 16)
    stats.count("groups", "used", 20)
    stats.count("dropped", "stale", 3)
    stats.count("errors", "decode", 2)
    stats.count("staleness", 0, 3)
    stats.count("staleness", 2, 1)
    stats.upsert_peer("peer-a", latency_ms=25.0, score=0.75)
    stats.count_peer_message("peer-a", accepted=True, n=4)
    stats.count_peer_message("peer-a", accepted=False, n=1)
    return stats


def test_every_documented_family_is_exposed_with_its_type() -> None:
    families = parse(NodeStats().snapshot())  # even an idle node lists every name
    assert set(families) == set(TEXT_FAMILY_NAMES)
    for name, (kind, _, _) in METRICS.items():
        exposed = name + "_info" if kind == "info" else name
        assert families[exposed].type == ("gauge" if kind == "info" else kind), name


def test_values_are_exact() -> None:
    f = parse(fed_stats().snapshot())
    assert samples(f["swarm_node_info"]) == {
        ("swarm_node_info", (("peer_id", "12D3KooWSelf"), ("phase", "training"), ("role", "learner"))): 1.0}
    assert samples(f["swarm_node_step"]) == {("swarm_node_step", ()): 2.0}
    assert samples(f["swarm_node_total_steps"]) == {("swarm_node_total_steps", ()): 100.0}
    assert samples(f["swarm_node_policy_version"]) == {("swarm_node_policy_version", ()): 2.0}
    assert samples(f["swarm_node_reward"]) == {("swarm_node_reward", (("window", "recent"),)): 0.6,
                                               ("swarm_node_reward", (("window", "moving_avg"),)): 0.4}
    assert samples(f["swarm_node_accuracy"]) == {("swarm_node_accuracy", (("window", "recent"),)): 0.3,
                                                 ("swarm_node_accuracy", (("window", "moving_avg"),)): 0.2}
    assert samples(f["swarm_node_tokens_per_second"]) == {("swarm_node_tokens_per_second", ()): 1100.0}
    assert samples(f["swarm_node_train_loss"]) == {("swarm_node_train_loss", ()): -0.125}
    assert samples(f["swarm_node_train_clip_fraction"]) == {("swarm_node_train_clip_fraction", ()): 0.25}
    assert samples(f["swarm_node_rollout_groups"]) == {
        ("swarm_node_rollout_groups_total", (("kind", "produced"),)): 16.0,
        ("swarm_node_rollout_groups_total", (("kind", "used"),)): 20.0}
    assert samples(f["swarm_node_rollout_groups_dropped"]) == {
        ("swarm_node_rollout_groups_dropped_total", (("reason", "stale"),)): 3.0}
    assert samples(f["swarm_node_errors"]) == {("swarm_node_errors_total", (("kind", "decode"),)): 2.0}
    assert samples(f["swarm_node_experience_pool_size"]) == {("swarm_node_experience_pool_size", ()): 7.0}
    assert samples(f["swarm_node_peers_connected"]) == {("swarm_node_peers_connected", ()): 1.0}
    assert samples(f["swarm_node_peer_latency_seconds"]) == {
        ("swarm_node_peer_latency_seconds", (("peer_id", "peer-a"),)): 0.025}
    assert samples(f["swarm_node_peer_score"]) == {("swarm_node_peer_score", (("peer_id", "peer-a"),)): 0.75}
    assert samples(f["swarm_node_peer_messages"]) == {
        ("swarm_node_peer_messages_total", (("peer_id", "peer-a"), ("verdict", "accepted"))): 4.0,
        ("swarm_node_peer_messages_total", (("peer_id", "peer-a"), ("verdict", "rejected"))): 1.0}
    # Only numeric broadcast fields become samples ("state" is a string).
    assert samples(f["swarm_node_broadcast"]) == {
        ("swarm_node_broadcast", (("field", "chunks_done"),)): 3.0,
        ("swarm_node_broadcast", (("field", "chunks_total"),)): 8.0,
        ("swarm_node_broadcast", (("field", "version"),)): 4.0}
    assert samples(f["swarm_node_last_checkpoint_step"]) == {("swarm_node_last_checkpoint_step", ()): 25.0}


def test_staleness_histogram_has_contiguous_cumulative_buckets() -> None:
    f = parse(fed_stats().snapshot())  # lags {0: 3, 2: 1}
    assert samples(f["swarm_node_rollout_staleness"]) == {
        ("swarm_node_rollout_staleness_bucket", (("le", "0.0"),)): 3.0,
        ("swarm_node_rollout_staleness_bucket", (("le", "1.0"),)): 3.0,
        ("swarm_node_rollout_staleness_bucket", (("le", "2.0"),)): 4.0,
        ("swarm_node_rollout_staleness_bucket", (("le", "+Inf"),)): 4.0,
        ("swarm_node_rollout_staleness_count", ()): 4.0,
        ("swarm_node_rollout_staleness_sum", ()): 2.0,  # 0*3 + 2*1
    }


def test_staleness_skips_keys_that_are_not_lags() -> None:
    snapshot = NodeStats().snapshot()
    snapshot["staleness"] = {"1": 2, "-1": 5, "x": 9, "1.5": 4}
    assert samples(parse(snapshot)["swarm_node_rollout_staleness"]) == {
        ("swarm_node_rollout_staleness_bucket", (("le", "0.0"),)): 0.0,
        ("swarm_node_rollout_staleness_bucket", (("le", "1.0"),)): 2.0,
        ("swarm_node_rollout_staleness_bucket", (("le", "+Inf"),)): 2.0,
        ("swarm_node_rollout_staleness_count", ()): 2.0,
        ("swarm_node_rollout_staleness_sum", ()): 2.0,
    }


def test_hostile_label_values_round_trip() -> None:
    stats = NodeStats()
    evil = 'peer"}\nswarm_node_step 999\n\\'
    stats.upsert_peer(evil, score=1.0)
    stats.count("dropped", 'reason with "quotes"\n')
    f = parse(stats.snapshot())
    assert samples(f["swarm_node_peer_score"]) == {("swarm_node_peer_score", (("peer_id", evil),)): 1.0}
    assert list(samples(f["swarm_node_rollout_groups_dropped"])) == [
        ("swarm_node_rollout_groups_dropped_total", (("reason", 'reason with "quotes"\n'),))]
    assert samples(f["swarm_node_step"]) == {("swarm_node_step", ()): 0.0}  # no injected sample


def test_peer_series_are_bounded() -> None:
    stats = NodeStats()
    for i in range(MAX_PEERS + 10):
        stats.upsert_peer(f"peer-{i:03d}", score=float(i))
    f = parse(stats.snapshot())
    assert len(f["swarm_node_peer_score"].samples) == MAX_PEERS
    assert samples(f["swarm_node_peers_connected"]) == {("swarm_node_peers_connected", ()): MAX_PEERS + 10.0}


def test_none_and_non_numeric_values_are_left_out() -> None:
    snapshot = NodeStats().snapshot()
    snapshot.update(total_steps=None, pool_size="many", tokens_per_s=True)
    f = parse(snapshot)
    assert f["swarm_node_total_steps"].samples == []
    assert f["swarm_node_experience_pool_size"].samples == []
    assert f["swarm_node_tokens_per_second"].samples == []
