"""Tasks from reasoning-gym, referenced by `(dataset, config, seed, index)` and regenerated from that reference.

A task instance is never shipped as text: peers exchange a `TaskRef`, and every node rebuilds the question and
the answer from it with reasoning-gym, then scores completions itself with the dataset's `score_answer`. Prompt
formatting and answer parsing live here and nowhere else.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from swarm_node import variants
from swarm_node.errors import UserError

DEFAULT_TASK = "chain_sum"
# One-digit sums and differences (200 distinct problems): a ~1.6M-parameter char model gets ~30% right after its
# warm-up, and RL can take it much further on CPU within minutes (bench.solo_learning).
DEFAULT_TASK_OPTIONS: dict[str, Any] = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}
# Procedural datasets generate entry i from (seed, i); the size only bounds the index.
DATASET_SIZE = 1_000_000
# Held-out evaluation draws from a seed the training stream never uses.
EVAL_SEED_OFFSET = 1_000_003

ANSWER_PREFIX = "\nAnswer: "

# Reward modes over reasoning-gym's score_answer. "exact" (default): 1 when the verifier says fully right, else 0.
# reasoning-gym gives partial credit when the true answer is a substring of ours ("-6" for 6 scores 0.5), and
# GRPO's normalisation turns that into a full positive advantage in an all-wrong group: training then teaches
# sign errors. Measured on the default task: with "score", greedy accuracy fell while sampled reward rose.
REWARD_MODES: variants.Registry[Callable[[float], float]] = variants.Registry("task.reward", variants.REWARD_MODES)
REWARD_MODES.add("exact", lambda raw: 1.0 if raw >= 1.0 else 0.0)
REWARD_MODES.add("score", lambda raw: raw)

# Task selections: fn(rng, size, count) -> `count` instance indices in [0, size). The training stream's order.
TaskSelection = Callable[[random.Random, int, int], list[int]]
TASK_SELECTIONS: variants.Registry[TaskSelection] = variants.Registry("task.selection", variants.TASK_SELECTIONS)


@TASK_SELECTIONS.register("uniform")
def select_uniform(rng: random.Random, size: int, count: int) -> list[int]:
    """Independent uniform draws over the whole (procedural) dataset."""
    return [rng.randrange(size) for _ in range(count)]


@dataclass(frozen=True)
class TaskRef:
    """A reference to one task instance; `config` is canonical JSON of the dataset options."""

    dataset: str
    config: str
    seed: int
    index: int


@dataclass(frozen=True)
class TaskInstance:
    ref: TaskRef
    question: str
    answer: str
    prompt: str
    entry: dict[str, Any]


def canonical_config(options: dict[str, Any]) -> str:
    return json.dumps(options, sort_keys=True, separators=(",", ":"))


def format_prompt(question: str) -> str:
    """The one place prompts are built from a question."""
    return question.strip() + ANSWER_PREFIX


def parse_answer(completion_text: str) -> str:
    """The model's answer is its first line, stripped."""
    return completion_text.split("\n", 1)[0].strip()


@lru_cache(maxsize=64)
def _dataset(name: str, config: str, seed: int, size: int) -> Any:
    import reasoning_gym

    try:
        return reasoning_gym.create_dataset(name, size=size, seed=seed, **json.loads(config))
    except (KeyError, ValueError) as exc:
        raise UserError(f"unknown task {name!r}: {exc}") from exc
    except (TypeError, AssertionError) as exc:
        raise UserError(f"bad options for task {name!r} ({config}): {exc}") from exc


def available_tasks() -> list[str]:
    from reasoning_gym.factory import DATASETS

    return sorted(DATASETS)


class TaskSource:
    """Draws task references for one (dataset, options, seed) and regenerates and scores instances."""

    def __init__(self, name: str = DEFAULT_TASK, options: dict[str, Any] | None = None, seed: int = 0,
                 size: int = DATASET_SIZE, reward: str = "exact", selection: str = "uniform") -> None:
        if name not in available_tasks():
            raise UserError(f"unknown task {name!r}; see reasoning-gym's datasets, e.g. chain_sum, basic_arithmetic")
        if reward not in REWARD_MODES:
            raise UserError(f"unknown reward mode {reward!r}; choose {', '.join(REWARD_MODES)}")
        self.name = name
        self.reward_mode = reward
        if selection not in TASK_SELECTIONS:
            raise UserError(f"unknown task selection {selection!r}; choose {', '.join(TASK_SELECTIONS)}")
        self.select = TASK_SELECTIONS[selection]
        # No options for the default task means the embedded defaults (small sums); other tasks use their own.
        self.options = dict(DEFAULT_TASK_OPTIONS if not options and name == DEFAULT_TASK else options or {})
        self.config = canonical_config(self.options)
        self.seed = seed
        self.size = size
        _dataset(name, self.config, seed, size)  # validate the options now, not at the first draw

    def draw(self, rng: random.Random, count: int) -> list[TaskRef]:
        return [TaskRef(self.name, self.config, self.seed, i) for i in self.select(rng, self.size, count)]

    def reward(self, inst: TaskInstance, completion_text: str) -> float:
        """The training reward of a completion: reasoning-gym's score under this source's reward mode."""
        return REWARD_MODES[self.reward_mode](score(inst, completion_text, self.size))

    def eval_refs(self, count: int) -> list[TaskRef]:
        """The first `count` instances of the held-out stream."""
        return [TaskRef(self.name, self.config, self.seed + EVAL_SEED_OFFSET, i) for i in range(count)]

    def allows(self, ref: TaskRef) -> bool:
        """Whether a peer's reference names our dataset and options with an index in bounds."""
        return (ref.dataset == self.name and ref.config == self.config and 0 <= ref.index < self.size
                and 0 <= ref.seed < 2**63)


def instance(ref: TaskRef, size: int = DATASET_SIZE) -> TaskInstance:
    entry = _dataset(ref.dataset, ref.config, ref.seed, size)[ref.index]
    return TaskInstance(ref, entry["question"], str(entry["answer"]), format_prompt(entry["question"]), entry)


def score(inst: TaskInstance, completion_text: str, size: int = DATASET_SIZE) -> float:
    """Reward from reasoning-gym's own verifier (in [0, 1] for well-behaved datasets; callers check finiteness)."""
    dataset = _dataset(inst.ref.dataset, inst.ref.config, inst.ref.seed, size)
    return float(dataset.score_answer(parse_answer(completion_text), inst.entry))
