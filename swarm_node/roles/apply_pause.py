"""A test and bench hook: an ECHO-2 worker that pauses in the middle of applying a policy update, so that a kill -9
lands there (simulations/attack_kill.py). Off unless the environment variable `SWARM_NODE_PAUSE_APPLY` names a
directory: an ordinary worker never pauses.

`from_env(environ)` returns None when it is unset, else the hook `Worker.apply` calls after verifying and applying
an update to its followed state and before loading it into its sampler. When the directory holds an `arm` file,
the hook removes it (one pause per arming), writes `applying` (the update's version) and waits until a `release`
file appears or `PAUSE_LIMIT_S` pass; then it removes `applying` (and `release`) and returns. Without `arm` it
returns at once. So `applying` exists exactly while a worker is inside an apply, paused.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path

ENV = "SWARM_NODE_PAUSE_APPLY"
ARM, APPLYING, RELEASE = "arm", "applying", "release"
PAUSE_LIMIT_S = 120.0
POLL_S = 0.02


def from_env(environ: Mapping[str, str] = os.environ,
             sleep: Callable[[float], None] = time.sleep) -> Callable[[int], None] | None:
    where = environ.get(ENV)
    return None if not where else pause_in(Path(where), sleep)


def pause_in(where: Path, sleep: Callable[[float], None] = time.sleep,
             limit_s: float = PAUSE_LIMIT_S) -> Callable[[int], None]:
    def pause(version: int) -> None:
        try:
            (where / ARM).unlink()
        except FileNotFoundError:
            return  # not armed: apply at once
        marker = where / (APPLYING + ".tmp")
        marker.write_text(str(version))
        marker.replace(where / APPLYING)  # whole: a reader never sees it empty
        waited = 0.0
        while not (where / RELEASE).exists() and waited < limit_s:
            sleep(POLL_S)
            waited += POLL_S
        (where / RELEASE).unlink(missing_ok=True)
        (where / APPLYING).unlink(missing_ok=True)

    return pause
