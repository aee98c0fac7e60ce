"""SAPO experience sharing: our groups out to the swarm, peers' groups in, re-scored, pooled and weighted.

- `wire.py`: a scored group as a wire RolloutGroup; deterministic group ids; the content hash for de-duplication.
- `exchange.py`: the node's `Exchange` (publish, drain) over any `Transport`, with wire validation and replay guard.
- `rescore.py`: `accept_external`: our own bounds first, then attribution, freshness, allowed task, and our verifier.
- `ingest.py`: the one ingest path of every role: drained items -> re-score -> a sink (pool, learner) -> counts.
- `pool.py`: the bounded experience pool (per-peer caps, de-duplication, expiry in our own steps).
- `selection.py`: which pooled groups an update takes, registry `SELECTIONS`.
- `corrections.py`: external groups as training samples, registry `CORRECTIONS` (none, is).
"""
