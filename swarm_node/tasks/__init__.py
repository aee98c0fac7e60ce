"""Tasks from reasoning-gym: references, regeneration, scoring, task mixes and the held-out partition. Pure: imports
only `swarm_node.variants`, `swarm_node.errors`, reasoning-gym and the standard library.

Files:
- `reference.py`: `TaskRef` (dataset, options, seed, index) and `TaskInstance`, regenerated with `instance(ref)`;
  prompt format, answer parsing, `score` with the dataset's own verifier, `well_formed` (the answer alone, then
  EOS: anything else earns reward 0); the default task.
- `source.py`: `TaskSource` over a mix of specialties (`Specialty`, `parse_specialties`): training draws, the
  held-out eval stream, what peers may send (`allows`), the training reward (`REWARD_MODES`).
- `selection.py`: `TASK_SELECTIONS` (uniform, weighted, balanced): which specialty and index each prompt gets.
- `traces.py`: verified step-by-step traces per specialty (`TRACE_GENERATORS`), the think-answer completion.
- `heldout.py`: the train/eval partition by a hash of the question text (`EVAL_PERCENT` held out).

Everything public is re-exported here: `from swarm_node import tasks; tasks.TaskSource(...)`.
"""

from __future__ import annotations

from swarm_node.tasks.heldout import EVAL_PERCENT, bucket, is_heldout, is_heldout_question
from swarm_node.tasks.reference import (
    ANSWER_PREFIX,
    DATASET_SIZE,
    DEFAULT_MIX,
    DEFAULT_TASK,
    DEFAULT_TASK_OPTIONS,
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
from swarm_node.tasks.selection import TASK_SELECTIONS, TaskSelection
from swarm_node.tasks.source import EVAL_SEED_OFFSET, REWARD_MODES, Specialty, TaskSource, parse_specialties

__all__ = [
    "ANSWER_PREFIX", "DATASET_SIZE", "DEFAULT_MIX", "DEFAULT_TASK", "DEFAULT_TASK_OPTIONS", "EVAL_PERCENT",
    "EVAL_SEED_OFFSET", "REWARD_MODES", "TASK_SELECTIONS", "Specialty", "TaskInstance", "TaskRef", "TaskSelection",
    "TaskSource",
    "available_tasks", "bucket", "canonical_config", "dataset", "format_prompt", "instance", "is_heldout",
    "is_heldout_question", "parse_answer", "parse_specialties", "resolve_options", "score", "well_formed",
]
