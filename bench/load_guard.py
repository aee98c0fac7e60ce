"""The load guard of benchmarks that report a time or a rate: they refuse to start on a busy machine.

A 1-minute load average above `MAX_LOAD` stops the benchmark with one line (exit code 2) unless it was given
`--loaded`, which the result's provenance then records (`loaded: true`): a rate measured beside other work is
not comparable with one measured on an idle machine. A benchmark that times several parts in one process waits
(`wait_to_settle`) for the load its own previous part left to decay before the guard reads the next.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable

MAX_LOAD = 0.5
# once the work is gone the 1-minute average falls from 2 to 0.5 in about 85 s (e^(-t/60)): 5 minutes is ample
SETTLE_S = 300.0


def add_loaded_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--loaded", action="store_true",
                        help=f"run even when the 1-minute load average is above {MAX_LOAD} (recorded in the result)")


def refuse_if_loaded(load_avg_1m: float, loaded: bool) -> None:
    if load_avg_1m > MAX_LOAD and not loaded:
        print(f"error: the 1-minute load average is {load_avg_1m:.2f} (above {MAX_LOAD}): this benchmark reports a "
              "time or a rate; wait for an idle machine or rerun with --loaded (recorded)", file=sys.stderr)
        raise SystemExit(2)


def wait_to_settle(timeout_s: float = SETTLE_S, poll_s: float = 10.0,
                   load_avg: Callable[[], tuple[float, float, float]] = os.getloadavg,
                   sleep: Callable[[float], None] = time.sleep) -> float:
    """Poll the 1-minute load average until it is at most MAX_LOAD or `timeout_s` passed; returns the last reading.
    It decides nothing: the guard still refuses a machine that stays loaded."""
    waited, load = 0.0, load_avg()[0]
    while load > MAX_LOAD and waited < timeout_s:
        sleep(poll_s)
        waited += poll_s
        load = load_avg()[0]
    return load
