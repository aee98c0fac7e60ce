"""SAPO experience sharing: our groups out to the swarm, peers' groups in, re-scored, pooled and weighted.

- `wire.py`: a scored group as a wire RolloutGroup; deterministic group ids; the content hash for de-duplication.
- `exchange.py`: the node's `Exchange` (publish, drain) over any `Transport`, with wire validation and replay guard.
- `rescore.py`: `accept_external`: our own bounds first, then attribution, freshness, allowed task, and our verifier.
- `ingest.py`: the one ingest path of every role: drained items -> peer guard -> re-score -> a sink (pool,
  learner) -> counts; `PeerGuard` (budgets + reputation, the ban file, the blocked set, scores to libp2p).
- `budget.py`: per-peer re-scoring budgets (a debt-based token bucket per peer, the node's share split equally).
- `reputation.py`: per-peer decaying scores and states (ok, graylisted, banned, allowed, denied); the ban file.
- `pool.py`: the bounded experience pool (per-peer caps, de-duplication, expiry in our own steps).
- `copying.py`: `CopyWatch`, a sender's rate of copies of other peers' content (a copycat, not a coincidence).
- `selection.py`: which pooled groups an update takes, registry `SELECTIONS`.
- `corrections.py`: external groups as training samples, registry `CORRECTIONS` (none, is, ftis, decoupled).
- `fanin.py`: bounded fan-in (issue 32): shards joined per epoch from the receiver's own seed, digests, which
  digests to pull, the push fallback for groups nobody pulled; `fanin_ledger.py`: serve and push caps, scoring;
  `fanin_exchange.py`: `FaninExchange`, that design over any `Transport` (digests on shard topics, pulls over
  `pull_stream.py`'s request/response streams); `exchanges.py`: registry `EXCHANGES` (flood, bounded: `share.fanin`).
- `peer.py`: the SAPO peer around a node's steps: publish each draft, and just before each update drain, ingest,
  pool, expire and take J external groups into the draft (node/sources.SharingSource makes it a rollout source).
"""
