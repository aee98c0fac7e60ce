"""Re-scoring a received wire group: never trust the sender.

Contract: `accept_external(wire, sender, ctx, now)` checks attribution, sanity-checks created_at, allows only the
(dataset, options) pairs we accept (`task.accept`, by default our own mix) with our seed ("task_not_allowed"),
only groups generated in our prompt format ("prompt_format_mismatch": another format's completions cannot be read
as ours; no reputation cost, it is another configuration), checks the group against OUR bounds (below),
regenerates question and answer from the task reference and the prompt with OUR prompter (`ctx.prompter`, default
answer-line), drops a group on a held-out question, test or validation ("heldout", tasks/heldout.py) and RE-SCORES
every completion with our verifier on the answer our format extracts, plus our own reward terms (`ctx.terms`).
With our tokenizer hash the token ids are used as they are and the text we score is OUR decoding of those ids
(the sender's text is ignored); with another tokenizer the sender's text is re-tokenized and the group is marked
`retokenized`. A completion keeps the policy versions the wire gives it (`CompletionWire.spans`, which the decoder
checked: ordered, each start a token, none newer than the group's version): with our tokenizer its spans (version:
the newest span's; no spans: the group's version; one span is kept as its version alone, as our sampler keeps one);
re-tokenized, one span at its OLDEST span's version, since the sender's token indices do not map to our ids and the
staleness bound must read the oldest policy. A completion that is not well-formed (our format's `well_formed`: its
shape, then exactly one EOS as its last id, no other special id) is re-scored 0 whatever the verifier says; the
outcome counts them (`malformed`). A re-tokenized completion gets our EOS appended, so only its text is checked.
With `ctx.require_well_formed` False (`share.require_well_formed`, for measuring the defence only) malformed
completions keep their verifier score. A group whose re-scored advantages are all zero is dropped (a group whose
only "right" answers are malformed is one). The outcome says whether the sender's claimed rewards were wrong
(`forged_reward`), which the node counts against the sender even when the group is usable. Pure: no I/O.

Bounds (`ctx.bounds`, a `CompletionBounds` built from our own configuration): whatever a peer sends may cost us
only what one of our own groups costs. They are checked before any id is decoded, any completion re-scored or
anything reaches the trainer; one completion over a bound drops the whole group with a counted reason:
- "group_size": the group holds at least MIN_GROUP (2: one completion has no advantage) and at most
  `max_group_completions` completions (our own largest group: run.group_size, or 2 x G under the dars allocation,
  unless `[share] max_group_completions` says otherwise). Policy: groups of another size within the bounds (G + 1
  for a median baseline, DARS's varying sizes) are taken: GRPO normalises advantages within each group, so a
  group's size is its own business; a larger group is dropped whole, never truncated.
- "group_tokens": the completions' ids together are at most `max_group_tokens` (default max_group_completions x
  max_completion_tokens; a re-tokenized group is counted after re-tokenization): what one group may cost us in
  re-scoring and training, whatever its size. Over a window, the re-scoring work budget (sharing/budget.py)
  bounds a peer's cost by the measured work of the groups it sent, each bounded here.
- "over_length": a completion has at most `max_completion_tokens` ids, EOS included; our samplers (HF generate,
  vLLM) count the EOS among the sampler.max_new_tokens new tokens, so this is exactly what we sample ourselves.
  A re-tokenized text is checked after re-tokenization, with the EOS we append, against the same bound. Policy: a
  peer with a larger max_new_tokens is partly incompatible; its completions longer than ours drop their groups
  (counted under over_length), its shorter ones are used.
- "over_context": prompt (our own tokenization of the regenerated prompt) + completion <= `max_context`, the
  model's max positions.
- "token_out_of_vocab": every id < `vocab_size` (and < len(tokenizer)), for the sender's ids and for re-tokenized
  ones alike.
The cost of re-tokenizing (another tokenizer's group) is bounded by the wire decoder's text limit per completion
times max_group_completions.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

from protocol.messages import RolloutGroup, policy_owner
from swarm_node import tasks
from swarm_node.model.prompting import Prompter, plain_prompter
from swarm_node.sharing.wire import content_key
from swarm_node.train.scoring import score_group
from swarm_node.types import Completion, Origin, ScoredGroup

REWARD_TOLERANCE = 1e-6  # a claimed reward further than this from ours counts as forged
MIN_GROUP = 2  # completions a group needs for any advantage


@dataclass(frozen=True)
class CompletionBounds:
    """Our own limits on a received group (see the module contract); all positive ints."""

    max_completion_tokens: int  # ids per completion, EOS included: our sampler.max_new_tokens
    max_context: int  # prompt + completion ids: the model's max_position_embeddings
    vocab_size: int  # every id below this: the model's vocab_size (embedding rows)
    group_size: int  # our run.group_size: the default of max_group_completions
    max_group_completions: int = 0  # completions per group at most; 0: group_size
    max_group_tokens: int = 0  # completion ids per group at most; 0: max_group_completions x max_completion_tokens

    def __post_init__(self) -> None:
        for name in ("max_completion_tokens", "max_context", "vocab_size", "group_size"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ValueError(f"CompletionBounds.{name} must be a positive int, got {value!r}")
        for name in ("max_group_completions", "max_group_tokens"):
            value = getattr(self, name)
            if type(value) is not int or value < 0:
                raise ValueError(f"CompletionBounds.{name} must be an int >= 0 (0: the default), got {value!r}")

    @property
    def group_completions(self) -> int:
        """The most completions a group may hold."""
        return self.max_group_completions or self.group_size

    @property
    def group_tokens(self) -> int:
        """The most completion ids a group may hold, all completions together."""
        return self.max_group_tokens or self.group_completions * self.max_completion_tokens


@dataclass(frozen=True)
class ShareContext:
    tokenizer: PreTrainedTokenizerBase
    tokenizer_hash: str
    task_source: tasks.TaskSource
    bounds: CompletionBounds
    advantage: str = "grpo"
    max_clock_skew_s: float = 30.0
    max_age_s: float = 600.0
    require_well_formed: bool = True  # False (measurements only): a malformed completion keeps its verifier score
    eos_ids: tuple[int, ...] = ()  # every id that ends a completion (model/tokenizer.eos_ids); empty: the tokenizer's
    prompter: Prompter | None = None  # our prompt format over our tokenizer; None: answer-line
    terms: tasks.RewardTerms = tasks.NO_TERMS  # our reward terms (format bonus, length penalty)

    def active_prompter(self) -> Prompter:
        return self.prompter or plain_prompter(self.tokenizer)


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
    malformed: int = 0  # completions re-scored 0 as not well-formed (counted once the group was re-scored)


def _valid_logprobs(lps: tuple[float, ...], n: int) -> bool:
    return len(lps) == n and all(math.isfinite(x) and x <= 0.0 for x in lps)


def _ids_reason(ids: tuple[int, ...] | list[int], vocab: int, bounds: CompletionBounds) -> str:
    """The drop reason for one completion's ids, or "" (length first: cheap, and bounds the vocabulary scan)."""
    if len(ids) > bounds.max_completion_tokens:
        return "over_length"
    if any(t < 0 or t >= vocab for t in ids):
        return "token_out_of_vocab"
    return ""


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
    # Only the accepted (dataset, options) pairs (task.accept, default our mix) of our seed: a peer must not make
    # us build datasets for arbitrary seeds or options.
    if not ctx.task_source.allows(ref) or ref.seed != ctx.task_source.seed:
        return Outcome(None, "task_not_allowed")
    prompter = ctx.active_prompter()
    if wire.prompt_format != prompter.name:
        return Outcome(None, "prompt_format_mismatch")
    if not wire.completions:
        return Outcome(None, "empty_group")
    bounds = ctx.bounds
    if not MIN_GROUP <= len(wire.completions) <= bounds.group_completions:
        return Outcome(None, "group_size")
    tok = ctx.tokenizer
    vocab = min(len(tok), bounds.vocab_size)
    same_tokenizer = wire.tokenizer_hash == ctx.tokenizer_hash
    eos = tok.eos_token_id  # appended to a re-tokenized text
    ends = ctx.eos_ids or (eos,)  # any of the model's EOS ids ends one of ours
    # Every bound is checked before anything is decoded or scored: first the ids alone...
    token_ids: list[list[int]] = []
    group_tokens = 0
    for c in wire.completions:
        # Re-tokenized as a continuation: no special tokens (a Llama-3 tokenizer would prepend its BOS to every
        # completion, which then is not well-formed).
        ids = list(c.token_ids) if same_tokenizer else tok.encode(c.text, add_special_tokens=False) + [eos]
        reason = _ids_reason(ids, vocab, bounds)
        if reason:
            return Outcome(None, reason)
        group_tokens += len(ids)
        if group_tokens > bounds.group_tokens:
            return Outcome(None, "group_tokens")
        if same_tokenizer and not _valid_logprobs(c.logprobs, len(ids)):
            return Outcome(None, "bad_logprob")
        token_ids.append(ids)
    # ...then the context, against our own tokenization of the prompt we regenerate.
    inst = tasks.instance(ref)
    if ctx.task_source.is_heldout(inst):  # a test or validation problem: a peer must never make us train on it
        return Outcome(None, "heldout")
    prompt_ids = prompter.ids(inst)
    if len(prompt_ids) + max(len(ids) for ids in token_ids) > bounds.max_context:
        return Outcome(None, "over_context")
    completions: list[Completion] = []
    for c, ids in zip(wire.completions, token_ids, strict=True):
        if same_tokenizer:
            text = tok.decode([t for t in ids if t not in ends], skip_special_tokens=True)
            completions.append(Completion.from_spans(ids, text, c.logprobs, c.spans, wire.policy_version))
        else:
            # Re-tokenized ids do not map to the sender's token indices: the whole completion is as old as its
            # oldest span (the conservative reading for a staleness bound).
            oldest = min((v for _, v in c.spans), default=wire.policy_version)
            completions.append(Completion(ids, c.text, [], oldest))
    special = frozenset(tok.all_special_ids)
    fmt = prompter.fmt
    malformed = sum(not fmt.well_formed(c.token_ids, c.text, ends, special) for c in completions)
    try:  # the same scoring as our own groups: well-formed or 0, then our verifier and terms, then advantages
        group = score_group(inst, prompt_ids, completions, ctx.task_source.reward, ctx.advantage, Origin.peer(sender),
                            eos_id=ends if ctx.require_well_formed else None, special_ids=special, fmt=fmt,
                            terms=ctx.terms)
    except FloatingPointError:
        return Outcome(None, "non_finite_reward", malformed=malformed)
    forged = any(abs(c.claimed_reward - r) > REWARD_TOLERANCE for c, r in zip(wire.completions, group.rewards,
                                                                               strict=True))
    if not group.has_signal and not keep_no_signal:
        return Outcome(None, "zero_advantage", forged, malformed)
    return Outcome(External(group, content_key(ref, [c.token_ids for c in completions]), not same_tokenizer),
                   "", forged, malformed)
