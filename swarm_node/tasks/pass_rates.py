"""`PassRateBook`: pass-rate estimates per task family and per task instance, for difficulty-targeted prompts.

Contract (pure: no clock, no I/O, no randomness):
- `record(ref, rewards, peer=OWN)` adds one scored group's outcomes: `sum(clip(r, 0, 1))` passes out of
  `len(rewards)` trials, to the group's family (dataset + canonical options) and to its instance (the whole ref).
  Callers pass only groups the node scored itself: its own, or a peer's group after `sharing.rescore` re-scored it
  (the rewards are then ours, not the peer's claims); `peer` names the sender of a peer's group.
- `family_rate(dataset, config)`: the posterior mean of a Beta(prior_pass * prior_strength, (1 - prior_pass) *
  prior_strength) prior updated with the family's counts. `rate(ref)`: the instance's posterior mean, with the
  family's rate as its prior mean (same strength): an instance never seen has its family's rate.
- Bounded peer share: the node's own counts and the prior form the base B = prior_strength + own trials; each
  peer's trials count at most `B * peer_share / (1 - peer_share)` (its passes scaled alike), so one peer alone
  makes at most `peer_share` of any estimate, and less beside the node's own data or other peers. With no data of
  its own the node still lets each peer move an estimate by at most that share of the prior.
- `disagreeing(peer)`: whether a peer's re-scored groups imply pass rates far from the node's own on the same
  instances: over the instances where both have at least `min_trials` trials (at least `disagree_instances` of
  them) among the last `judged_instances` the peer reported on, the mean absolute difference of the two pass
  rates exceeds `disagree_gap`. `newly_disagreeing(peer)`
  says so once per peer until it agrees again (the caller scores it down once per episode).
- Bounded memory and work: at most `max_instances` instances (the oldest recorded first forgotten), `max_sources`
  sources per family or instance (later peers are not recorded there), and the last `judged_instances` instances
  of at most `max_judged_peers` peers (the least recently heard forgotten) for `disagreeing`, whose cost is that.
- Replay candidates: `replayable(dataset, config, seed)` lists the instances the node itself sampled whose own
  outcomes were mixed (at least one pass and one fail: a group on them had signal) and that have fewer than
  `replay_trials` own trials, oldest first, with their estimated rates. Only the node's own groups put an instance
  there (a peer's groups never steer which instances repeat); the list is bounded by `max_instances`.
- `state()` / `set_state(state)`: a JSON form, so a node's checkpoint resumes its estimates exactly.
- Thread-safe: the node records its own groups on its generator thread and peers' on its ingest thread.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from swarm_node.tasks.reference import TaskRef

OWN = ""  # the source name of the node's own groups

Family = tuple[str, str]  # (dataset, canonical options)
Counts = dict[str, list[float]]  # source -> [passes, trials]


@dataclass(frozen=True)
class PassRateParams:
    prior_pass: float = 0.5  # prior mean pass rate
    prior_strength: float = 2.0  # prior pseudo-trials (Beta(1, 1) by default)
    peer_share: float = 0.25  # most of any estimate one peer may make
    disagree_gap: float = 0.5  # mean |peer rate - own rate| over shared instances above which a peer disagrees
    disagree_instances: int = 4  # shared instances needed before a peer can be judged
    min_trials: int = 2  # trials each side needs on an instance for it to count as shared
    max_instances: int = 100_000
    max_sources: int = 64
    judged_instances: int = 256
    max_judged_peers: int = 4096
    replay_trials: int = 24  # own trials after which an instance is no longer replayed (3 groups of 8)

    def __post_init__(self) -> None:
        if not 0.0 < self.prior_pass < 1.0:
            raise ValueError(f"PassRateParams.prior_pass must be in (0, 1), got {self.prior_pass!r}")
        if not self.prior_strength > 0.0:
            raise ValueError(f"PassRateParams.prior_strength must be > 0, got {self.prior_strength!r}")
        if not 0.0 <= self.peer_share < 1.0:
            raise ValueError(f"PassRateParams.peer_share must be in [0, 1), got {self.peer_share!r}")
        for name in ("disagree_instances", "min_trials", "max_instances", "max_sources", "judged_instances",
                     "max_judged_peers", "replay_trials"):
            if getattr(self, name) < 1:
                raise ValueError(f"PassRateParams.{name} must be >= 1, got {getattr(self, name)!r}")


def _posterior(counts: Mapping[str, Sequence[float]], prior_mean: float, params: PassRateParams) -> float:
    """The posterior mean of the pooled counts, each peer capped relative to the prior and the node's own trials."""
    own_passes, own_trials = counts.get(OWN, (0.0, 0.0))
    passes = prior_mean * params.prior_strength + own_passes
    trials = params.prior_strength + own_trials
    cap = trials * params.peer_share / (1.0 - params.peer_share)
    for source, (p, n) in counts.items():
        if source == OWN or n <= 0:
            continue
        weight = min(n, cap)
        passes += p * weight / n
        trials += weight
    return passes / trials


