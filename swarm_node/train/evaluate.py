"""Greedy exact-answer accuracy and sampled mean reward on held-out problems, through any sampler, overall and per
specialty (dataset) of the task mix; and the per-specialty numbers of one training step's local groups.

Held-out problems come from `TaskSource.eval_refs`: distinct questions of one held-out split of each dataset
(`split`: "test" by default, "validation" for choosing hyper-parameters; `tasks.SPLITS`), never drawn for
training.
An `EvalResult` keeps each problem's outcome, so that its accuracy carries a 95% interval over distinct questions
and two evals on the same questions compare pairwise (`train/eval_stats.py`), and whether each problem's greedy
completion was well-formed (the format's shape, then EOS): `well_formed_frac()`, overall or of one dataset.
Prompts and answers are the node's prompt format's (`model.prompting.Prompter`; default answer-line).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from transformers import PreTrainedTokenizerBase

from swarm_node import tasks
from swarm_node.model.prompting import Prompter, plain_prompter
from swarm_node.sampler.base import Sampler, SamplingParams
from swarm_node.train import eval_stats
from swarm_node.types import Completion, ScoredGroup


@dataclass(frozen=True)
class EvalResult:
    greedy_acc: float  # over all problems
    sampled_reward: float | None
    problems: int
    per_task: dict[str, float] = field(default_factory=dict)  # dataset -> greedy accuracy on its problems
    distinct: int | None = None  # distinct (dataset, question) pairs among the problems: a small task repeats
    outcomes: tuple[tuple[str, str, float], ...] = ()  # (dataset, question, 1.0 right / 0.0 wrong) per problem
    well_formed: tuple[bool, ...] = ()  # per problem, in the order of `outcomes`: its greedy completion well-formed

    def __str__(self) -> str:
        tasks_part = ", ".join(f"{name} {acc:.3f}" for name, acc in self.per_task.items())
        return f"greedy accuracy {self.greedy_acc:.3f} on {self.size()}" + (
            f" ({tasks_part})" if len(self.per_task) > 1 else "")

    def size(self) -> str:
        """"N problems", and how many distinct questions they are when fewer (an eval is no larger than that)."""
        repeats = self.distinct is not None and self.distinct < self.problems
        return f"{self.problems} problems" + (f" ({self.distinct} distinct questions)" if repeats else "")

    def by_question(self, dataset: str | None = None) -> dict[str, float]:
        """{question key: accuracy} over the distinct questions (of one dataset, or all); empty without outcomes."""
        return eval_stats.per_question((f"{name}\0{question}", right) for name, question, right in self.outcomes
                                       if dataset is None or name == dataset)

    def well_formed_frac(self, dataset: str | None = None) -> float | None:
        """The share of the problems (of one dataset, or all) whose greedy completion was well-formed; None without
        per-problem flags or problems."""
        flags = [ok for (name, _, _), ok in zip(self.outcomes, self.well_formed, strict=True)
                 if dataset is None or name == dataset] if self.well_formed else []
        return sum(flags) / len(flags) if flags else None


def evaluate(sampler: Sampler, tokenizer: PreTrainedTokenizerBase, source: tasks.TaskSource, problems: int = 200,
             max_new_tokens: int = 8, samples: int = 0, temperature: float = 1.0, seed: int = 0,
             batch: int = 100, eos_ids: Collection[int] = (), prompter: Prompter | None = None,
             split: str = tasks.DEFAULT_SPLIT, progress: Callable[[int, int], None] | None = None) -> EvalResult:
    """Greedy accuracy (a well-formed completion scoring 1.0 counts as exact: the format's shape, then EOS, as in
    training; `eos_ids`: the model's, default the tokenizer's) and, if samples > 0, mean correctness at
    `temperature`. `prompter`: the node's prompt format (default answer-line over `tokenizer`). `split`: the held-out
    split asked (`tasks.SPLITS`). `progress(done, total)` is called after each batch of problems."""
    insts = [tasks.instance(r) for r in source.eval_refs(problems, split)]
    eos, special = eos_ids or (tokenizer.eos_token_id,), frozenset(tokenizer.all_special_ids)
    prompter = prompter or plain_prompter(tokenizer)
    fmt = prompter.fmt

    def well_formed(c: Completion) -> bool:
        return fmt.well_formed(c.token_ids, c.text, eos, special)

    right: dict[str, list[bool]] = defaultdict(list)
    outcomes: list[tuple[str, str, float]] = []
    formed: list[bool] = []
    sampled_total, sampled_count = 0.0, 0
    for start in range(0, len(insts), batch):
        chunk = insts[start:start + batch]
        prompts = [prompter.ids(i) for i in chunk]
        greedy = sampler.generate(prompts, 1, SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens))
        for inst, out in zip(chunk, greedy, strict=True):
            formed.append(well_formed(out[0]))
            right[inst.ref.dataset].append(formed[-1] and tasks.score(inst, out[0].text, fmt) >= 1.0)
            outcomes.append((inst.ref.dataset, inst.question, float(right[inst.ref.dataset][-1])))
        if samples > 0:
            params = SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens, seed=seed + start)
            for inst, group in zip(chunk, sampler.generate(prompts, samples, params), strict=True):
                sampled_total += sum(source.reward(inst, c.text, fmt) for c in group if well_formed(c))
                sampled_count += len(group)
        if progress is not None:
            progress(start + len(chunk), len(insts))
    exact = sum(sum(r) for r in right.values())
    return EvalResult(exact / len(insts), sampled_total / sampled_count if sampled_count else None, len(insts),
                      {name: sum(r) / len(r) for name, r in right.items()},
                      distinct=len({(i.ref.dataset, i.question) for i in insts}), outcomes=tuple(outcomes),
                      well_formed=tuple(formed))


def per_task_metrics(groups: list[ScoredGroup]) -> dict[str, dict[str, Any]]:
    """One step's local groups by dataset: mean reward, mean accuracy and group count (metrics.jsonl "per_task")."""
    by_task: dict[str, list[ScoredGroup]] = defaultdict(list)
    for g in groups:
        by_task[g.inst.ref.dataset].append(g)
    return {name: {"reward_mean": sum(r for g in gs for r in g.rewards) / sum(len(g.rewards) for g in gs),
                   "accuracy": sum(g.accuracy for g in gs) / len(gs), "groups": len(gs)}
            for name, gs in sorted(by_task.items())}
