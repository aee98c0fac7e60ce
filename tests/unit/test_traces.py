"""Trace generators: exact steps on hand-computed examples, agreement with reasoning-gym's verifier on thousands of
problems per specialty, and a disagreeing generator is a build error naming the task and index."""

from __future__ import annotations

from typing import Any

import pytest

from swarm_node import tasks
from swarm_node.tasks import traces
from swarm_node.tasks.traces import Trace, TraceError


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


@pytest.mark.parametrize(("dataset", "options"), SPACES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(SPACES)])
def test_every_generator_agrees_with_score_answer(dataset: str, options: dict[str, Any]) -> None:
    config = tasks.canonical_config(options)
    data = tasks.dataset(dataset, config, 11)
    for index in range(2000):
        entry = data[index]
        inst = tasks.TaskInstance(tasks.TaskRef(dataset, config, 11, index), entry["question"],
                                  str(entry["answer"]), "", entry)
        trace = traces.checked_trace(inst)
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
