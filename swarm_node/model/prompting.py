"""A prompt format bound to a tokenizer (`Prompter`): the prompt ids every node builds for a task instance, with
the model's chat template where the format uses one.

Contract:
- `build_prompter(name, tokenizer, budget)`: `name` "" is the model's own format (`default_format`: think-answer
  when the tokenizer has a chat template, answer-line otherwise, as for the embedded model). A format whose
  shortest well-formed completion does not fit `budget` (ids, EOS included) is a one-line `UserError` naming the
  smallest budget that works; a chat template that fails to render is one naming its file.
- The chat template is rendered with `date_string` pinned (`PINNED_DATE`: Llama-3.1/3.2 templates print today's
  date otherwise), so a task reference's prompt is the same on every peer and every day; its text is tokenized
  without added special tokens (the template writes its own BOS). A template that opens the format's first tag at
  the end of the prompt (Qwen3, R1-distilled: "<think>\\n") sets the bound format's `opened`: the completion then
  starts inside it.
- Without a chat template (or for answer-line) the prompt is the format's plain text, tokenized as the tokenizer
  does by default (answer-line: exactly `tokenizer.encode(instance.prompt)`, the embedded model's prompt).
- `ids(inst)`: the same ids for the same (format, tokenizer, instance) on every node; cached per question.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path

from transformers import PreTrainedTokenizerBase

from swarm_node import tasks
from swarm_node.errors import UserError

PINNED_DATE = "26 Jul 2024"  # Llama 3.1's own default date_string
PROBE_QUESTION = "What is 1 + 1?"  # rendered once at start: a template that fails, fails here


def has_chat_template(tokenizer: PreTrainedTokenizerBase) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def default_format(tokenizer: PreTrainedTokenizerBase) -> str:
    """The model's own format: think-answer with a chat template, answer-line without (the embedded model)."""
    return "think-answer" if has_chat_template(tokenizer) else "answer-line"


def template_file(tokenizer: PreTrainedTokenizerBase) -> str:
    """The file a tokenizer's chat template comes from, for error lines."""
    where = Path(str(getattr(tokenizer, "name_or_path", "") or "."))
    jinja = where / "chat_template.jinja"
    return str(jinja if jinja.exists() else where / "tokenizer_config.json")


def render_chat(tokenizer: PreTrainedTokenizerBase, fmt: tasks.PromptFormat, question: str) -> str:
    """The prompt text of the model's chat template: the format's system message, the question, the assistant's
    turn opened; `date_string` pinned."""
    messages = [{"role": "system", "content": fmt.system}] if fmt.system else []
    messages.append({"role": "user", "content": fmt.user_text(question)})
    try:
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                             date_string=PINNED_DATE)
    except Exception as exc:  # jinja raises its own types (TemplateError, UndefinedError, TypeError...)
        detail = " ".join(str(exc).split()) or type(exc).__name__
        raise UserError(f"the chat template in {template_file(tokenizer)} fails to render: {detail}") from exc
    if not isinstance(text, str):
        raise UserError(f"the chat template in {template_file(tokenizer)} renders {type(text).__name__}, not text")
    return text


@dataclass(frozen=True)
class Prompter:
    """A format bound to a tokenizer: prompt text and ids, the format the completions are read with."""

    fmt: tasks.PromptFormat  # bound: `opened` set from the chat template
    tokenizer: PreTrainedTokenizerBase = field(repr=False)  # compared (and hashed) by identity
    chat: bool  # the prompt is the chat template's

    @property
    def name(self) -> str:
        return self.fmt.name

    def text(self, question: str) -> str:
        """The prompt text of a question (answer-line: `TaskInstance.prompt`)."""
        return render_chat(self.tokenizer, self.fmt, question) if self.chat else self.fmt.plain_prompt(question)

    def ids(self, inst: tasks.TaskInstance) -> list[int]:
        return list(_cached_ids(self, inst.question))

    def smallest_budget(self) -> int:
        """Ids of the format's shortest well-formed completion with this tokenizer, plus one EOS."""
        return len(self.tokenizer.encode(self.fmt.smallest_completion(), add_special_tokens=False)) + 1


@lru_cache(maxsize=4096)
def _cached_ids(prompter: Prompter, question: str) -> tuple[int, ...]:
    text = prompter.text(question)
    if prompter.chat:  # the template wrote its own special tokens (a BOS among them)
        return tuple(prompter.tokenizer.encode(text, add_special_tokens=False))
    return tuple(prompter.tokenizer.encode(text))


def plain_prompter(tokenizer: PreTrainedTokenizerBase) -> Prompter:
    """answer-line over `tokenizer`: today's prompt ids (`tokenizer.encode(inst.prompt)`)."""
    return Prompter(tasks.ANSWER_LINE, tokenizer, chat=False)


def build_prompter(name: str, tokenizer: PreTrainedTokenizerBase, budget: int | None = None) -> Prompter:
    """The node's prompter for format `name` ("": the model's own); see the module contract for its errors."""
    chosen = name or default_format(tokenizer)
    fmt = tasks.PROMPT_FORMATS[chosen]
    chat = fmt.uses_chat_template and has_chat_template(tokenizer)
    if chat:
        probe = render_chat(tokenizer, fmt, PROBE_QUESTION)
        end = len(probe.rstrip())
        if fmt.opening_tag and probe[:end].endswith(fmt.opening_tag):
            fmt = replace(fmt, opened=probe[end - len(fmt.opening_tag):])  # the tag and the whitespace after it
    prompter = Prompter(fmt, tokenizer, chat)
    needed = prompter.smallest_budget()
    if budget is not None and budget < needed:
        raise UserError(f"prompt format {chosen!r} needs a generation budget of at least {needed} tokens (its "
                        f"shortest well-formed completion, EOS included), got --max-new-tokens {budget}")
    return prompter
