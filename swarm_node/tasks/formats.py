"""Prompt formats (`PROMPT_FORMATS`): how a prompt asks for the answer, how the answer is extracted from a
completion, and what a well-formed completion is. Pure: text and token ids only; applying a tokenizer's chat
template is `swarm_node.model.prompting`'s, which calls the pieces here.

Contract:
- `PromptFormat.plain_prompt(question)`: the prompt as plain text (no chat template); `system` and `user_text`
  are the messages of a chat template (`uses_chat_template` False: the format never uses one).
- `extract(text)`: the answer the verifier sees, and nothing else of the completion ("" when there is none).
- `well_formed(ids, text, eos, special)`: the ids end with exactly one EOS (any of the model's EOS ids; none earlier,
  so a completion cut at the budget is not well-formed), no other special id precedes it, and the text (decoded
  without EOS) has the format's shape with a non-empty answer and nothing after the answer but whitespace (for
  answer-line: no whitespace at all, one printable line).
- `opened`: what the prompt itself already opened (a Qwen3 or R1-distilled template ends its prompt with
  "<think>\\n"): the completion is read as `opened + text`, so it must not open it again.
- `smallest_completion()`: the text of the shortest well-formed completion (answer "X"); with one EOS, its tokens
  are the smallest budget the format works with.

Formats:
- `answer-line`: the question, then "\\nAnswer: "; the answer alone on one line (the embedded model's format).
- `think-answer`: `THINK_ANSWER_SYSTEM`, then `<think>\\n{reasoning}\\n</think>\\n<answer>{answer}</answer>`: each
  tag once and in order, only whitespace before `<think>` and after `</answer>`; the answer is the stripped text
  inside the one `<answer>...</answer>` pair.
- `boxed`: `BOXED_SYSTEM`; the answer is the content of the last `\\boxed{...}` with balanced braces, and nothing
  but whitespace follows it.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from swarm_node import variants

ANSWER_PREFIX = "\nAnswer: "
THINK_ANSWER_SYSTEM = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant solves it. The Assistant "
    "first thinks about the reasoning process step by step and then provides the answer. The reasoning process and "
    "answer are enclosed within <think> </think> and <answer> </answer> tags, respectively.")
BOXED_SYSTEM = "Please reason step by step, and put your final answer within \\boxed{}."
THINK_TAGS = ("<think>", "</think>", "<answer>", "</answer>")
BOXED_OPEN = "\\boxed{"
PLACEHOLDER_ANSWER = "X"  # the answer of `smallest_completion`: one token in any tokenizer we know


@dataclass(frozen=True)
class PromptFormat:
    """The base: a format's prompt pieces, answer extraction and shape (subclasses, one per registered name)."""

    name: str = ""
    system: str = ""  # the system message of a chat template ("" : none)
    uses_chat_template: bool = True
    opening_tag: str = ""  # a tag a chat template may open at the end of the prompt ("": none)
    opened: str = ""  # what the prompt opened (module docstring); set by `model.prompting`

    def user_text(self, question: str) -> str:
        return question.strip()

    def plain_prompt(self, question: str) -> str:
        """Without a chat template: the system text, a blank line, the question, then a newline."""
        return f"{self.system}\n\n{self.user_text(question)}\n"

    def extract(self, text: str) -> str:
        """The answer the verifier sees ("" when the completion has none)."""
        raise NotImplementedError

    def text_well_formed(self, text: str) -> bool:
        """Whether the whole text (`opened` + completion) has the format's shape; see `well_formed`."""
        raise NotImplementedError

    def full_smallest(self) -> str:
        """The shortest well-formed text, with nothing opened by the prompt (answer `PLACEHOLDER_ANSWER`)."""
        raise NotImplementedError

    def smallest_completion(self) -> str:
        """The shortest well-formed completion text, after what the prompt opened."""
        full = self.full_smallest()
        if not self.opened:
            return full
        return full.removeprefix(self.opened) if full.startswith(self.opened) else full.removeprefix(self.opening_tag)

    def well_formed(self, token_ids: Sequence[int], text: str, eos_id: int | Collection[int],
                    special_ids: Collection[int] = ()) -> bool:
        eos = {eos_id} if isinstance(eos_id, int) else set(eos_id)  # any of the model's EOS ids ends a completion
        if len(token_ids) < 2 or token_ids[-1] not in eos:
            return False
        body = token_ids[:-1]
        if any(t in eos for t in body) or (special_ids and any(t in special_ids for t in body)):
            return False
        return self.text_well_formed(self.opened + text)


@dataclass(frozen=True)
class AnswerLine(PromptFormat):
    name: str = "answer-line"
    uses_chat_template: bool = False

    def plain_prompt(self, question: str) -> str:
        return question.strip() + ANSWER_PREFIX

    def extract(self, text: str) -> str:
        return text.split("\n", 1)[0].strip()

    def text_well_formed(self, text: str) -> bool:
        return bool(text) and text == text.strip() and text.isprintable()

    def full_smallest(self) -> str:
        return PLACEHOLDER_ANSWER


def _tag_spans(text: str) -> list[int] | None:
    """Where each think-answer tag starts, when each occurs exactly once and in order; else None."""
    if any(text.count(tag) != 1 for tag in THINK_TAGS):
        return None
    starts = [text.index(tag) for tag in THINK_TAGS]
    return starts if starts == sorted(starts) else None


@dataclass(frozen=True)
class ThinkAnswer(PromptFormat):
    name: str = "think-answer"
    system: str = THINK_ANSWER_SYSTEM
    opening_tag: str = "<think>"

    def extract(self, text: str) -> str:
        full = self.opened + text
        if full.count("<answer>") != 1 or full.count("</answer>") != 1:
            return ""
        start, end = full.index("<answer>") + len("<answer>"), full.index("</answer>")
        return full[start:end].strip() if start <= end else ""

    def text_well_formed(self, text: str) -> bool:
        starts = _tag_spans(text)
        if starts is None:
            return False
        answer_end = starts[3] + len("</answer>")
        return (not text[:starts[0]].strip() and not text[answer_end:].strip()
                and bool(text[starts[2] + len("<answer>"):starts[3]].strip()))

    def full_smallest(self) -> str:
        return f"<think>\n\n</think>\n<answer>{PLACEHOLDER_ANSWER}</answer>"


def last_boxed(text: str) -> tuple[str, int] | None:
    """The content of the last `\\boxed{...}` whose braces balance, and where it ends (after its `}`); None if none."""
    start = text.rfind(BOXED_OPEN)
    while start >= 0:
        depth, i = 1, start + len(BOXED_OPEN)
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            return text[start + len(BOXED_OPEN):i - 1], i
        start = text.rfind(BOXED_OPEN, 0, start)
    return None


@dataclass(frozen=True)
class Boxed(PromptFormat):
    name: str = "boxed"
    system: str = BOXED_SYSTEM

    def extract(self, text: str) -> str:
        found = last_boxed(self.opened + text)
        return found[0].strip() if found else ""

    def text_well_formed(self, text: str) -> bool:
        found = last_boxed(text)
        return found is not None and bool(found[0].strip()) and not text[found[1]:].strip()

    def full_smallest(self) -> str:
        return BOXED_OPEN + PLACEHOLDER_ANSWER + "}"


PROMPT_FORMATS: variants.Registry[PromptFormat] = variants.Registry("task.prompt_format", variants.PROMPT_FORMATS)
for _fmt in (AnswerLine(), ThinkAnswer(), Boxed()):
    PROMPT_FORMATS.add(_fmt.name, _fmt)
ANSWER_LINE = PROMPT_FORMATS["answer-line"]
