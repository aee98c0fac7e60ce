"""The load guard of benchmarks that report a time or a rate: they refuse to start on a busy machine.

A 1-minute load average above `MAX_LOAD` stops the benchmark with one line (exit code 2) unless it was given
`--loaded`, which the result's provenance then records (`loaded: true`): a rate measured beside other work is
not comparable with one measured on an idle machine.
"""

from __future__ import annotations

import argparse
import sys

MAX_LOAD = 0.5


def add_loaded_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--loaded", action="store_true",
                        help=f"run even when the 1-minute load average is above {MAX_LOAD} (recorded in the result)")


def refuse_if_loaded(load_avg_1m: float, loaded: bool) -> None:
    if load_avg_1m > MAX_LOAD and not loaded:
        print(f"error: the 1-minute load average is {load_avg_1m:.2f} (above {MAX_LOAD}): this benchmark reports a "
              "time or a rate; wait for an idle machine or rerun with --loaded (recorded)", file=sys.stderr)
        raise SystemExit(2)
