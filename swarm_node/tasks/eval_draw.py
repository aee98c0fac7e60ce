"""Evaluation draws: distinct questions of one held-out split of one specialty, found by a bounded search.

Contract:
- A specialty's eval stream for a split is the indices 0, 1, 2, ... of its dataset at seed + `EVAL_SEED_OFFSET`
  (a seed no training stream uses) whose question is in the split (`heldout.in_split`) and has not appeared
  earlier in the stream: every question at most once, in a deterministic order, so an eval of N problems is a
  prefix of an eval of N + 1, and two evals of the same size ask the same questions.
- The search grows a stream on demand and stops as soon as it has the questions asked for. It gives up when
  `GIVE_UP_RUN` consecutive indices bring no new question of the split (the split is taken as exhausted: a
  question it still lacks turns up less than about once in that many indices) or at the dataset's size; then
  `SplitTooSmall` says how many distinct questions the split has and how many the eval asked for.
- Generation goes straight to the dataset, not through `reference.instance`'s cache, so an eval of thousands of
  problems does not push the training draws' instances out of it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from swarm_node.errors import UserError
from swarm_node.tasks.heldout import in_split
from swarm_node.tasks.reference import TaskRef, dataset

# Held-out evaluation draws from a seed the training stream never uses (and only questions of the split).
EVAL_SEED_OFFSET = 1_000_003
# Consecutive indices without a new question of the split after which the search gives up (bounds a small space's
# search: about 10,000 generations, well under a second).
GIVE_UP_RUN = 10_000


class SplitTooSmall(UserError):
    """A mix entry's split has fewer distinct questions than an eval asks of it: one line naming the entry."""


def describe_options(config: str) -> str:
    """Canonical options as the error names them: `{max_value: 30}`."""
    return "{" + ", ".join(f"{key}: {json.dumps(value)}" for key, value in json.loads(config).items()) + "}"


@dataclass
class SplitStream:
    """The distinct questions of one split of one specialty found so far, in stream order."""

    name: str
    config: str
    split: str
    seed: int  # the eval seed: the source's seed + EVAL_SEED_OFFSET
    size: int  # indices are below the dataset's size
    refs: list[TaskRef] = field(default_factory=list)
    questions: set[str] = field(default_factory=set)
    next_index: int = 0
    since_new: int = 0  # indices scanned since the last new question of the split
    exhausted: bool = False

    def take(self, count: int) -> list[TaskRef]:
        """The first `count` distinct questions of the stream; `SplitTooSmall` when the split has fewer."""
        data = dataset(self.name, self.config, self.seed, self.size)
        while len(self.refs) < count and not self.exhausted:
            index = self.next_index
            self.next_index += 1
            question = data[index]["question"]
            if question not in self.questions and in_split(self.split, self.name, question):
                self.questions.add(question)
                self.refs.append(TaskRef(self.name, self.config, self.seed, index))
                self.since_new = 0
            else:
                self.since_new += 1
            self.exhausted = self.since_new >= GIVE_UP_RUN or self.next_index >= self.size
        if len(self.refs) < count:
            raise SplitTooSmall(
                f"task mix entry {self.name} {describe_options(self.config)}: its {self.split} split has "
                f"{len(self.refs):,} distinct questions, fewer than the {count:,} the eval asks for; enlarge its "
                f"options or lower --eval-problems")
        return self.refs[:count]
