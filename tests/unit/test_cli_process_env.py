"""What the entry point sets before torch loads: OpenMP's passive wait and oneDNN's global primitive cache off (the
soak's RSS creep, cli/main.py), each only where the user has not set it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

PRINT = "import os, cli.main; print(os.environ['OMP_WAIT_POLICY'], os.environ['ONEDNN_PRIMITIVE_CACHE_CAPACITY'])"


@pytest.mark.parametrize(("given", "seen"), [({}, "PASSIVE 0"),
                                             ({"OMP_WAIT_POLICY": "ACTIVE",
                                               "ONEDNN_PRIMITIVE_CACHE_CAPACITY": "64"}, "ACTIVE 64")])
def test_entry_point_defaults_and_user_overrides(given: dict[str, str], seen: str) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "ONEDNN_PRIMITIVE_CACHE_CAPACITY")}
    out = subprocess.run([sys.executable, "-c", PRINT], env={**env, **given}, capture_output=True, text=True,
                         check=True, cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert out.stdout.split() == seen.split()
