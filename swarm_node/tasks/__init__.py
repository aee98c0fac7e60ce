"""Tasks from reasoning-gym: references, regeneration, scoring, task mixes and the held-out partition. Pure: imports
only `swarm_node.variants`, `swarm_node.errors`, reasoning-gym and the standard library.

Files:
- `reference.py`: `TaskRef` (dataset, options, seed, index) and `TaskInstance`, regenerated with `instance(ref)`;
  the embedded model's prompt and answer parsing (answer-line), `score` with the dataset's own verifier on the answer
  a format extracts, `well_formed` (answer-line's: the answer alone, then EOS; anything else earns reward 0); the
  single-task default, and the embedded task mixes by name (`MIXES`; `DEFAULT_MIX` is `MIXES[DEFAULT_MIX_NAME]`).
- `formats.py`: `PROMPT_FORMATS` (answer-line, think-answer, boxed): each format's prompt text, answer extraction
  and well-formed shape (`PromptFormat`).
- `rewards.py`: `REWARD_TERMS` (format_bonus, length_penalty) added to a well-formed completion's correctness
  (`RewardTerms`).
- `source.py`: `TaskSource` over a mix of specialties (`Specialty`, `parse_specialties`): training draws, the
  held-out eval draws (per split), what peers may send (`allows`), the training reward (`REWARD_MODES`).
- `selection.py`: `TASK_SELECTIONS` (uniform, weighted, balanced, adaptive): which specialty and index each prompt
  gets.
- `pass_rates.py`: `PassRateBook`: pass-rate estimates per family and instance, a peer's share bounded.
- `allocation.py`: `ROLLOUT_ALLOCATIONS` (fixed, dars): how many completions each prompt of a step gets.
- `traces.py`: verified step-by-step traces per specialty in named styles (`TRACE_STYLES`: per-operation,
  digit-columns), the think-answer completion.
- `column_traces.py`: the digit-by-digit lines of the digit-columns style (column arithmetic, halving).
- `heldout.py`: the partition by a hash of the question text: `SPLITS` test (`EVAL_PERCENT`) and validation, never
  trained on (`is_heldout`); the rest trains.
- `eval_draw.py`: an eval's distinct questions of one split per specialty (a bounded search; `SplitTooSmall`).

Everything public is re-exported here: `from swarm_node import tasks; tasks.TaskSource(...)`.
"""

from __future__ import annotations

from swarm_node.tasks.allocation import ROLLOUT_ALLOCATIONS, RolloutAllocation
from swarm_node.tasks.eval_draw import GIVE_UP_RUN, SplitTooSmall
from swarm_node.tasks.formats import (
    ANSWER_LINE,
    ANSWER_PREFIX,
    BOXED_SYSTEM,
    PROMPT_FORMATS,
    THINK_ANSWER_SYSTEM,
    PromptFormat,
)
from swarm_node.tasks.heldout import (
    DEFAULT_SPLIT,
    EVAL_PERCENT,
    HELDOUT_BUCKETS,
    SPLITS,
    bucket,
    in_split,
    is_heldout,
    is_heldout_question,
)
from swarm_node.tasks.pass_rates import OWN, PassRateBook, PassRateParams
from swarm_node.tasks.reference import (
    DATASET_SIZE,
    DEFAULT_MIX,
    DEFAULT_MIX_NAME,
    DEFAULT_TASK,
    DEFAULT_TASK_OPTIONS,
    MIXES,
    TaskInstance,
    TaskRef,
    available_tasks,
    canonical_config,
    dataset,
    format_prompt,
    instance,
    parse_answer,
    resolve_options,
    score,
    well_formed,
)
from swarm_node.tasks.rewards import NO_TERMS, REWARD_TERMS, RewardTerms
from swarm_node.tasks.selection import TASK_SELECTIONS, TaskSelection
from swarm_node.tasks.source import EVAL_SEED_OFFSET, REWARD_MODES, Specialty, TaskSource, parse_specialties

__all__ = [
    "ANSWER_LINE", "BOXED_SYSTEM", "NO_TERMS", "PROMPT_FORMATS", "REWARD_TERMS", "THINK_ANSWER_SYSTEM", "PromptFormat",
    "RewardTerms",
    "ANSWER_PREFIX", "DATASET_SIZE", "DEFAULT_MIX", "DEFAULT_TASK", "DEFAULT_TASK_OPTIONS", "EVAL_PERCENT",
    "EVAL_SEED_OFFSET", "OWN", "REWARD_MODES", "ROLLOUT_ALLOCATIONS", "TASK_SELECTIONS", "PassRateBook",
    "PassRateParams", "RolloutAllocation", "Specialty", "TaskInstance", "TaskRef", "TaskSelection", "TaskSource",
    "available_tasks", "bucket", "canonical_config", "dataset", "format_prompt", "instance", "is_heldout",
    "is_heldout_question", "parse_answer", "parse_specialties", "resolve_options", "score", "well_formed",
    "DEFAULT_MIX_NAME", "DEFAULT_SPLIT", "GIVE_UP_RUN", "HELDOUT_BUCKETS", "MIXES", "SPLITS", "SplitTooSmall",
    "in_split",
]
