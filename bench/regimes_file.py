"""The regimes file of `bench.sapo_regimes` (bench/sapo_regimes.toml): candidate regimes, and the ones fixed.

Contract:
- `REGIMES`: the regimes the grid knows (issue 30 item 5), each with its bound on the fraction of a solo node's
  groups without signal (`hard` >= 0.40, `medium` <= 0.20) and the ablation cells it adds (`hard`: 4/4-nofilter).
- `load_regimes(path)` reads the file: `[candidates.NAME]` tables, each `group_size` (G, >= 2) and `mix` (a task
  mix, as `[task] mix`), and `[fixed]`, where a regime maps to `{candidate, no_signal_frac_solo, pilot?}`. Unknown
  keys, a fixed regime naming no candidate or an unknown regime are one-line `UserError`s.
- `Candidate.config()`: the node config tables a candidate sets (`task.mix`, `run.group_size`).
- `require_fixed(regimes, names)`: each named regime's fixed record, or a one-line `RegimeNotFixed` (a `UserError`)
  saying what to run and record: the grid runs no regime the pilot has not fixed, nor one whose recorded fraction
  misses its bound.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from swarm_node.config import read_toml
from swarm_node.errors import UserError

PATH = Path(__file__).with_name("sapo_regimes.toml")


@dataclass(frozen=True)
class Regime:
    name: str
    at_least: float = 0.0  # bounds on no_signal_frac_solo
    at_most: float = 1.0
    ablations: tuple[str, ...] = ()  # cells run in this regime only

    def bound(self) -> str:
        return f">= {self.at_least:.2f}" if self.at_least > 0 else f"<= {self.at_most:.2f}"

    def fits(self, no_signal_frac: float) -> bool:
        return self.at_least <= no_signal_frac <= self.at_most


REGIMES: dict[str, Regime] = {
    "hard": Regime("hard", at_least=0.40, ablations=("4/4-nofilter",)),
    "medium": Regime("medium", at_most=0.20),
}


@dataclass(frozen=True)
class Candidate:
    name: str
    group_size: int
    mix: tuple[dict[str, Any], ...]

    def config(self) -> dict[str, Any]:
        """The node config tables this candidate sets (over the base scenario's)."""
        return {"task": {"mix": copy.deepcopy(list(self.mix))}, "run": {"group_size": self.group_size}}


@dataclass(frozen=True)
class Fixed:
    regime: str
    candidate: str
    no_signal_frac_solo: float  # the pilot's measure, recorded by hand
    pilot: str = ""  # the commit the pilot ran at


@dataclass(frozen=True)
class Regimes:
    path: Path
    candidates: dict[str, Candidate]
    fixed: dict[str, Fixed]


class RegimeNotFixed(UserError):
    """The grid was asked for a regime the pilot has not fixed (or fixed outside its bound)."""


def _keys(table: dict[str, Any], known: set[str], where: str) -> None:
    for key in table:
        if key not in known:
            raise UserError(f"{where}: unknown key {key!r}; known: {', '.join(sorted(known))}")


def parse_regimes(data: dict[str, Any], path: Path = PATH) -> Regimes:
    _keys(data, {"candidates", "fixed"}, str(path))
    candidates: dict[str, Candidate] = {}
    for name, table in data.get("candidates", {}).items():
        where = f"{path}: [candidates.{name}]"
        if not isinstance(table, dict):
            raise UserError(f"{where} must be a table")
        _keys(table, {"group_size", "mix"}, where)
        group_size, mix = table.get("group_size", 8), table.get("mix")
        if not isinstance(group_size, int) or isinstance(group_size, bool) or group_size < 2:
            raise UserError(f"{where}: group_size must be an integer >= 2, got {group_size!r}")
        if not isinstance(mix, list) or not mix or not all(isinstance(e, dict) for e in mix):
            raise UserError(f"{where}: mix must be a non-empty array of {{name, options}} tables")
        candidates[name] = Candidate(name, group_size, tuple(mix))
    fixed: dict[str, Fixed] = {}
    for regime, record in data.get("fixed", {}).items():
        where = f"{path}: [fixed] {regime}"
        if regime not in REGIMES:
            raise UserError(f"{where}: unknown regime; known: {', '.join(REGIMES)}")
        if not isinstance(record, dict):
            raise UserError(f"{where} must be {{candidate = ..., no_signal_frac_solo = ...}}")
        _keys(record, {"candidate", "no_signal_frac_solo", "pilot"}, where)
        candidate, frac = record.get("candidate"), record.get("no_signal_frac_solo")
        if candidate not in candidates:
            raise UserError(f"{where}: candidate {candidate!r} is not one of [candidates]: {', '.join(candidates)}")
        if not isinstance(frac, (int, float)) or isinstance(frac, bool) or not math.isfinite(frac) \
                or not 0 <= frac <= 1:
            raise UserError(f"{where}: no_signal_frac_solo must be the pilot's fraction in [0, 1], got {frac!r}")
        fixed[regime] = Fixed(regime, str(candidate), float(frac), str(record.get("pilot", "")))
    return Regimes(path, candidates, fixed)


def load_regimes(path: Path = PATH) -> Regimes:
    return parse_regimes(read_toml(path, "regimes file"), path)


def require_fixed(regimes: Regimes, names: list[str]) -> dict[str, Fixed]:
    """Each named regime's fixed record; a one-line RegimeNotFixed for the first that is not fixed, or whose
    recorded fraction misses its bound."""
    out: dict[str, Fixed] = {}
    for name in names:
        if name not in REGIMES:
            raise UserError(f"unknown regime {name!r}; known: {', '.join(REGIMES)}")
        regime, record = REGIMES[name], regimes.fixed.get(name)
        if record is None:
            raise RegimeNotFixed(f"regime {name!r} is not fixed in {regimes.path}: run `python -m bench.sapo_regimes "
                                 f"--pilot`, then record [fixed] {name} = {{candidate = ..., no_signal_frac_solo = "
                                 f"...}} from its line (needs {regime.bound()}) and commit it before the grid runs")
        if not regime.fits(record.no_signal_frac_solo):
            raise RegimeNotFixed(f"regime {name!r} in {regimes.path}: candidate {record.candidate!r} has "
                                 f"no_signal_frac_solo {record.no_signal_frac_solo:.3f}, but {name} needs "
                                 f"{regime.bound()}: pilot another candidate")
        out[name] = record
    return out
