"""Trace generators of every trace style: exact steps on hand-computed examples, agreement with reasoning-gym's
verifier on thousands of problems per specialty, and a disagreeing generator is a build error naming the task and
index."""

from __future__ import annotations

from typing import Any

import pytest

from swarm_node import tasks, variants
from swarm_node.tasks import traces
from swarm_node.tasks.traces import TRACE_STYLES, Trace, TraceError


def fake_instance(dataset: str, metadata: dict[str, Any]) -> tasks.TaskInstance:
    ref = tasks.TaskRef(dataset, "{}", 0, 0)
    return tasks.TaskInstance(ref, "question", "unused", "prompt", {"metadata": metadata})


@pytest.mark.parametrize(("dataset", "metadata", "reasoning", "answer"), [
    ("chain_sum", {"expression": "967 + 921 - 882"}, "967 + 921 = 1888\n1888 - 882 = 1006", "1006"),
    ("chain_sum", {"expression": "7"}, "7 = 7", "7"),
    ("basic_arithmetic", {"expression": "2 - -3 * -8"}, "-3 * -8 = 24\n2 - 24 = -22", "-22"),
    ("basic_arithmetic", {"expression": "-( 4 + 5 ) * 2"}, "4 + 5 = 9\n-(9) = -9\n-9 * 2 = -18", "-18"),
    ("basic_arithmetic", {"expression": "-7 / 2 + 1"}, "-7 / 2 = -4\n-4 + 1 = -3", "-3"),  # floor division
    ("gcd", {"numbers": [15, 25]}, "25 % 15 = 10\n15 % 10 = 5\n10 % 5 = 0\ngcd = 5", "5"),
    ("gcd", {"numbers": [12, 18, 8]}, "18 % 12 = 6\n12 % 6 = 0\n8 % 6 = 2\n6 % 2 = 0\ngcd = 2", "2"),
    ("gcd", {"numbers": [3, 3]}, "3 % 3 = 0\ngcd = 3", "3"),
    ("count_bits", {"number": 35}, "35 in binary is 100011\n1 + 0 + 0 + 0 + 1 + 1 = 3", "3"),
    # the default mix's ranges: three 2-digit terms, 2-digit products, gcd up to 1,000, 16-bit numbers
    ("chain_sum", {"expression": "47 - 85 + 9"}, "47 - 85 = -38\n-38 + 9 = -29", "-29"),
    ("basic_arithmetic", {"expression": "100 * 99"}, "100 * 99 = 9900", "9900"),
    ("gcd", {"numbers": [610, 987]}, "987 % 610 = 377\n610 % 377 = 233\n377 % 233 = 144\n233 % 144 = 89\n"
     "144 % 89 = 55\n89 % 55 = 34\n55 % 34 = 21\n34 % 21 = 13\n21 % 13 = 8\n13 % 8 = 5\n8 % 5 = 3\n5 % 3 = 2\n"
     "3 % 2 = 1\n2 % 1 = 0\ngcd = 1", "1"),
    ("count_bits", {"number": 65535}, "65535 in binary is 1111111111111111\n" + " + ".join("1" * 16) + " = 16", "16"),
])
def test_trace_steps_by_hand(dataset: str, metadata: dict[str, Any], reasoning: str, answer: str) -> None:
    assert traces.TRACE_GENERATORS[dataset](fake_instance(dataset, metadata)) == Trace(reasoning, answer)


@pytest.mark.parametrize(("dataset", "metadata", "lines", "answer"), [
    ("chain_sum", {"expression": "45 + 37"}, ["45+37", "5+7+0=12;2", "4+3+1=8;82", "45+37=82"], "82"),
    ("chain_sum", {"expression": "95 + 37 - 88"}, [
        "95+37", "5+7+0=12;2", "9+3+1=13;32", "0+0+1=1;132", "95+37=132",
        "132-88", "12-8-0=4;4", "13-8-1=4;44", "1-0-1=0;044", "132-88=44"], "44"),
    ("chain_sum", {"expression": "29 + 37 - 88"}, [
        "29+37", "9+7+0=16;6", "2+3+1=6;66", "29+37=66",
        "66-88=-(88-66)", "8-6-0=2;2", "8-6-0=2;22", "66-88=-22"], "-22"),
    ("chain_sum", {"expression": "5 - 94 + 7"}, [
        "5-94=-(94-5)", "14-5-0=9;9", "9-0-1=8;89", "5-94=-89",
        "-89+7=-(89-7)", "9-7-0=2;2", "8-0-0=8;82", "-89+7=-82"], "-82"),
    ("chain_sum", {"expression": "7"}, ["7=7"], "7"),
    ("basic_arithmetic", {"expression": "47 * 86"}, [
        "47*86", "7*6+0=42;2", "4*6+4=28;82", "0*6+2=2;282", "7*8+0=56;6", "4*8+5=37;76", "0*8+3=3;376",
        "282+3760", "2+0+0=2;2", "8+6+0=14;42", "2+7+1=10;042", "0+3+1=4;4042", "47*86=4042"], "4042"),
    ("basic_arithmetic", {"expression": "2 - -3 * -8"}, [
        "-3*-8=3*8", "3*8+0=24;4", "0*8+2=2;24", "-3*-8=24",
        "2-24=-(24-2)", "4-2-0=2;2", "2-0-0=2;22", "2-24=-22"], "-22"),
    ("basic_arithmetic", {"expression": "-( 4 + 5 ) * 2"}, [
        "4+5", "4+5+0=9;9", "4+5=9", "-(9)=-9", "-9*2=-(9*2)", "9*2+0=18;8", "0*2+1=1;18", "-9*2=-18"], "-18"),
    ("basic_arithmetic", {"expression": "-7 / 2 + 1"}, [  # floor division: one line, no columns
        "-7/2=-4", "-4+1=-(4-1)", "4-1-0=3;3", "-4+1=-3"], "-3"),
    ("gcd", {"numbers": [15, 25]}, ["25 % 15 = 10", "15 % 10 = 5", "10 % 5 = 0", "gcd = 5"], "5"),
    ("count_bits", {"number": 53130}, [
        "53130 0 0", "26565 1 1", "13282 0 1", "6641 1 2", "3320 0 2", "1660 0 2", "830 0 2", "415 1 3",
        "207 1 4", "103 1 5", "51 1 6", "25 1 7", "12 0 7", "6 0 7", "3 1 8", "1 1 9"], "9"),
    ("count_bits", {"number": 1}, ["1 1 1"], "1"),
])
def test_digit_column_steps_by_hand(dataset: str, metadata: dict[str, Any], lines: list[str], answer: str) -> None:
    trace = TRACE_STYLES["digit-columns"][dataset](fake_instance(dataset, metadata))
    assert trace == Trace("\n".join(lines), answer)


