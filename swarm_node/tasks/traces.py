"""Step-by-step reasoning traces for the default mix's specialties, and the think-answer completion built from them.

`TRACE_STYLES` names the ways a trace is written; each maps a reasoning-gym dataset name to a generator that reads the
entry's metadata (never the answer) and returns a `Trace`: the reasoning lines and the answer they arrive at.
`per-operation` (`TRACE_GENERATORS`, the default), per specialty:
- chain_sum: the partial sums, left to right (`4 + 5 = 9`, then `9 - 2 = 7`);
- basic_arithmetic: one line per operation in Python's evaluation order (precedence, parentheses, negation; `/` is
  floor division, as reasoning-gym computes it);
- gcd: Euclid's remainders (`25 % 15 = 10` ... down to a remainder 0), folded over every number;
- count_bits: the binary digits, then their sum.
`digit-columns` (`COLUMN_GENERATORS`, `column_traces.py`): every line a single-digit fact, for a small model to learn:
- chain_sum, basic_arithmetic: each operation in columns (`8+7+0=15;5`: two digits and the carry, their sum; the
  result's digits so far), partial products for `*`;
- gcd: Euclid's remainders, as in `per-operation`;
- count_bits: halving, the bit and a running count of ones per line (`53130 0 0`).

`think_answer_completion(inst, style)` is the supervised target
`<think>\\n{reasoning}\\n</think>\\n<answer>{answer}</answer>`; it checks the trace's answer with the dataset's own
`score_answer` and raises `TraceError` (naming the task and index) when the score is below 1: a generator that
disagrees with reasoning-gym is a build error, never a silent training example.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass

from swarm_node import variants
from swarm_node.tasks import column_traces
from swarm_node.tasks.reference import TaskInstance, dataset


class TraceError(Exception):
    """A trace generator disagrees with the dataset's verifier, or has no generator for a task: a build error."""


@dataclass(frozen=True)
class Trace:
    reasoning: str  # lines joined by "\n", no leading or trailing newline
    answer: str


THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
ANSWER_OPEN = "<answer>"
ANSWER_CLOSE = "</answer>"


def format_think_answer(trace: Trace) -> str:
    """The exact think-answer completion text for a trace (the format parser reads this shape)."""
    return f"{THINK_OPEN}\n{trace.reasoning}\n{THINK_CLOSE}\n{ANSWER_OPEN}{trace.answer}{ANSWER_CLOSE}"


# Python's operators as the expression writes them; `/` is floor division in reasoning-gym's arithmetic.
BINARY_OPERATORS: dict[type, tuple[str, Callable[[int, int], int]]] = {
    ast.Add: ("+", lambda a, b: a + b),
    ast.Sub: ("-", lambda a, b: a - b),
    ast.Mult: ("*", lambda a, b: a * b),
    ast.FloorDiv: ("/", lambda a, b: a // b),
}


def arithmetic_steps(expression: str) -> Trace:
    """One line per operation of `expression` (integers, + - * /, parentheses, unary minus) in evaluation order."""
    lines: list[str] = []

    def value(node: ast.expr) -> int:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            if isinstance(node.operand, ast.Constant):  # a negative literal is a number, not a step
                return -value(node.operand)
            inner = value(node.operand)
            lines.append(f"-({inner}) = {-inner}")
            return -inner
        if isinstance(node, ast.BinOp) and type(node.op) in BINARY_OPERATORS:
            left, right = value(node.left), value(node.right)
            symbol, apply = BINARY_OPERATORS[type(node.op)]
            result = apply(left, right)
            lines.append(f"{left} {symbol} {right} = {result}")
            return result
        raise TraceError(f"unsupported arithmetic in {expression!r}: {ast.dump(node)}")

    tree = ast.parse(expression.replace("/", "//"), mode="eval")
    result = value(tree.body)
    if not lines:  # a lone number still gets a reasoning line
        lines.append(f"{result} = {result}")
    return Trace("\n".join(lines), str(result))


def arithmetic_trace(inst: TaskInstance) -> Trace:
    return arithmetic_steps(inst.entry["metadata"]["expression"])


def gcd_trace(inst: TaskInstance) -> Trace:
    numbers = [int(n) for n in inst.entry["metadata"]["numbers"]]
    lines: list[str] = []
    result = numbers[0]
    for other in numbers[1:]:
        a, b = max(result, other), min(result, other)
        while b:
            lines.append(f"{a} % {b} = {a % b}")
            a, b = b, a % b
        result = a
    lines.append(f"gcd = {result}")
    return Trace("\n".join(lines), str(result))


def count_bits_trace(inst: TaskInstance) -> Trace:
    number = int(inst.entry["metadata"]["number"])
    digits = format(number, "b")
    count = digits.count("1")
    return Trace(f"{number} in binary is {digits}\n{' + '.join(digits)} = {count}", str(count))


TraceGenerators = dict[str, Callable[[TaskInstance], Trace]]
TRACE_GENERATORS: TraceGenerators = {
    "chain_sum": arithmetic_trace,
    "basic_arithmetic": arithmetic_trace,
    "gcd": gcd_trace,
    "count_bits": count_bits_trace,
}


def column_arithmetic_trace(inst: TaskInstance) -> Trace:
    expression = inst.entry["metadata"]["expression"]
    try:
        lines, result = column_traces.arithmetic_columns(expression)
    except ValueError as exc:
        raise TraceError(f"{inst.ref.dataset} index {inst.ref.index}: {exc}") from exc
    return Trace("\n".join(lines), str(result))


def halving_count_bits_trace(inst: TaskInstance) -> Trace:
    lines, ones = column_traces.halving_count(int(inst.entry["metadata"]["number"]))
    return Trace("\n".join(lines), str(ones))


COLUMN_GENERATORS: TraceGenerators = {
    "chain_sum": column_arithmetic_trace,
    "basic_arithmetic": column_arithmetic_trace,
    "gcd": gcd_trace,
    "count_bits": halving_count_bits_trace,
}
TRACE_STYLES: variants.Registry[TraceGenerators] = variants.Registry("trace style", variants.TRACE_STYLES)
TRACE_STYLES.add("per-operation", TRACE_GENERATORS)
TRACE_STYLES.add("digit-columns", COLUMN_GENERATORS)
DEFAULT_TRACE_STYLE = "per-operation"


def checked_trace(inst: TaskInstance, style: str = DEFAULT_TRACE_STYLE) -> Trace:
    """The instance's trace in `style` (`TRACE_STYLES`), verified by the dataset's `score_answer` (score 1 or
    `TraceError`)."""
    generators = TRACE_STYLES[style]
    generator = generators.get(inst.ref.dataset)
    if generator is None:
        raise TraceError(f"no trace generator for task {inst.ref.dataset!r}; known: {sorted(generators)}")
    trace = generator(inst)
    data = dataset(inst.ref.dataset, inst.ref.config, inst.ref.seed)
    got = float(data.score_answer(trace.answer, inst.entry))
    if got < 1.0:
        raise TraceError(f"trace of {inst.ref.dataset} index {inst.ref.index} (seed {inst.ref.seed}) answers "
                         f"{trace.answer!r}, the dataset's answer is {inst.answer!r} (score {got})")
    return trace


def think_answer_completion(inst: TaskInstance, style: str = DEFAULT_TRACE_STYLE) -> str:
    """The verified think-answer completion text for one instance in `style` (no EOS: the tokenizer side adds it)."""
    return format_think_answer(checked_trace(inst, style))
