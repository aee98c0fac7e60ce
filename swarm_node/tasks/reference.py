"""Task references, regeneration, prompt format, answer parsing and scoring.

A task instance is never shipped as text: peers exchange a `TaskRef` (dataset, canonical options, seed, index),
and every node rebuilds the question and the answer from it with reasoning-gym, then scores completions itself
with the dataset's `score_answer`. Prompt formatting and answer parsing live here and nowhere else.

A completion is WELL-FORMED when it has its prompt format's shape, then exactly one EOS (`formats.py`; for the
default `answer-line`: the answer alone on one line). The verifier sees only the answer the format extracts, so a
right answer followed by junk, padded to the budget or never stopped would pass it and teach exactly that; every
training reward is therefore 0 for a completion that is not well-formed (local and peers' groups alike, every
reward mode), which gives it a non-positive advantage in any group. The length budget itself is the caller's
(the sampler's max_new_tokens; `sharing.rescore` bounds peers' ids).

The default task: one task with no options is `DEFAULT_TASK` with `DEFAULT_TASK_OPTIONS`; a config that names no
task draws the mix `DEFAULT_MIX`, one of the embedded mixes registered by name in `MIXES` (an older one stays
loadable by its name).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from swarm_node import variants
from swarm_node.errors import UserError
from swarm_node.tasks.formats import ANSWER_LINE, PromptFormat

DEFAULT_TASK = "chain_sum"
# chain_sum without options: one-digit sums and differences (200 distinct problems). The single-task default, apart
# from the default mix: `--task chain_sum` keeps meaning this whatever the mix is.
DEFAULT_TASK_OPTIONS: dict[str, Any] = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}
# The embedded task mixes by name (docs/TASK_MIX.md): a recipe or config that names one keeps its problems when the
# default moves on.
MIXES: variants.Registry[tuple[dict[str, Any], ...]] = variants.Registry("task mix", variants.TASK_MIXES)
# Four specialties the first embedded model (8 new tokens, character tokenizer) learnt to 10-50% held-out accuracy;
# their problem spaces (200 to 900 questions) are small enough to memorise.
MIXES.add("small-2026-11", (
    {"name": "chain_sum", "options": DEFAULT_TASK_OPTIONS},
    {"name": "basic_arithmetic", "options": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1,
                                             "operators": ["+", "-", "*"], "allow_parentheses": False,
                                             "allow_negation": False}},
    {"name": "gcd", "options": {"min_value": 1, "max_value": 30}},
    {"name": "count_bits", "options": {"min_n": 1, "max_n": 255}},
))
# The same four specialties over problem spaces of 30,603 to 2,936,400 questions: too many to memorise, and test
# splits of thousands of distinct questions each.
MIXES.add("reasoning-2026-11", (
    {"name": "chain_sum", "options": {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 2}},
    {"name": "basic_arithmetic", "options": {"min_terms": 2, "max_terms": 2, "min_digits": 2, "max_digits": 2,
                                             "operators": ["+", "-", "*"], "allow_parentheses": False,
                                             "allow_negation": False}},
    {"name": "gcd", "options": {"min_value": 1, "max_value": 1000}},
    {"name": "count_bits", "options": {"min_n": 1, "max_n": 65535}},
))
DEFAULT_MIX_NAME = "reasoning-2026-11"
# The default task: the mix a node draws when its config names no task.
DEFAULT_MIX: tuple[dict[str, Any], ...] = MIXES[DEFAULT_MIX_NAME]
# Procedural datasets generate entry i from (seed, i); the size only bounds the index.
DATASET_SIZE = 1_000_000


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


def resolve_options(name: str, options: dict[str, Any] | None) -> dict[str, Any]:
    """No options for the default task means the embedded defaults (small sums); other tasks use their own."""
    return dict(DEFAULT_TASK_OPTIONS if not options and name == DEFAULT_TASK else options or {})


def format_prompt(question: str) -> str:
    """The embedded model's prompt (`answer-line`, plain text): what `TaskInstance.prompt` holds."""
    return ANSWER_LINE.plain_prompt(question)


def parse_answer(completion_text: str) -> str:
    """The `answer-line` answer: the completion's first line, stripped."""
    return ANSWER_LINE.extract(completion_text)


def well_formed(token_ids: Sequence[int], text: str, eos_id: int | Collection[int],
                special_ids: Collection[int] = ()) -> bool:
    """Whether an `answer-line` completion is the answer alone, then EOS (formats.py): `token_ids` end with the
    only EOS, no id of `special_ids` precedes it, and `text` (decoded without EOS) is one stripped, printable,
    non-empty line."""
    return ANSWER_LINE.well_formed(token_ids, text, eos_id, special_ids)


def available_tasks() -> list[str]:
    from reasoning_gym.factory import DATASETS

    return sorted(DATASETS)


@lru_cache(maxsize=64)
def dataset(name: str, config: str, seed: int, size: int = DATASET_SIZE) -> Any:
    """The reasoning-gym dataset for (name, options, seed); unknown names and bad options are one-line errors."""
    if name not in available_tasks():
        raise UserError(f"unknown task {name!r}; see reasoning-gym's datasets, e.g. chain_sum, basic_arithmetic")
    import reasoning_gym

    try:
        return reasoning_gym.create_dataset(name, size=size, seed=seed, **json.loads(config))
    except (KeyError, ValueError) as exc:
        raise UserError(f"unknown task {name!r}: {exc}") from exc
    except (TypeError, AssertionError) as exc:
        raise UserError(f"bad options for task {name!r} ({config}): {exc}") from exc


# Cached: a training draw regenerates each instance to check the held-out partition, and the node, re-scoring and
# eval then ask for the same instance again. Instances are read-only.
@lru_cache(maxsize=4096)
def instance(ref: TaskRef, size: int = DATASET_SIZE) -> TaskInstance:
    entry = dataset(ref.dataset, ref.config, ref.seed, size)[ref.index]
    return TaskInstance(ref, entry["question"], str(entry["answer"]), format_prompt(entry["question"]), entry)


def score(inst: TaskInstance, completion_text: str, fmt: PromptFormat = ANSWER_LINE, size: int = DATASET_SIZE) -> float:
    """Reward from reasoning-gym's own verifier on the answer `fmt` extracts, and nothing else of the completion (in
    [0, 1] for well-behaved datasets; callers check finiteness)."""
    data = dataset(inst.ref.dataset, inst.ref.config, inst.ref.seed, size)
    return float(data.score_answer(fmt.extract(completion_text), inst.entry))
