"""Bounded fan-in (issue 32): a node takes in what its J needs per round, not every group N peers publish.

Contract (pure: no I/O, no clock; randomness and times are passed in):
- Shards. The rollout topic is split into `shard_count(n_peers)` shards of about `shard_size` nodes (a node
  learns n_peers from what it sees, hysteretically; a node that joins first takes the median of the shard counts
  its first digest senders announce: `sharing/swarm_size.py`). For each
  epoch of `epoch_rounds` rounds a node joins `shards_per_node` of them, chosen by `epoch_shards(seed, epoch, ...)`
  from a seed the node draws itself at start (secret, never derived from a peer id: ids are free to mint, so
  anything computed from them alone can be ground). Nobody else can steer which shards a node hears.
- Digests. Each round a node gossips the `Digest`s of its own groups (group id, sender, task, reward variance,
  signal flag, content hash; `DIGEST_BYTES` each) in one shard it joined, and serves those groups on request.
  Digests reach only that shard's members: a node's inbound digest traffic depends on `shard_size`, not on N.
- Pulls. `choose_pulls` picks which digests to fetch: only signal-bearing groups, at most `max_pulls_per_sender`
  per sender per round, up to `pull_target` (J plus spares for refusals and departures) in flight or done; ranked by
  senders not heard from in the last `recent_rounds` rounds first (diversity over rounds), then tasks not taken
  yet this round, then reward variance (highest first), then the receiver's own random tiebreak (`tiebreak`).
- What a digest states of a group: `claimed_rewards(group)` (the sender's own; a receiver re-scores instead),
  `reward_stats(rewards)` (signal: not all equal; the population variance), `task_label(group)`.
- Pull requests. `pull_asks` groups the chosen digests into requests: one per sender and round of its digests (a
  request names one round), each of at most `max_pulls_per_request` ids (the wire's bound: a longer request is
  rejected whole), in the order chosen.
- Push fallback. A group nobody pulled by `push_after_s` after its digest is pushed once, unsolicited, to one
  random neighbour of its shard (`unpulled`): every group reaches some peer in its round, and every sender's
  digests are checked against content (re-scored) somewhere, whether its groups are popular or not.
- Reaching senders. A digest usually arrives relayed by the shard's mesh, from a sender we are not connected to:
  its batch carries the sender's addresses, and a node dials the senders of its chosen pulls first, within
  `dials_per_round` and per-IP caps (`sharing/sender_dial.py`, `sharing/sender_reach.py`).
- What a receiver accepts, what a server serves and how lies are scored: `sharing/fanin_ledger.py`; how many
  pull and push streams a node serves at once (`serve_streams`, `serve_streams_per_peer`): `sharing/stream_gate.py`.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import struct
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from protocol.messages import RolloutGroup

DIGEST_BYTES = 72  # group id 16, task 2, variance 4, flags 1, content hash 32, framing ~17 (sender: the envelope)


@dataclass(frozen=True)
class FanInParams:
    shard_size: int = 24  # about this many nodes share a shard: the digests one node hears per round
    shards_per_node: int = 1  # k: shards a node joins per epoch
    epoch_rounds: int = 10  # shard membership is redrawn this often (mesh rebuild costs control messages)
    pull_target: int = 6  # J = 4 plus 2 spares for refused or lost pulls
    max_pulls_per_sender: int = 1  # per round: no single sender fills a receiver's J
    recent_rounds: int = 3  # senders heard from within this many rounds rank after the others
    serve_per_round: int = 12  # a node serves at most this many pulls per round, refusing the rest
    serve_per_requester: int = 1  # ... and at most this many to one requester (it asked for more: over-pull)
    serve_for_s: float = 30.0  # a round's groups stay served this long after its digest (and the previous round's)
    serve_rounds: int = 16  # ... of at most this many rounds (a node stepping fast holds no more than that)
    push_after_s: float = 4.0  # a group still unpulled this long after its digest is pushed to one neighbour
    pushes_accepted_per_round: int = 8  # unsolicited groups a receiver takes per round ...
    pushes_accepted_per_sender: int = 4  # ... and per sender (I: a sender has no more groups than that)
    pull_timeout_s: float = 2.0  # a pull with no answer by then is given up (its slot is free again)
    shard_hysteresis: float = 0.25  # the swarm estimate must leave M's band by this fraction to change M
    max_shard_step: int = 4  # M grows or shrinks by at most this factor per epoch
    max_swarm_estimate: int = 1_000_000  # what the node may believe the swarm's size to be, at most
    learn_from_peers: int = 3  # a node that joins takes the median of this many distinct senders' M at least
    serve_streams: int = 16  # pull (and, apart, push) streams a node serves at once; more are reset unread
    serve_streams_per_peer: int = 2  # ... of them from one peer (an honest one holds one: `pull_session`)
    dials_per_round: int = 6  # new connections a node dials per round to reach digest senders (`sender_dial`):
    # pull_target, so that every pull of a round may first dial its sender, as the scale simulator assumes
    dial_backoff_rounds: int = 3  # an IP whose dial failed is not dialled again for this many rounds

    def __post_init__(self) -> None:
        for name in ("shard_size", "shards_per_node", "epoch_rounds", "pull_target", "max_pulls_per_sender",
                     "serve_per_round", "serve_per_requester", "serve_rounds", "pushes_accepted_per_round",
                     "pushes_accepted_per_sender", "serve_streams", "serve_streams_per_peer", "max_shard_step",
                     "max_swarm_estimate", "learn_from_peers", "dials_per_round", "dial_backoff_rounds"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ValueError(f"FanInParams.{name} must be a positive int, got {value!r}")
        for name in ("push_after_s", "pull_timeout_s", "serve_for_s"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"FanInParams.{name} must be a finite number > 0, got {value!r}")
        if self.max_shard_step < 2:
            raise ValueError(f"FanInParams.max_shard_step must be >= 2 (1 would freeze M), got {self.max_shard_step}")
        if not 0 <= self.shard_hysteresis < 1:
            raise ValueError(f"FanInParams.shard_hysteresis must be in [0, 1), got {self.shard_hysteresis!r}")


@dataclass(frozen=True)
class Digest:
    """What a node announces about one of its groups: enough to choose it without fetching it."""

    group_id: str
    sender: str
    task: str
    reward_variance: float
    signal: bool  # the group's rewards are not all equal: it carries an advantage signal
    content_hash: bytes  # sha256 of the group's wire bytes: a pulled group is checked before decoding


def claimed_rewards(group: RolloutGroup) -> list[float]:
    """The sender's own rewards (what its digest states; a receiver re-scores with its verifier instead)."""
    return [c.claimed_reward for c in group.completions]


