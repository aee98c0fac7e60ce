"""Prompt formats (issue 29 item 1): each format's well-formed shape, its answer extraction, and that the verifier
sees only the extracted answer; the chat template with the date pinned and a prompt-opened <think>; the smallest
budget and a broken template as one-line errors."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from swarm_node import tasks
from swarm_node.errors import UserError
from swarm_node.model.default_model import load_tokenizer
from swarm_node.model.prompting import PINNED_DATE, build_prompter, default_format, plain_prompter
from swarm_node.model.tokenizer import build_char_tokenizer
from swarm_node.train.scoring import score_group
from swarm_node.types import Completion

TOK = build_char_tokenizer()
EOS = TOK.eos_token_id
SPECIAL = frozenset(TOK.all_special_ids)
THINK = tasks.PROMPT_FORMATS["think-answer"]
BOXED = tasks.PROMPT_FORMATS["boxed"]
LINE = tasks.PROMPT_FORMATS["answer-line"]
GOOD = "<think>\n2 + 7 = 9\n</think>\n<answer>9</answer>"
# A Llama-3.1-like template: the system turn prints the date it is given (Llama's "Today Date: ...").
LLAMA_LIKE = ("{% for m in messages %}<|{{ m['role'] }}|>\n{% if m['role'] == 'system' %}Today Date: {{ date_string }}"
              "\n{% endif %}{{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
# A Qwen3/R1-distilled-like template: the assistant's turn opens <think> itself.
OPENS_THINK = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
               "{% if add_generation_prompt %}<|assistant|><think>\n{% endif %}")


def ids(text: str, eos: bool = True) -> list[int]:
    return TOK.encode(text) + ([EOS] if eos else [])


def chat_tokenizer(template: str) -> object:
    tok = build_char_tokenizer()
    tok.chat_template = template
    return tok


THINK_CASES = [
    ("the shape", ids(GOOD), GOOD, True),
    ("leading and trailing whitespace", ids("\n " + GOOD + "\n"), "\n " + GOOD + "\n", True),
    ("tags out of order", ids("<answer>9</answer>\n<think>x</think>"), "<answer>9</answer>\n<think>x</think>", False),
    ("no think", ids("<answer>9</answer>"), "<answer>9</answer>", False),
    ("answer not closed", ids("<think>x</think>\n<answer>9"), "<think>x</think>\n<answer>9", False),
    ("empty answer", ids("<think>x</think>\n<answer> </answer>"), "<think>x</think>\n<answer> </answer>", False),
    ("text after the answer", ids(GOOD + "\nmore"), GOOD + "\nmore", False),
    ("two answers", ids(GOOD + "<answer>9</answer>"), GOOD + "<answer>9</answer>", False),
    ("EOS missing", ids(GOOD, eos=False), GOOD, False),
    ("EOS early", TOK.encode("<think>x</think>") + [EOS] + ids("<answer>9</answer>"),
     "<think>x</think><answer>9</answer>", False),
    ("cut at the budget", TOK.encode(GOOD[:20]), GOOD[:20], False),
]


@pytest.mark.parametrize(("name", "token_ids", "text", "ok"), THINK_CASES)
def test_think_answer_well_formed(name: str, token_ids: list[int], text: str, ok: bool) -> None:
    assert THINK.well_formed(token_ids, text, EOS, SPECIAL) is ok, name


def test_think_answer_with_the_prompt_opening_think() -> None:
    opened = replace(THINK, opened="<think>\n")
    body = GOOD.removeprefix("<think>\n")
    assert opened.well_formed(ids(body), body, EOS, SPECIAL)
    assert not opened.well_formed(ids(GOOD), GOOD, EOS, SPECIAL)  # opened twice
    assert opened.extract(body) == "9"
    assert opened.smallest_completion() == "\n</think>\n<answer>X</answer>"


def test_boxed_and_answer_line_well_formed() -> None:
    for text, ok in [("2 + 7 = \\boxed{9}", True), ("\\boxed{\\frac{1}{2}}\n", True), ("\\boxed{9}.", False),
                     ("\\boxed{ }", False), ("9", False), ("\\boxed{9", False)]:
        assert BOXED.well_formed(ids(text), text, EOS, SPECIAL) is ok, text
    assert not BOXED.well_formed(TOK.encode("\\boxed{9}"), "\\boxed{9}", EOS, SPECIAL)  # no EOS
    assert LINE.well_formed(ids("9"), "9", EOS, SPECIAL) and not LINE.well_formed(ids("9\n"), "9\n", EOS, SPECIAL)


def test_answer_extraction() -> None:
    assert THINK.extract("<think>x</think>\n<answer> 9 </answer>") == "9"
    assert THINK.extract("<think>x</think>\n<answer>1\n2</answer>") == "1\n2"
    assert THINK.extract("<think>x</think>\n9") == ""
    assert THINK.extract("<answer>1</answer><answer>2</answer>") == ""
    assert BOXED.extract("so \\boxed{\\frac{1}{2}} is it") == "\\frac{1}{2}"
    assert BOXED.extract("\\boxed{1} or \\boxed{ 2 }") == "2"
    assert BOXED.extract("\\boxed{1} or \\boxed{2") == "1"  # the last one whose braces balance
    assert BOXED.extract("no box") == ""
    assert LINE.extract(" -37\nmore") == "-37"


def test_smallest_completions() -> None:
    assert THINK.smallest_completion() == "<think>\n\n</think>\n<answer>X</answer>"
    assert BOXED.smallest_completion() == "\\boxed{X}" and LINE.smallest_completion() == "X"


def two_plus_seven() -> tasks.TaskInstance:
    source = tasks.TaskSource()
    for index in range(400):
        inst = tasks.instance(tasks.TaskRef(source.name, source.config, source.seed, index))
        if inst.question.startswith("State the final answer to the following arithmetic problem: 2 + 7 ="):
            return inst
    raise AssertionError("no 2 + 7 in the first 400 problems")


def test_the_verifier_sees_only_the_extracted_answer() -> None:
    inst = two_plus_seven()
    assert inst.answer == "9"
    texts = ["<think>\n2 + 7\n</think>\n<answer>9</answer>", "<think>\n9\n</think>\n<answer>8</answer>",
             "9"]
    comps = [Completion(ids(t), t, [-0.5] * len(ids(t)), 0) for t in texts]
    group = score_group(inst, [5], comps, tasks.TaskSource().reward, eos_id=EOS, special_ids=SPECIAL, fmt=THINK)
    assert group.rewards == (1.0, 0.0, 0.0) and group.correct == (True, False, False)
    assert tasks.score(inst, texts[0], THINK) == 1.0
    assert tasks.score(inst, texts[0]) == 0.0  # answer-line reads the first line, "<think>"
    assert tasks.score(inst, "\\boxed{9}", BOXED) == 1.0


def test_plain_prompts_without_a_chat_template() -> None:
    inst = two_plus_seven()
    assert default_format(TOK) == "answer-line"
    line = build_prompter("", TOK, 8)
    assert line.name == "answer-line" and not line.chat
    assert line.ids(inst) == TOK.encode(inst.prompt) == plain_prompter(TOK).ids(inst)  # today's prompt ids
    think = build_prompter("think-answer", TOK, 40)
    assert think.text(inst.question) == tasks.THINK_ANSWER_SYSTEM + "\n\n" + inst.question + "\n"


def test_chat_template_with_the_date_pinned() -> None:
    tok = chat_tokenizer(LLAMA_LIKE)
    assert default_format(tok) == "think-answer"
    prompter = build_prompter("", tok, 40)
    assert prompter.name == "think-answer" and prompter.chat and prompter.fmt.opened == ""
    assert PINNED_DATE == "26 Jul 2024"
    assert prompter.text("What is 2 + 7?") == (
        f"<|system|>\nToday Date: 26 Jul 2024\n{tasks.THINK_ANSWER_SYSTEM}\n<|user|>\nWhat is 2 + 7?\n<|assistant|>\n")
    inst = two_plus_seven()
    assert prompter.ids(inst) == tok.encode(prompter.text(inst.question), add_special_tokens=False)
    assert build_prompter("answer-line", tok, 8).ids(inst) == tok.encode(inst.prompt)  # answer-line: never a template


def test_a_template_that_opens_think() -> None:
    prompter = build_prompter("think-answer", chat_tokenizer(OPENS_THINK), 40)
    assert prompter.fmt.opened == "<think>\n"
    body = "2 + 7\n</think>\n<answer>9</answer>"
    assert prompter.fmt.well_formed(ids(body), body, EOS, SPECIAL)
    # the smallest budget counts the completion after the prompt's <think>: "\n</think>\n<answer>X</answer>" + EOS
    assert prompter.smallest_budget() == 29


def test_a_budget_too_small_for_the_format_is_one_line_naming_the_smallest() -> None:
    # "<think>\n\n</think>\n<answer>X</answer>": 36 characters, one token each, + EOS
    assert build_prompter("think-answer", TOK, 37).smallest_budget() == 37
    with pytest.raises(UserError) as err:
        build_prompter("think-answer", TOK, 36)
    assert str(err.value) == ("prompt format 'think-answer' needs a generation budget of at least 37 tokens (its "
                              "shortest well-formed completion, EOS included), got --max-new-tokens 36")
    with pytest.raises(UserError, match="at least 2 tokens"):
        build_prompter("answer-line", TOK, 1)


def test_a_template_that_fails_to_render_is_one_line_naming_the_file(tmp_path: Path) -> None:
    tok = chat_tokenizer("{% for m in messages %}{{ m['content'] }{% endfor %}")  # a brace short
    tok.save_pretrained(tmp_path)
    with pytest.raises(UserError) as err:
        build_prompter("", load_tokenizer(tmp_path), 40)
    line = str(err.value)
    assert line.startswith(f"the chat template in {tmp_path}/") and " fails to render: " in line
    assert "\n" not in line
