"""Rollout modes (registry `ROLLOUT_MODES`, `[run.rollout] kind`): the groups one step generates, and APRIL's
partial rollouts carried from one step to the next.

Contract:
- A mode's `step(request)` returns `Rollouts`: groups of G finished completions each (ending with EOS, or at the
  generation budget), the tokens generated for them and any other work (`gen_tokens`), and counters.
- "sync" (the default): draw B prompts, generate G completions each to the end, in one sampler call: today's step
  (with `request.sizes`, the DARS allocation, each prompt's own number: one call per distinct size).
- "april" (APRIL, 2025, "Active Partial Rollouts in Reinforcement Learning to Tame Long-tail
  Generation"): B x (1 + over) groups are in flight (the carried ones first, then new prompts drawn to fill the
  rest); generation runs in rounds of at most `chunk_tokens` new tokens per unfinished completion (a batch engine
  cannot be stopped mid-call, so a round is the granularity of "stop once B groups are complete"); after each round
  the complete groups are counted, and once B are, the step returns the first B (oldest first) and carries the rest,
  finished completions and partial ones (token ids and behaviour log-probs so far) alike. A carried partial
  completion continues under the policy loaded then (`Sampler.resume`: prompt + tokens re-prefilled, counted in
  `reprefilled_tokens`), so it carries one policy version per token span (`Completion.spans`). Carried groups are
  dropped whole, never trained, when any completion's oldest span lags by more than `max_lag` (counted "stale") or
  when the sampler cannot resume them (another engine, `ResumeError`: counted "resume_failed").
- "dynamic" (DAPO's dynamic sampling, for a node alone): rounds of sync generation, each drawing only the groups
  with signal still missing, until B groups have signal or `max_factor` x B groups were generated
  (train/dynamic_sampling.py). It needs `request.has_signal` (the node's scoring of a group); every generated group
  is returned, so the step counts them and their tokens; counters "groups", "signal_groups", "rounds".
The bookkeeping helpers are pure; only the modes' `step` calls the sampler. Carried rollouts live in memory
alone: a restarted node starts without them.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Protocol

from swarm_node import variants
from swarm_node.config import AprilRolloutConfig, DynamicRolloutConfig, RolloutConfig
from swarm_node.sampler.base import ResumeError, Sampler, SamplingParams
from swarm_node.tasks import TaskInstance
from swarm_node.train.dynamic_sampling import sample_until_signal
from swarm_node.train.staleness import span_drop_reason
from swarm_node.types import Completion

# count -> (task instance, prompt ids) of that many newly drawn prompts
Draw = Callable[[int], list[tuple[TaskInstance, list[int]]]]
ROUND_SEED_STRIDE = 7919  # round r of a seeded step samples with seed + r * stride: a fresh stream per round


@dataclass(frozen=True)
class RolloutRequest:
    sampler: Sampler
    draw: Draw
    target: int  # B: complete groups the step trains on
    group_size: int  # G
    params: SamplingParams  # max_new_tokens: the whole generation budget of a completion
    eos_ids: frozenset[int]
    # Completions per drawn prompt (run.rollout_allocation; sync mode only); None: G each.
    sizes: Callable[[list[TaskInstance]], list[int]] | None = None
    # Whether a generated group has signal (the node scores it); only the dynamic mode asks.
    has_signal: Callable[[PendingGroup], bool] | None = None


@dataclass(frozen=True)
class PendingGroup:
    """A group in flight: G completions, finished or partial, started on the engine `engine_id`."""

    inst: TaskInstance
    prompt_ids: tuple[int, ...]
    completions: tuple[Completion, ...]
    engine_id: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "prompt_ids", tuple(self.prompt_ids))
        object.__setattr__(self, "completions", tuple(self.completions))


@dataclass(frozen=True)
class Rollouts:
    groups: tuple[PendingGroup, ...]  # every completion finished
    gen_tokens: int  # tokens sampled this step: for these groups, carried ones and later-discarded ones
    reprefilled_tokens: int = 0  # completion tokens prefilled again to resume partial completions
    counts: tuple[tuple[str, int], ...] = ()  # e.g. ("resume_failed", completions discarded)


@dataclass
class StepTurns:
    """The rotation position (a task selection's `turn`) of each draw of one step: the first at `start`, as every
    step's single draw; a later one (a dynamic-sampling refill) after the prompts drawn so far, shifted by `shift`
    (the step's number), so that a rotating selection does not refill from the mix's first specialties every step."""

    start: int
    shift: int
    drawn: int = 0

    def next(self, count: int) -> int:
        turn = self.start if self.drawn == 0 else self.start + self.drawn + self.shift
        self.drawn += count
        return turn


class RolloutMode(Protocol):
    def step(self, request: RolloutRequest) -> Rollouts: ...


def finished(c: Completion, eos_ids: Collection[int], budget: int) -> bool:
    """Ended with EOS, or used the whole generation budget."""
    return len(c.token_ids) >= budget or (bool(c.token_ids) and c.token_ids[-1] in eos_ids)


def complete(group: PendingGroup, eos_ids: Collection[int], budget: int) -> bool:
    return all(finished(c, eos_ids, budget) for c in group.completions)


def expire(groups: Sequence[PendingGroup], current_version: int, max_lag: int
           ) -> tuple[list[PendingGroup], int]:
    """The groups every completion of which is within `max_lag` of `current_version` in every span (oldest span:
    train/staleness.span_drop_reason), and how many completions the dropped groups held."""
    kept, dropped = [], 0
    for g in groups:
        if any(span_drop_reason(current_version, [v for _, v in c.version_spans()], max_lag) is not None
               for c in g.completions):
            dropped += len(g.completions)
        else:
            kept.append(g)
    return kept, dropped


def split_complete(groups: Sequence[PendingGroup], target: int, eos_ids: Collection[int], budget: int
                   ) -> tuple[list[PendingGroup], list[PendingGroup]]:
    """(the first `target` complete groups in order, every other group in order)."""
    taken: list[PendingGroup] = []
    rest: list[PendingGroup] = []
    for g in groups:
        (taken if len(taken) < target and complete(g, eos_ids, budget) else rest).append(g)
    return taken, rest


def _seeded(params: SamplingParams, round_: int, max_new_tokens: int) -> SamplingParams:
    seed = None if params.seed is None else params.seed + round_ * ROUND_SEED_STRIDE
    return dataclasses.replace(params, max_new_tokens=max_new_tokens, seed=seed)


def generate_sized(sampler: Sampler, prompts: Sequence[list[int]], sizes: Sequence[int],
                   params: SamplingParams) -> list[list[Completion]]:
    """`sizes[i]` completions for prompt i: one sampler call per distinct size (one call when all are G)."""
    outputs: list[list[Completion]] = [[] for _ in prompts]
    for size in sorted(set(sizes)):
        rows = [i for i, n in enumerate(sizes) if n == size]
        for i, out in zip(rows, sampler.generate([prompts[i] for i in rows], size, params), strict=True):
            outputs[i] = out
    return outputs


class SyncRollouts:
    """B prompts, G completions each, generated to the end in one call."""

    def step(self, request: RolloutRequest) -> Rollouts:
        drawn = request.draw(request.target)
        sizes = request.sizes([i for i, _ in drawn]) if request.sizes else [request.group_size] * len(drawn)
        outputs = generate_sized(request.sampler, [p for _, p in drawn], sizes, request.params)
        engine = request.sampler.engine_id
        groups = tuple(PendingGroup(i, p, out, engine) for (i, p), out in zip(drawn, outputs, strict=True))
        return Rollouts(groups, sum(len(c.token_ids) for out in outputs for c in out))


class AprilRollouts:
    """Over-provisioned rounds; the groups left unfinished at the end of a step are carried to the next."""

    def __init__(self, over: float, chunk_tokens: int, max_lag: int) -> None:
        self.over, self.chunk_tokens, self.max_lag = over, chunk_tokens, max_lag
        self.carried: list[PendingGroup] = []

    def step(self, request: RolloutRequest) -> Rollouts:
        sampler, budget, eos = request.sampler, request.params.max_new_tokens, request.eos_ids
        counts: Counter[str] = Counter()
        pending, counts["stale"] = expire(self.carried, sampler.version, self.max_lag)
        moved = [g for g in pending if g.engine_id != sampler.engine_id]  # started on an engine that is gone
        counts["resume_failed"] += sum(len(g.completions) for g in moved)
        pending = [g for g in pending if g.engine_id == sampler.engine_id]
        counts["carried_in"] = len(pending)
        gen_tokens = reprefilled = 0
        wanted = math.ceil(request.target * (1.0 + self.over))
        drawn = request.draw(max(0, wanted - len(pending)))
        if drawn:
            first = sampler.generate([p for _, p in drawn], request.group_size,
                                     _seeded(request.params, 0, min(self.chunk_tokens, budget)))
            pending += [PendingGroup(i, p, out, sampler.engine_id) for (i, p), out in zip(drawn, first, strict=True)]
            gen_tokens += sum(len(c.token_ids) for out in first for c in out)
        round_ = 1
        while sum(complete(g, eos, budget) for g in pending) < request.target:
            rows = [(gi, ci) for gi, g in enumerate(pending) for ci, c in enumerate(g.completions)
                    if not finished(c, eos, budget)]
            if not rows:
                break
            try:
                new, tokens, prefilled = self._resume_rows(sampler, pending, rows, request.params, budget, round_)
            except ResumeError:
                failed = {gi for gi, _ in rows}
                counts["resume_failed"] += sum(len(pending[gi].completions) for gi in failed)
                pending = [g for gi, g in enumerate(pending) if gi not in failed]
                continue
            pending, gen_tokens, reprefilled = new, gen_tokens + tokens, reprefilled + prefilled
            round_ += 1
            if tokens == 0:  # a sampler that adds nothing would loop forever
                break
        taken, self.carried = split_complete(pending, request.target, eos, budget)
        counts["carried_out"] = len(self.carried)
        counts["rounds"] = round_
        counts["reprefilled_tokens"] = reprefilled
        return Rollouts(tuple(taken), gen_tokens, reprefilled, tuple(sorted(counts.items())))

    def _resume_rows(self, sampler: Sampler, pending: list[PendingGroup], rows: list[tuple[int, int]],
                     params: SamplingParams, budget: int, round_: int) -> tuple[list[PendingGroup], int, int]:
        """One round: every unfinished completion continued by up to chunk_tokens (its remaining budget at most);
        rows of equal chunk go in one sampler call. (new pending groups, tokens sampled, tokens re-prefilled)."""
        by_chunk: dict[int, list[tuple[int, int]]] = {}
        for gi, ci in rows:
            left = budget - len(pending[gi].completions[ci].token_ids)
            by_chunk.setdefault(min(self.chunk_tokens, left), []).append((gi, ci))
        slots = [list(g.completions) for g in pending]
        tokens = prefilled = 0
        for chunk, part in sorted(by_chunk.items()):
            partials = [slots[gi][ci] for gi, ci in part]
            resumed = sampler.resume([list(pending[gi].prompt_ids) for gi, _ in part], partials,
                                     _seeded(params, round_, chunk))
            for (gi, ci), old, new in zip(part, partials, resumed, strict=True):
                slots[gi][ci] = new
                tokens += len(new.token_ids) - len(old.token_ids)
                prefilled += len(old.token_ids)
        return [dataclasses.replace(g, completions=tuple(s)) for g, s in zip(pending, slots, strict=True)], \
            tokens, prefilled


class DynamicRollouts:
    """Sync rounds until B groups have signal, at most max_factor x B groups (train/dynamic_sampling.py)."""

    def __init__(self, max_factor: int) -> None:
        self.max_factor = max_factor

    def step(self, request: RolloutRequest) -> Rollouts:
        if request.has_signal is None:
            raise ValueError("the dynamic rollout mode needs request.has_signal (the node's scoring of a group)")
        sampler, engine = request.sampler, request.sampler.engine_id
        tokens = 0

        def generate(round_: int, count: int) -> list[PendingGroup]:
            nonlocal tokens
            drawn = request.draw(count)
            outputs = sampler.generate([p for _, p in drawn], request.group_size,
                                       _seeded(request.params, round_, request.params.max_new_tokens))
            tokens += sum(len(c.token_ids) for out in outputs for c in out)
            return [PendingGroup(i, p, out, engine) for (i, p), out in zip(drawn, outputs, strict=True)]

        got = sample_until_signal(generate, request.has_signal, request.target, self.max_factor)
        counts = (("groups", got.generated), ("rounds", got.rounds), ("signal_groups", got.with_signal))
        return Rollouts(got.groups, tokens, counts=counts)


def _april(cfg: RolloutConfig) -> RolloutMode:
    assert isinstance(cfg, AprilRolloutConfig)
    return AprilRollouts(cfg.over, cfg.chunk_tokens, cfg.max_lag)


ROLLOUT_MODES: variants.Registry[Callable[[RolloutConfig], RolloutMode]] = variants.Registry(
    "run.rollout.kind", variants.ROLLOUT_MODES)
ROLLOUT_MODES.add("sync", lambda cfg: SyncRollouts())
ROLLOUT_MODES.add("april", _april)


def _dynamic(cfg: RolloutConfig) -> RolloutMode:
    assert isinstance(cfg, DynamicRolloutConfig)
    return DynamicRollouts(cfg.max_factor)


ROLLOUT_MODES.add("dynamic", _dynamic)