def test_the_per_operation_style_is_the_default_and_unknown_styles_are_named() -> None:
    assert traces.DEFAULT_TRACE_STYLE == "per-operation"
    assert TRACE_STYLES["per-operation"] is traces.TRACE_GENERATORS
    inst = tasks.instance(tasks.TaskRef("gcd", tasks.canonical_config(tasks.MIXES["small-2026-11"][2]["options"]),
                                        1, 0))
    assert traces.think_answer_completion(inst) == traces.think_answer_completion(inst, "per-operation")
    with pytest.raises(variants.UnknownVariant, match="trace style 'nope'"):
        traces.checked_trace(inst, "nope")


def test_think_answer_completion_text() -> None:
    small_gcd = tasks.MIXES["small-2026-11"][2]["options"]  # the first default mix: values 1-30
    inst = tasks.instance(tasks.TaskRef("gcd", tasks.canonical_config(small_gcd), 1, 0))
    assert inst.question.startswith("Find the Greatest Common Divisor (GCD) of these numbers: 25, 15.")
    assert traces.think_answer_completion(inst) == (
        "<think>\n25 % 15 = 10\n15 % 10 = 5\n10 % 5 = 0\ngcd = 5\n</think>\n<answer>5</answer>")


HARDER = {
    "chain_sum": {"min_terms": 2, "max_terms": 6, "min_digits": 1, "max_digits": 3},
    "basic_arithmetic": {"min_terms": 2, "max_terms": 6, "min_digits": 1, "max_digits": 3},
    "gcd": {"min_numbers": 2, "max_numbers": 4, "min_value": 1, "max_value": 1000},
    "count_bits": {"min_n": 1, "max_n": 2**20},
}
# Every embedded mix (the default among them: 3 terms, 2-digit operands, gcd up to 1,000, count_bits up to 65,535),
# then harder option sets.
SPACES = [(spec["name"], spec["options"]) for mix in tasks.MIXES.values() for spec in mix] + list(HARDER.items())


@pytest.mark.parametrize("style", list(TRACE_STYLES))
@pytest.mark.parametrize(("dataset", "options"), SPACES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(SPACES)])
def test_every_generator_agrees_with_score_answer(dataset: str, options: dict[str, Any], style: str) -> None:
    config = tasks.canonical_config(options)
    data = tasks.dataset(dataset, config, 11)
    for index in range(2000):
        entry = data[index]
        inst = tasks.TaskInstance(tasks.TaskRef(dataset, config, 11, index), entry["question"],
                                  str(entry["answer"]), "", entry)
        trace = traces.checked_trace(inst, style)
        assert trace.answer == str(entry["answer"])
        assert data.score_answer(trace.answer, entry) == 1.0


def test_disagreeing_generator_is_a_build_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(traces.TRACE_GENERATORS, "count_bits", lambda inst: Trace("guess", "99"))
    ref = tasks.TaskRef("count_bits", tasks.canonical_config(tasks.DEFAULT_MIX[3]["options"]), 1, 17)
    with pytest.raises(TraceError, match=r"^trace of count_bits index 17 \(seed 1\) answers '99'"):
        traces.think_answer_completion(tasks.instance(ref))


def test_unknown_task_has_no_generator() -> None:
    ref = tasks.TaskRef("leg_counting", "{}", 0, 0)
    inst = tasks.TaskInstance(ref, "q", "a", "p", {})
    with pytest.raises(TraceError, match="no trace generator for task 'leg_counting'"):
        traces.checked_trace(inst)
