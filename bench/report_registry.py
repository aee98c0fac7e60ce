"""The README's benchmark rows, registered by name in README order (`ROWS`): the registry and its helpers.

Each row has the command, what it measures (prose) and its result files (relative to bench/results/); its
renderer formats the "last result" cell from those files' JSON, so every measured figure in the README comes from a
file. Words around the figures are the README's; a figure no file holds is not printed as a measurement. The rows
themselves are in bench/report_rows.py and bench/report_rows_scale.py (registered in that order). A row registered
`until_measured` is left out of the table while any of its files is missing (a measurement not run yet); any other
row's missing file is an error.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Results = dict[str, dict[str, Any]]  # result file (relative to bench/results/) -> its JSON
Render = Callable[[Results], str]


@dataclass(frozen=True)
class Row:
    command: str
    measures: str
    files: tuple[str, ...]
    render: Render
    until_measured: bool = False


ROWS: dict[str, Row] = {}


def row(name: str, command: str, measures: str, *files: str,
        until_measured: bool = False) -> Callable[[Render], Render]:
    def register(render: Render) -> Render:
        ROWS[name] = Row(command, measures, files, render, until_measured)
        return render
    return register


def pts(fraction: float) -> str:
    """A difference of two accuracies, in points."""
    return f"{100 * fraction:+.1f}"


def slash(values: list[Any], fmt: str) -> str:
    return " / ".join(format(v, fmt) for v in values)
