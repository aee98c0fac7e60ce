"""Digit-by-digit reasoning lines, the way a small model can learn them: every line is a single-digit fact.

Scratchpads of this kind (Nye et al. 2021, "Show your work") let a small transformer do multi-digit arithmetic that
it cannot do in one line: each line reads a few digits it can find by position and writes one digit and a carry.
Pure functions of integers returning `(lines, result)`; `traces.py` wraps them into the `digit-columns` trace style.

- `column_add(a, b)`: a + b for a, b >= 0, least significant column first: `8+7+0=15;5` (digit of a, digit of
  b, the carry in; then the result's digits so far); a last carry gets a column of its own (`0+0+1=1;125`).
- `column_sub(a, b)`: a - b for a >= b >= 0: `15-7-0=8;8` (a borrow shows as the ten added to a's digit; the
  next column subtracts it), leading zeros kept in the digits so far and dropped in the summary.
- `column_mul(a, b)`: one partial product per digit of b (`7*6+0=42;2`, the carry added; no header: its lines
  name the digit), shifted, then summed with `column_add` under a header (`282+3760`).
- `signed_operation(x, symbol, y)`: integers of any sign (a running total goes negative); the header turns the
  operation into one on magnitudes where it differs (`12-45=-(45-12)`), the columns compute it, a summary line
  states `x op y = result`.
- `arithmetic_columns(expression)`: the operations of an expression in Python's evaluation order, each as
  `signed_operation`.
- `halving_count(n)`: count_bits by halving: `n bit ones` per line (`53130 0 0`, then `26565 1 1`): the next number
  is half of this one (each digit from one digit and the parity of the one before it), the bit is the last digit's
  parity, the ones a running count.
"""

from __future__ import annotations

import ast

Lines = list[str]


def _digits(n: int) -> list[int]:
    """Least significant first."""
    return [int(c) for c in reversed(str(n))]


def column_add(a: int, b: int) -> tuple[Lines, int]:
    da, db = _digits(a), _digits(b)
    lines, carry, written = [], 0, ""
    for i in range(max(len(da), len(db)) + 1):
        x, y = da[i] if i < len(da) else 0, db[i] if i < len(db) else 0
        if i >= max(len(da), len(db)) and not carry:
            break
        total = x + y + carry
        written = str(total % 10) + written
        lines.append(f"{x}+{y}+{carry}={total};{written}")
        carry = total // 10
    return lines, int(written)


def column_sub(a: int, b: int) -> tuple[Lines, int]:
    if not a >= b >= 0:
        raise ValueError(f"column_sub needs a >= b >= 0, got {a} - {b}")
    da, db = _digits(a), _digits(b)
    lines, borrow, written = [], 0, ""
    for i, x in enumerate(da):
        y = db[i] if i < len(db) else 0
        top = x + 10 if x - y - borrow < 0 else x
        written = str(top - y - borrow) + written
        lines.append(f"{top}-{y}-{borrow}={top - y - borrow};{written}")
        borrow = 1 if top >= 10 else 0
    return lines, int(written)


def column_mul(a: int, b: int) -> tuple[Lines, int]:
    if a < 0 or b < 0:
        raise ValueError(f"column_mul needs a, b >= 0, got {a} * {b}")
    lines: Lines = []
    partials: list[int] = []
    for shift, d in enumerate(_digits(b)):
        carry, written = 0, ""
        for x in [*_digits(a), 0]:
            if x == 0 and len(written) >= len(str(a)) and not carry:
                break
            total = x * d + carry
            written = str(total % 10) + written
            lines.append(f"{x}*{d}+{carry}={total};{written}")
            carry = total // 10
        partials.append(int(written) * 10 ** shift)
    total = partials[0]
    for partial in partials[1:]:
        lines.append(f"{total}+{partial}")
        add_lines, total = column_add(total, partial)
        lines.extend(add_lines)
    return lines, total


def magnitude_form(a: int, b: int) -> tuple[str, str, int, int, int]:
    """a + b as one operation on magnitudes: (its text, "+" or "-", left, right, the sign of the result)."""
    if (a >= 0) == (b >= 0):
        left, right, sign, symbol = abs(a), abs(b), 1 if a >= 0 else -1, "+"
    else:
        big, small = (a, b) if abs(a) >= abs(b) else (b, a)
        left, right, sign, symbol = abs(big), abs(small), 1 if big >= 0 else -1, "-"
    text = f"{left}{symbol}{right}"
    return (text if sign > 0 else f"-({text})"), symbol, left, right, sign


def signed_operation(x: int, symbol: str, y: int) -> tuple[Lines, int]:
    """`x symbol y` for integers of any sign: a header (with the form on magnitudes when it differs), the columns of
    that form, and a summary line. Floor division (`/`, as reasoning-gym computes it) is one line, no columns."""
    stated = f"{x}{symbol}{y}"
    if symbol == "/":
        return [f"{stated}={x // y}"], x // y
    if symbol == "*":
        sign = -1 if (x < 0) != (y < 0) else 1
        form = f"{abs(x)}*{abs(y)}" if sign > 0 else f"-({abs(x)}*{abs(y)})"
        lines, magnitude = column_mul(abs(x), abs(y))
    elif symbol in ("+", "-"):
        form, op, left, right, sign = magnitude_form(x, y if symbol == "+" else -y)
        lines, magnitude = column_add(left, right) if op == "+" else column_sub(left, right)
    else:
        raise ValueError(f"unsupported operator {symbol!r}")
    result = sign * magnitude
    return [stated if form == stated else f"{stated}={form}", *lines, f"{stated}={result}"], result


OPERATORS: dict[type, str] = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.FloorDiv: "/"}


def arithmetic_columns(expression: str) -> tuple[Lines, int]:
    """Every operation of `expression` (integers, + - * /, parentheses, unary minus) in evaluation order, in columns
    (`/` is floor division, as reasoning-gym computes it)."""
    lines: Lines = []

    def value(node: ast.expr) -> int:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            if isinstance(node.operand, ast.Constant):  # a negative literal is a number, not a step
                return -value(node.operand)
            inner = value(node.operand)
            lines.append(f"-({inner})={-inner}")
            return -inner
        if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
            left, right = value(node.left), value(node.right)
            op_lines, result = signed_operation(left, OPERATORS[type(node.op)], right)
            lines.extend(op_lines)
            return result
        raise ValueError(f"unsupported arithmetic in {expression!r}: {ast.dump(node)}")

    result = value(ast.parse(expression.replace("/", "//"), mode="eval").body)
    if not lines:  # a lone number still gets a reasoning line
        lines.append(f"{result}={result}")
    return lines, result


def halving_count(n: int) -> tuple[Lines, int]:
    """The 1 bits of n >= 1 by halving: `n bit ones` per line until n is 0."""
    if n < 1:
        raise ValueError(f"halving_count needs n >= 1, got {n}")
    lines, ones = [], 0
    while n:
        ones += n % 2
        lines.append(f"{n} {n % 2} {ones}")
        n //= 2
    return lines, ones
