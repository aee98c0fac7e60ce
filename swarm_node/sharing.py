"""Experience sharing (SAPO): our ScoredGroups to wire RolloutGroups, and received wire groups back to ScoredGroups.

Contract:
- `to_wire` packs a local group for publishing; log-probs are clamped to <= 0 (float rounding) as the wire demands.
- `accept_external(wire, sender, ctx, now)` never trusts the sender: it checks attribution, sanity-checks
  created_at, allows only our own task (dataset, options, seed), regenerates question and answer from the task
  reference and RE-SCORES every completion with our verifier. With our tokenizer hash the token ids are used as
  they are and the text we score is OUR decoding of those ids (the sender's text is ignored); with another
  tokenizer the sender's text is re-tokenized and the group is marked `retokenized`. A group whose re-scored
  advantages are all zero is dropped. The outcome says whether the sender's claimed rewards were wrong
  (`forged_reward`), which the node counts against the sender even when the group is usable.
- External completions are on-policy by default: before training, `external_samples` recomputes their log-probs
  under the local policy and uses them as the ratio's old log-probs (ratio 1 at the first minibatch, as in
  rl-swarm). With correction "is" and a matching tokenizer each completion's advantage is scaled by
  `sequence_is_weight` = min(exp(mean_t(log pi_local - log mu_sender)), cap), cap <= 2: the sender's log-probs
  are untrusted, so they can shrink a completion's gradient but never enlarge it past `cap`. (The trainer takes
  per-sequence advantages, so the weight is the length-normalised sequence ratio of GSPO, truncated.)
- `Exchange` is what the node needs from the network: publish our groups, drain what arrived. Implementations:
  `swarm_node.exchange.TransportExchange` over any `Transport` (memory in simulations, libp2p for `join`).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import torch
from transformers import PreTrainedTokenizerBase

from protocol.messages import CompletionWire, RolloutGroup, TaskRefWire, policy_owner
from swarm_node import tasks
from swarm_node.pool import PoolEntry
from swarm_node.rl.advantages import ADVANTAGE_ESTIMATORS
from swarm_node.rollout import ScoredGroup
from swarm_node.sampler.base import Completion
from swarm_node.trainer import Trainer, TrainSample, collate

REWARD_TOLERANCE = 1e-6  # a claimed reward further than this from ours counts as forged


@dataclass(frozen=True)
class Received:
    """One thing that arrived from `sender`: a wire group, or (group None) a message dropped by wire validation."""

    sender: str
    received_at: float
    group: RolloutGroup | None
    reason: str = ""


class Exchange(Protocol):
    """The node's view of the network (sequential loop: publish after sampling, drain before mixing)."""

    @property
    def peer_id(self) -> str: ...

    def publish(self, groups: list[RolloutGroup]) -> None: ...

    def drain(self) -> list[Received]: ...


@dataclass(frozen=True)
class ShareContext:
    tokenizer: PreTrainedTokenizerBase
    tokenizer_hash: str
    task_source: tasks.TaskSource
    advantage: str = "grpo"
    max_clock_skew_s: float = 30.0
    max_age_s: float = 600.0


@dataclass(frozen=True)
class External:
    group: ScoredGroup  # rewards and advantages are ours; completion log-probs are the sender's (or empty)
    key: bytes
    retokenized: bool


@dataclass(frozen=True)
class Outcome:
    external: External | None
    reason: str = ""  # drop reason when external is None
    forged_reward: bool = False


def to_wire(group: ScoredGroup, policy_id: str, version: int, tokenizer_hash: str, family: str, created_at: float,
            group_id: bytes) -> RolloutGroup:
    completions = tuple(CompletionWire(tuple(c.token_ids), c.text, tuple(min(lp, 0.0) for lp in c.logprobs), r)
                        for c, r in zip(group.completions, group.rewards, strict=True))
    ref = group.inst.ref
    return RolloutGroup(group_id, policy_id, version, TaskRefWire(ref.dataset, ref.config, ref.seed, ref.index),
                        completions, tokenizer_hash, family, created_at)


def group_id_for(peer_id: str, step: int, index: int, seed: int) -> bytes:
    """Deterministic 16-byte group id (simulations reproduce byte for byte; content dedup does not rely on it)."""
    return hashlib.sha256(f"{peer_id}/{seed}/{step}/{index}".encode()).digest()[:16]


def content_key(ref: tasks.TaskRef, completion_ids: list[list[int]]) -> bytes:
    """Hash of what a group trains on: the task and the multiset of completions (order-free, so a permuted
    re-send is still a duplicate)."""
    h = hashlib.sha256(f"{ref.dataset}\0{ref.config}\0{ref.seed}\0{ref.index}".encode())
    for ids in sorted(completion_ids):
        h.update(len(ids).to_bytes(4, "little"))
        h.update(b"".join(t.to_bytes(4, "little") for t in ids))
    return h.digest()


def _valid_logprobs(lps: tuple[float, ...], n: int) -> bool:
    return len(lps) == n and all(math.isfinite(x) and x <= 0.0 for x in lps)


