"""Re-scoring a received wire group: never trust the sender.

Contract: `accept_external(wire, sender, ctx, now)` checks attribution, sanity-checks created_at, allows only our
own task (dataset, options, seed), regenerates question and answer from the task reference and RE-SCORES every
completion with our verifier. With our tokenizer hash the token ids are used as they are and the text we score is
OUR decoding of those ids (the sender's text is ignored); with another tokenizer the sender's text is re-tokenized
and the group is marked `retokenized`. A group whose re-scored advantages are all zero is dropped. The outcome says
whether the sender's claimed rewards were wrong (`forged_reward`), which the node counts against the sender even
when the group is usable. Pure: no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from transformers import PreTrainedTokenizerBase

from protocol.messages import RolloutGroup, policy_owner
from swarm_node import tasks
from swarm_node.rl.advantages import ADVANTAGE_ESTIMATORS
from swarm_node.sharing.wire import content_key
from swarm_node.types import Completion, ScoredGroup

REWARD_TOLERANCE = 1e-6  # a claimed reward further than this from ours counts as forged


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
