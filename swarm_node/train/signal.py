"""Saying when nothing is learnt: a run whose groups carry no training signal, and the likely cause.

GRPO learns only from groups whose rewards differ. When no local group has had signal for `after_steps` steps, the
node says so once, with the cause measured from its own completions and the fix (a user with a model that never
answers in our format otherwise watches reward 0.000 forever). Causes, by which most completions were:
- "cut": stopped by the generation budget (no EOS within `max_new_tokens`): raise --max-new-tokens;
- "malformed": ended but not in the prompt format (its `well_formed`): another prompt format or model;
- "all_wrong": well-formed and wrong in every group: an easier task or a stronger model;
- "all_right": right in every group: a harder task.
Contract: `SignalWatch(after_steps, max_new_tokens, eos_id, special_ids, fmt)`; `observe(groups)` once per step returns
a `NoSignal` report the first time the streak reaches `after_steps` (None otherwise; a step with signal ends the
streak and allows a later report). Pure: the caller logs the line and shows the report on the status API.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from swarm_node import tasks
from swarm_node.types import ScoredGroup

AFTER_STEPS = 20  # steps without a group with signal before the node says so
FIXES = {
    "cut": "most completions hit the generation budget ({max_new_tokens} tokens) before EOS: raise --max-new-tokens",
    "malformed": "most completions end without the answer in the expected format: use a prompt format the model "
                 "follows, or a model taught it",
    "all_wrong": "every group is all wrong: choose an easier task (--task, --task-option) or a stronger model",
    "all_right": "every group is all right: choose a harder task (--task, --task-option)",
}


@dataclass(frozen=True)
class NoSignal:
    steps: int  # steps in a row without a group with signal
    cause: str  # a key of FIXES
    counts: tuple[tuple[str, int], ...]  # completions (cut, malformed) and groups (all_wrong, all_right) seen

    def line(self, max_new_tokens: int) -> str:
        return (f"no training signal for {self.steps} steps (every group's rewards were equal, so nothing is "
                f"learnt): {FIXES[self.cause].format(max_new_tokens=max_new_tokens)}")

    def status(self, max_new_tokens: int) -> dict[str, object]:
        return {"steps": self.steps, "cause": self.cause, "counts": dict(self.counts),
                "message": self.line(max_new_tokens)}


class SignalWatch:
    def __init__(self, after_steps: int, max_new_tokens: int, eos_id: int | Collection[int],
                 special_ids: Collection[int] = (), fmt: tasks.PromptFormat = tasks.ANSWER_LINE) -> None:
        if after_steps < 1:
            raise ValueError("after_steps must be >= 1")
        self.after_steps = after_steps
        self.max_new_tokens = max_new_tokens
        self.eos_ids = frozenset({eos_id} if isinstance(eos_id, int) else eos_id)
        self.special_ids = frozenset(special_ids)
        self.fmt = fmt
        self.streak = 0
        self.seen: Counter[str] = Counter()
        self.completions = 0
        self.said = False

    def observe(self, groups: Sequence[ScoredGroup]) -> NoSignal | None:
        if any(g.has_signal for g in groups):
            self.streak, self.seen, self.completions, self.said = 0, Counter(), 0, False
            return None
        self.streak += 1
        for g in groups:
            self.completions += len(g.completions)
            for c in g.completions:
                if len(c.token_ids) >= self.max_new_tokens and (not c.token_ids or c.token_ids[-1] not in self.eos_ids):
                    self.seen["cut"] += 1
                elif not self.fmt.well_formed(c.token_ids, c.text, self.eos_ids, self.special_ids):
                    self.seen["malformed"] += 1
            right = g.correct or tuple(r >= 1.0 for r in g.rewards)  # reward terms move rewards off 0 and 1
            if right and all(right):
                self.seen["all_right"] += 1
            elif right and not any(right):
                self.seen["all_wrong"] += 1
        if self.said or self.streak < self.after_steps:
            return None
        self.said = True
        return NoSignal(self.streak, self.cause(), tuple(sorted(self.seen.items())))

    def cause(self) -> str:
        cut, malformed = self.seen["cut"], self.seen["malformed"]
        if 2 * (cut + malformed) >= self.completions:  # most completions are no answer at all
            return "cut" if cut >= malformed else "malformed"
        return "all_right" if self.seen["all_right"] > self.seen["all_wrong"] else "all_wrong"
