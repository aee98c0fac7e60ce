"""Greedy exact-answer accuracy and sampled mean reward on held-out problems, through any sampler."""

from __future__ import annotations

from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

from swarm_node import tasks
from swarm_node.sampler.base import Sampler, SamplingParams


@dataclass(frozen=True)
class EvalResult:
    greedy_acc: float
    sampled_reward: float | None
    problems: int


def evaluate(sampler: Sampler, tokenizer: PreTrainedTokenizerBase, source: tasks.TaskSource, problems: int = 200,
             max_new_tokens: int = 8, samples: int = 0, temperature: float = 1.0, seed: int = 0,
             batch: int = 100) -> EvalResult:
    """Greedy accuracy (a score of 1.0 counts as exact) and, if samples > 0, mean training reward at `temperature`."""
    insts = [tasks.instance(r) for r in source.eval_refs(problems)]
    exact, sampled_total, sampled_count = 0, 0.0, 0
    for start in range(0, len(insts), batch):
        chunk = insts[start:start + batch]
        prompts = [tokenizer.encode(i.prompt) for i in chunk]
        greedy = sampler.generate(prompts, 1, SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens))
        exact += sum(tasks.score(i, g[0].text) >= 1.0 for i, g in zip(chunk, greedy, strict=True))
        if samples > 0:
            params = SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens, seed=seed + start)
            for inst, group in zip(chunk, sampler.generate(prompts, samples, params), strict=True):
                sampled_total += sum(source.reward(inst, c.text) for c in group)
                sampled_count += len(group)
    return EvalResult(exact / len(insts), sampled_total / sampled_count if sampled_count else None, len(insts))