@dataclass
class PassRateBook:
    """See the module contract."""

    params: PassRateParams = field(default_factory=PassRateParams)
    families: dict[Family, Counts] = field(default_factory=dict)
    instances: dict[TaskRef, Counts] = field(default_factory=dict)
    _flagged: set[str] = field(default_factory=set)
    _by_peer: dict[str, dict[TaskRef, None]] = field(default_factory=dict)  # the instances each peer reported on
    _replayable: dict[TaskRef, None] = field(default_factory=dict)  # own mixed outcomes, under replay_trials
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def record(self, ref: TaskRef, rewards: Sequence[float], peer: str = OWN) -> None:
        if not rewards:
            return
        passes = sum(min(1.0, max(0.0, float(r))) for r in rewards)
        with self._lock:
            self._add(self.families.setdefault((ref.dataset, ref.config), {}), peer, passes, len(rewards))
            if ref not in self.instances and len(self.instances) >= self.params.max_instances:
                forgotten = next(iter(self.instances))
                for seen in self._by_peer.values():
                    seen.pop(forgotten, None)
                self._replayable.pop(forgotten, None)
                del self.instances[forgotten]
            self._add(self.instances.setdefault(ref, {}), peer, passes, len(rewards))
            if peer == OWN:
                self._index_replay(ref)
            elif peer in self.instances[ref]:
                self._judge(peer, ref)

    def _index_replay(self, ref: TaskRef) -> None:
        passes, trials = self.instances[ref].get(OWN, (0.0, 0.0))
        if 0.0 < passes < trials < self.params.replay_trials:
            self._replayable.setdefault(ref, None)
        else:
            self._replayable.pop(ref, None)

    def _judge(self, peer: str, ref: TaskRef) -> None:
        """Keep `ref` among the peer's last judged instances (the peer becomes the most recently heard)."""
        seen = self._by_peer.pop(peer, None)
        if seen is None and len(self._by_peer) >= self.params.max_judged_peers:
            del self._by_peer[next(iter(self._by_peer))]
        seen = seen if seen is not None else {}
        seen.pop(ref, None)
        seen[ref] = None
        if len(seen) > self.params.judged_instances:
            del seen[next(iter(seen))]
        self._by_peer[peer] = seen

    def _add(self, counts: Counts, source: str, passes: float, trials: int) -> None:
        if source not in counts and len(counts) >= self.params.max_sources:
            return
        entry = counts.setdefault(source, [0.0, 0.0])
        entry[0] += passes
        entry[1] += trials

    def family_rate(self, dataset: str, config: str) -> float:
        with self._lock:
            return _posterior(self.families.get((dataset, config), {}), self.params.prior_pass, self.params)

    def rate(self, ref: TaskRef) -> float:
        family = self.family_rate(ref.dataset, ref.config)
        with self._lock:
            return _posterior(self.instances.get(ref, {}), family, self.params)

    def replayable(self, dataset: str, config: str, seed: int) -> list[tuple[int, float]]:
        """(index, estimated rate) of each replay candidate of the family for one seed (module contract)."""
        family = self.family_rate(dataset, config)
        with self._lock:
            return [(ref.index, _posterior(self.instances[ref], family, self.params)) for ref in self._replayable
                    if ref.dataset == dataset and ref.config == config and ref.seed == seed]

    def disagreeing(self, peer: str) -> bool:
        gaps = []
        with self._lock:
            for ref in self._by_peer.get(peer, {}):
                own, theirs = self.instances[ref].get(OWN), self.instances[ref].get(peer)
                if own and theirs and min(own[1], theirs[1]) >= self.params.min_trials:
                    gaps.append(abs(own[0] / own[1] - theirs[0] / theirs[1]))
        return len(gaps) >= self.params.disagree_instances and sum(gaps) / len(gaps) > self.params.disagree_gap

    def newly_disagreeing(self, peer: str) -> bool:
        if not self.disagreeing(peer):
            self._flagged.discard(peer)
            return False
        if peer in self._flagged:
            return False
        self._flagged.add(peer)
        return True

    def state(self) -> dict[str, Any]:
        with self._lock:
            return {"families": [[d, c, _copy(counts)] for (d, c), counts in self.families.items()],
                    "instances": [[r.dataset, r.config, r.seed, r.index, _copy(counts)]
                                  for r, counts in self.instances.items()],
                    "flagged": sorted(self._flagged),
                    "replayable": [[r.dataset, r.config, r.seed, r.index] for r in self._replayable]}

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Replace the estimates with those of `state` (from `state()`)."""
        with self._lock:
            self.families = {(d, c): _copy(counts) for d, c, counts in state.get("families", [])}
            self.instances = {TaskRef(d, c, int(s), int(i)): _copy(counts)
                              for d, c, s, i, counts in state.get("instances", [])}
            self._flagged = set(state.get("flagged", []))
            self._by_peer = {}
            # in the order they became replayable (a checkpoint before that list: the instances' order)
            order = [TaskRef(d, c, int(s), int(i)) for d, c, s, i in state.get("replayable", [])]
            self._replayable = {}
            for ref in [r for r in order if r in self.instances] + list(self.instances):
                self._index_replay(ref)
            for ref, counts in self.instances.items():
                for source in counts:
                    if source != OWN:
                        self._judge(source, ref)


def _copy(raw: Mapping[str, Sequence[float]]) -> Counts:
    return {str(source): [float(p), float(n)] for source, (p, n) in raw.items()}


def signal_value(rate: float) -> float:
    """The expected signal of a prompt with pass rate `rate`: the variance of its Bernoulli reward."""
    return rate * (1.0 - rate)
