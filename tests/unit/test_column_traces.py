"""Digit-column lines: exact lines on hand-computed examples, every column line a true single-digit fact whose
digits-so-far end in the right result (over a grid of operands), and inputs outside a function's contract refused."""

from __future__ import annotations

import re

import pytest

from swarm_node import tasks
from swarm_node.tasks import column_traces as columns
from swarm_node.tasks.traces import TRACE_STYLES, TraceError

COLUMN_LINE = re.compile(r"^(\d+)([-+*])(\d)([-+])(\d)=(\d+);(\d+)$")


def check_columns(lines: list[str], result: int) -> None:
    """Each line states a true fact of digits (one digit each, a carry or borrow of 0-9) and its digits so far."""
    written = ""
    for line in lines:
        top, op, digit, _, carry, value, so_far = COLUMN_LINE.match(line).groups()  # type: ignore[union-attr]
        if op == "+":
            assert int(top) + int(digit) + int(carry) == int(value)
        elif op == "-":
            assert int(top) - int(digit) - int(carry) == int(value) and int(top) < 20
        else:
            assert int(top) * int(digit) + int(carry) == int(value)
        assert int(top) % 10 == int(top[-1]) and len(value) <= 2
        assert so_far == str(int(value) % 10) + written
        written = so_far
    assert int(written) == result


def test_column_lines_by_hand() -> None:
    assert columns.column_add(95, 37) == (["5+7+0=12;2", "9+3+1=13;32", "0+0+1=1;132"], 132)
    assert columns.column_add(0, 0) == (["0+0+0=0;0"], 0)
    assert columns.column_sub(100, 1) == (["10-1-0=9;9", "10-0-1=9;99", "1-0-1=0;099"], 99)
    assert columns.column_mul(205, 3) == (["5*3+0=15;5", "0*3+1=1;15", "2*3+0=6;615"], 615)
    assert columns.column_mul(9, 9) == (["9*9+0=81;1", "0*9+8=8;81"], 81)
    assert columns.halving_count(6) == (["6 0 0", "3 1 1", "1 1 2"], 2)


def test_every_column_line_is_a_true_digit_fact() -> None:
    for a in range(0, 200, 7):
        for b in range(0, 200, 3):
            lines, total = columns.column_add(a, b)
            check_columns(lines, total)
            assert total == a + b
            lines, product = columns.column_mul(a, b % 100)
            assert product == a * (b % 100)
            big, small = max(a, b), min(a, b)
            lines, difference = columns.column_sub(big, small)
            check_columns(lines, difference)
            assert difference == big - small


@pytest.mark.parametrize(("x", "symbol", "y"), [(12, "-", 45), (-22, "+", 30), (-50, "+", 30), (-22, "-", 30),
                                                (2, "-", -3), (-3, "*", -8), (-9, "*", 2), (0, "-", 0), (-7, "/", 2)])
def test_signed_operations_match_python(x: int, symbol: str, y: int) -> None:
    lines, result = columns.signed_operation(x, symbol, y)
    assert result == {"+": lambda: x + y, "-": lambda: x - y, "*": lambda: x * y, "/": lambda: x // y}[symbol]()
    assert lines[-1] == f"{x}{symbol}{y}={result}"


def test_signed_operation_headers_name_the_form_on_magnitudes() -> None:
    assert columns.signed_operation(12, "-", 45)[0][0] == "12-45=-(45-12)"
    assert columns.signed_operation(-22, "+", 30)[0][0] == "-22+30=30-22"
    assert columns.signed_operation(-22, "-", 30)[0][0] == "-22-30=-(22+30)"
    assert columns.signed_operation(45, "-", 12)[0][0] == "45-12"


def test_inputs_outside_the_contract_are_refused() -> None:
    with pytest.raises(ValueError, match="column_sub needs a >= b >= 0, got 3 - 5"):
        columns.column_sub(3, 5)
    with pytest.raises(ValueError, match="column_mul needs a, b >= 0"):
        columns.column_mul(-1, 5)
    with pytest.raises(ValueError, match="halving_count needs n >= 1, got 0"):
        columns.halving_count(0)
    with pytest.raises(ValueError, match="unsupported arithmetic in '2 \\*\\* 3'"):
        columns.arithmetic_columns("2 ** 3")
    inst = tasks.TaskInstance(tasks.TaskRef("chain_sum", "{}", 0, 4), "q", "8", "p",
                              {"metadata": {"expression": "2 ** 3"}})
    with pytest.raises(TraceError, match="^chain_sum index 4: unsupported arithmetic"):
        TRACE_STYLES["digit-columns"]["chain_sum"](inst)