def reward_stats(rewards: list[float]) -> tuple[bool, float]:
    """(signal, population variance) of a group's rewards: signal when they are not all equal. In floats (fsum):
    `statistics.pvariance` is exact in fractions and 15x slower; every digest sent and every group taken needs one,
    and the two agree far within `fanin_ledger.VARIANCE_TOLERANCE` (a peer computing it either way is not scored)."""
    if not rewards:
        return False, 0.0
    mean = math.fsum(rewards) / len(rewards)
    return len(set(rewards)) > 1, math.fsum((r - mean) ** 2 for r in rewards) / len(rewards)


def task_label(group: RolloutGroup) -> str:
    return f"{group.task.dataset}:{group.task.index}"


def shard_count(n_peers: int, params: FanInParams) -> int:
    """M: about `shard_size` nodes per shard (each in k of them), at least one shard."""
    if n_peers < 1:
        raise ValueError(f"shard_count needs n_peers >= 1, got {n_peers}")
    return max(1, (n_peers * params.shards_per_node) // params.shard_size)


def epoch_of(round_index: int, params: FanInParams) -> int:
    return round_index // params.epoch_rounds


def epoch_shards(seed: bytes, epoch: int, shards: int, k: int) -> tuple[int, ...]:
    """The k distinct shards (sorted) a node joins in `epoch`: sha256(seed, epoch, counter) draws, so the choice is
    fixed by the node's own seed and nobody without it can predict or steer the next epoch's."""
    if shards < 1 or k < 1:
        raise ValueError(f"epoch_shards needs shards >= 1 and k >= 1, got {shards}, {k}")
    chosen: list[int] = []
    counter = 0
    while len(chosen) < min(k, shards):
        draw = hashlib.sha256(seed + struct.pack(">QQ", epoch, counter)).digest()
        shard = int.from_bytes(draw[:8], "big") % shards
        if shard not in chosen:
            chosen.append(shard)
        counter += 1
    return tuple(sorted(chosen))


def tiebreak(seed: bytes, group_id: str) -> int:
    """The receiver's private order among equally ranked digests (senders cannot know it)."""
    return int.from_bytes(hashlib.sha256(seed + group_id.encode()).digest()[:8], "big")


def choose_pulls(candidates: Iterable[Digest], taken: Collection[str], per_sender: Mapping[str, int],
                 tasks: Collection[str], recent_senders: Collection[str], params: FanInParams,
                 seed: bytes) -> tuple[Digest, ...]:
    """The digests to pull now, best first (see the module contract). `taken`: group ids pulled or asked for this
    round (done or in flight; each uses one of `pull_target`'s slots), `per_sender`: those per sender, `tasks`:
    their tasks."""
    want = params.pull_target - len(taken)
    if want <= 0:
        return ()
    eligible = _ranked([d for d in candidates if d.signal and d.group_id not in taken], recent_senders, seed)
    counts = dict(per_sender)
    seen_tasks = set(tasks)
    chosen: dict[str, Digest] = {}
    # Two passes: the first takes only tasks not yet taken this round, the second fills up with any task.
    for new_tasks_only in (True, False):
        for digest in eligible:
            if len(chosen) == want:
                return tuple(chosen.values())
            if digest.group_id in chosen or counts.get(digest.sender, 0) >= params.max_pulls_per_sender:
                continue
            if new_tasks_only and digest.task in seen_tasks:
                continue
            chosen[digest.group_id] = digest
            counts[digest.sender] = counts.get(digest.sender, 0) + 1
            seen_tasks.add(digest.task)
    return tuple(chosen.values())


def pull_asks(chosen: Iterable[Digest], round_of: Mapping[str, int], max_ids: int
              ) -> list[tuple[str, int, tuple[Digest, ...]]]:
    """(sender, the sender's round, digests) per pull request: the `chosen` digests by sender and the round
    `round_of[group_id]` that announced them, split into requests of at most `max_ids` (see the module contract)."""
    if max_ids < 1:
        raise ValueError(f"pull_asks needs max_ids >= 1, got {max_ids}")
    by_key: dict[tuple[str, int], list[Digest]] = {}
    for d in chosen:
        by_key.setdefault((d.sender, round_of[d.group_id]), []).append(d)
    return [(sender, r, tuple(ds[i:i + max_ids])) for (sender, r), ds in by_key.items()
            for i in range(0, len(ds), max_ids)]


def _ranked(digests: list[Digest], recent_senders: Collection[str], seed: bytes) -> list[Digest]:
    """Sorted by (recent sender, -variance), equal keys in the receiver's `tiebreak` order (hashed only for ties:
    a receiver ranks hundreds of digests a round)."""
    def rank(d: Digest) -> tuple[bool, float]:
        return d.sender in recent_senders, -d.reward_variance

    digests.sort(key=rank)
    out: list[Digest] = []
    for _, tied in itertools.groupby(digests, key=rank):
        group = list(tied)
        out.extend(group if len(group) == 1 else sorted(group, key=lambda d: tiebreak(seed, d.group_id)))
    return out


def unpulled(published_at: Mapping[str, float], pulled: Collection[str], now: float,
             params: FanInParams) -> tuple[str, ...]:
    """The sender's groups due for the push fallback at `now`: published `push_after_s` ago or more and pulled by
    nobody (sorted by id; the caller pushes each once, to one random shard neighbour)."""
    return tuple(sorted(g for g, t in published_at.items()
                        if g not in pulled and now - t >= params.push_after_s))