def accept_external(wire: RolloutGroup, sender: str, ctx: ShareContext, now: float,
                    delegates: Mapping[str, frozenset[str]] | None = None, keep_no_signal: bool = False) -> Outcome:
    """Re-score a received group with our own verifier; an Outcome with the usable group or a drop reason.
    `delegates` maps a policy owner to the peers allowed to sign its rollouts (an ECHO-2 learner's workers);
    `keep_no_signal` keeps zero-advantage groups (a learner's batch is its workers' groups, signal or not)."""
    owner = policy_owner(wire.policy_id)
    if owner != sender and sender not in (delegates or {}).get(owner, frozenset()):
        return Outcome(None, "forged_attribution")
    if not math.isfinite(wire.created_at) or wire.created_at > now + ctx.max_clock_skew_s:
        return Outcome(None, "future")
    if wire.created_at < now - ctx.max_age_s:
        return Outcome(None, "stale")
    ref = tasks.TaskRef(wire.task.dataset, wire.task.config, wire.task.seed, wire.task.index)
    # Only our own task stream: a peer must not make us build datasets for arbitrary seeds or options.
    if not ctx.task_source.allows(ref) or ref.seed != ctx.task_source.seed:
        return Outcome(None, "task_not_allowed")
    if not wire.completions:
        return Outcome(None, "empty_group")
    tok = ctx.tokenizer
    same_tokenizer = wire.tokenizer_hash == ctx.tokenizer_hash
    eos = tok.eos_token_id
    completions: list[Completion] = []
    for c in wire.completions:
        if same_tokenizer:
            if any(t >= len(tok) for t in c.token_ids):
                return Outcome(None, "token_out_of_vocab")
            if not _valid_logprobs(c.logprobs, len(c.token_ids)):
                return Outcome(None, "bad_logprob")
            ids = list(c.token_ids)
            text = tok.decode([t for t in ids if t != eos], skip_special_tokens=True)
            completions.append(Completion(ids, text, list(c.logprobs), wire.policy_version))
        else:
            ids = tok.encode(c.text) + [eos]
            completions.append(Completion(ids, c.text, [], wire.policy_version))
    inst = tasks.instance(ref)
    rewards = [ctx.task_source.reward(inst, c.text) for c in completions]
    if not all(math.isfinite(r) for r in rewards):
        return Outcome(None, "non_finite_reward")
    forged = any(abs(c.claimed_reward - r) > REWARD_TOLERANCE for c, r in zip(wire.completions, rewards,
                                                                               strict=True))
    adv = ADVANTAGE_ESTIMATORS[ctx.advantage](torch.tensor(rewards, dtype=torch.float64)).tolist()
    group = ScoredGroup(inst, tok.encode(inst.prompt), completions, rewards, adv, source=sender)
    if not group.has_signal and not keep_no_signal:
        return Outcome(None, "zero_advantage", forged)
    return Outcome(External(group, content_key(ref, [c.token_ids for c in completions]), not same_tokenizer),
                   "", forged)


def sequence_is_weight(local_logprobs: list[float], sender_logprobs: list[float], cap: float) -> float:
    """min(exp(mean_t(local - sender)), cap): the length-normalised truncated importance weight of one
    completion. Never above cap, whatever the sender claims."""
    if not local_logprobs:
        return 1.0
    mean = sum(a - b for a, b in zip(local_logprobs, sender_logprobs, strict=True)) / len(local_logprobs)
    return min(math.exp(min(mean, math.log(cap))), cap)


@torch.no_grad()
def policy_logprobs(trainer: Trainer, samples: list[TrainSample], batch: int = 64) -> list[list[float]]:
    """Processed log-probs of each sample's completion tokens under the trainer's current policy."""
    out: list[list[float]] = []
    for start in range(0, len(samples), batch):
        chunk = samples[start:start + batch]
        b = collate(chunk, trainer.pad_id)
        lp, _ = trainer.token_log_probs(trainer.model, b)
        for i, s in enumerate(chunk):
            p = len(s.prompt_ids)
            out.append(lp[i, p - 1 : p - 1 + len(s.completion_ids)].tolist())
    return out


def external_samples(trainer: Trainer, externals: list[PoolEntry], correction: str,
                     is_cap: float) -> list[TrainSample]:
    """Training samples for external groups, on-policy under the local model (see the module contract)."""
    raw: list[tuple[TrainSample, list[float] | None]] = []
    for ext in externals:
        g = ext.group
        for c, a in zip(g.completions, g.advantages, strict=True):
            if not c.token_ids:
                continue
            sender_lp = c.logprobs if (correction == "is" and not ext.retokenized) else None
            raw.append((TrainSample(g.prompt_ids, c.token_ids, [0.0] * len(c.token_ids), a), sender_lp))
    if not raw:
        return []
    local = policy_logprobs(trainer, [s for s, _ in raw])
    samples = []
    for (s, sender_lp), lp in zip(raw, local, strict=True):
        adv = s.advantage * (sequence_is_weight(lp, sender_lp, is_cap) if sender_lp is not None else 1.0)
        samples.append(TrainSample(s.prompt_ids, s.completion_ids, lp, adv))
    return samples
