"""Gossipsub v1.1 peer-score parameters for the libp2p host (runs in the host's child process).

Contract: `score_params(settings, app_score)` builds py-libp2p's `ScoreParams` from `HostSettings`, with the node's
reputation table as the application-specific score (`app_score(peer) -> float`).
"""

from __future__ import annotations

from collections.abc import Callable

from libp2p.peer.id import ID
from libp2p.pubsub.score import ScoreParams, TopicScoreParams

from swarm_node.transport.libp2p.ipc import HostSettings

SCORE_DECAY_PER_HEARTBEAT = 0.999  # invalid-message counts fade with a half-life of ~11 min at 1 s heartbeats
BEHAVIOUR_DECAY_PER_HEARTBEAT = 0.99  # protocol-misbehaviour penalties fade with a half-life of ~70 s


def score_params(settings: HostSettings, app_score: Callable[[ID], float]) -> ScoreParams:
    """Gossipsub v1.1 peer score. py-libp2p 0.8.1 (`pubsub/score.py`) ships every weight at 0, every threshold at
    -inf, and its own names: P4 invalidMessageDeliveries = `p4_invalid_messages` (weight, cap, decay; linear),
    P5 behaviourPenalty = `p5_behavior_penalty_*`, P6 appSpecificScore = `app_specific_score_fn` x
    `p6_appl_slack_weight`. P1-P3 and P7 stay 0 (P3 punishes quiet honest peers, P7 every node of a loopback
    simulation or behind one NAT); accept_px_threshold stays open (other implementations' gossipsub PX may name
    peers; our nodes send none and find peers through the DHT)."""
    return ScoreParams(
        p4_invalid_messages=TopicScoreParams(settings.invalid_penalty, cap=1e9, decay=SCORE_DECAY_PER_HEARTBEAT),
        p5_behavior_penalty_weight=settings.behaviour_penalty, p5_behavior_penalty_decay=BEHAVIOUR_DECAY_PER_HEARTBEAT,
        p5_behavior_penalty_threshold=settings.behaviour_threshold, p6_appl_slack_weight=settings.app_score_weight,
        p6_appl_slack_decay=1.0, app_specific_score_fn=app_score, gossip_threshold=settings.gossip_threshold,
        publish_threshold=settings.publish_threshold, graylist_threshold=settings.graylist_threshold)
