"""The statistics of `bench.solo_learning`: per-seed records of two held-out evals and a run -> the result's fields.

Contract (pure, deterministic):
- A seed's record (`seed_record`, JSON-ready): `seed`, `steps`, `solo_s` (the RL run's wall time), `eval_s`
  (both evals' wall time), `before` / `after` (`EvalResult` fields, `eval_from_json` reads them back) and
  `step_metrics` (each step's `STEP_FIELDS` from its metrics.jsonl row).
- `accuracy_fields(pairs, dataset)`: over seeds' (before, after) evals of the same questions, all or one dataset's:
  `eval_acc_before` / `eval_acc_after` (means over seeds of the mean over distinct questions), `gain` and
  `gain_ci95` (`eval_stats.seeds_then_questions` of each seed's paired after - before per question: the interval
  resamples seeds, then questions), `eval_distinct_questions` (the first seed's), `well_formed_frac_before` /
  `_after` (means over seeds).
- `summarize(records)`: those fields overall and under `per_specialty` {dataset: ...} (datasets in eval order),
  `solo_s` (median over seeds), the median over every step of every seed of each `STEP_FIELDS` field, the mean
  sampled reward before and after when the evals sampled, and `per_seed` (the same, from each seed alone: its
  interval resamples questions only).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from swarm_node.train import eval_stats
from swarm_node.train.evaluate import EvalResult

STEP_FIELDS = ("completion_tokens_p50", "completion_tokens_p95", "gen_time_frac")
Pair = tuple[EvalResult, EvalResult]  # one seed's (before, after)


def seed_record(seed: int, steps: int, solo_s: float, eval_s: float, before: EvalResult, after: EvalResult,
                step_rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    rows = [{k: row[k] for k in STEP_FIELDS} for row in step_rows if all(k in row for k in STEP_FIELDS)]
    return {"seed": seed, "steps": steps, "solo_s": solo_s, "eval_s": eval_s, "before": asdict(before),
            "after": asdict(after), "step_metrics": rows}


def eval_from_json(data: dict[str, Any]) -> EvalResult:
    return EvalResult(**{**data, "outcomes": tuple(tuple(o) for o in data["outcomes"]),
                         "well_formed": tuple(data["well_formed"])})


def _mean_score(outcomes: dict[str, float]) -> float:
    return sum(outcomes.values()) / len(outcomes)


def _mean_frac(evals: Sequence[EvalResult], dataset: str | None) -> float | None:
    """The mean over seeds of the well-formed share; None when an eval has no per-problem flags."""
    fracs = [f for f in (e.well_formed_frac(dataset) for e in evals) if f is not None]
    return statistics.fmean(fracs) if len(fracs) == len(evals) else None


def accuracy_fields(pairs: Sequence[Pair], dataset: str | None = None) -> dict[str, Any]:
    befores = [before.by_question(dataset) for before, _ in pairs]
    afters = [after.by_question(dataset) for _, after in pairs]
    gain = eval_stats.seeds_then_questions([eval_stats.paired_values(a, b) for a, b in zip(afters, befores,
                                                                                            strict=True)])
    return {"eval_acc_before": statistics.fmean(_mean_score(b) for b in befores),
            "eval_acc_after": statistics.fmean(_mean_score(a) for a in afters),
            "gain": gain.mean, "gain_ci95": list(gain.ci95), "eval_distinct_questions": len(befores[0]),
            "well_formed_frac_before": _mean_frac([before for before, _ in pairs], dataset),
            "well_formed_frac_after": _mean_frac([after for _, after in pairs], dataset)}


def _step_medians(rows: Sequence[dict[str, float]]) -> dict[str, float | None]:
    return {k: statistics.median(row[k] for row in rows) if rows else None for k in STEP_FIELDS}


def _sampled(pairs: Sequence[Pair]) -> dict[str, float]:
    """The mean sampled rewards before and after; none when an eval did not sample."""
    befores = [before.sampled_reward for before, _ in pairs if before.sampled_reward is not None]
    afters = [after.sampled_reward for _, after in pairs if after.sampled_reward is not None]
    if len(befores) < len(pairs) or len(afters) < len(pairs):
        return {}
    return {"sampled_reward_before": statistics.fmean(befores), "sampled_reward_after": statistics.fmean(afters)}


def _fields(pairs: Sequence[Pair], datasets: Sequence[str]) -> dict[str, Any]:
    return {**accuracy_fields(pairs), **_sampled(pairs),
            "per_specialty": {name: accuracy_fields(pairs, name) for name in datasets}}


def summarize(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    if not records:
        raise ValueError("no seed to summarize")
    pairs = [(eval_from_json(r["before"]), eval_from_json(r["after"])) for r in records]
    datasets = list(dict.fromkeys(name for name, _, _ in pairs[0][0].outcomes))
    per_seed = [{"seed": r["seed"], "steps": r["steps"], **_fields([pair], datasets), "solo_s": r["solo_s"],
                 "eval_s": r["eval_s"], **_step_medians(r["step_metrics"])}
                for r, pair in zip(records, pairs, strict=True)]
    return {**_fields(pairs, datasets), "solo_s": statistics.median(r["solo_s"] for r in records),
            **_step_medians([row for r in records for row in r["step_metrics"]]), "per_seed": per_seed}
