"""bench.solo_learning's statistics (bench/solo_stats.py) on a hand-built case of two seeds, two specialties of two
questions each, and its README row on a fixture result."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from bench.report import render_section
from bench.report_rows import ROWS
from bench.solo_stats import seed_record, summarize
from swarm_node.train.eval_stats import seeds_then_questions
from swarm_node.train.evaluate import EvalResult

QUESTIONS = (("chain_sum", "q1"), ("chain_sum", "q2"), ("gcd", "q3"), ("gcd", "q4"))


def result(right: tuple[float, ...], formed: tuple[bool, ...], sampled: float | None = None) -> EvalResult:
    return EvalResult(sum(right) / len(right), sampled, len(right), {}, distinct=len(right),
                      outcomes=tuple((d, q, r) for (d, q), r in zip(QUESTIONS, right, strict=True)),
                      well_formed=formed)


def records(sampled: tuple[float, ...] | tuple[None, ...] = (None,) * 4) -> list[dict]:
    """Seed 0 gains q2 and q4; seed 1 gains q2 and loses q1. A skipped step's row (no completion metrics) is left
    out. Through JSON, as a --parallel seed's record comes back."""
    seed0 = seed_record(0, 2, 100.0, 10.0, result((1, 0, 0, 0), (True, True, False, False), sampled[0]),
                        result((1, 1, 0, 1), (True, True, True, True), sampled[1]),
                        [{"step": 0, "completion_tokens_p50": 10, "completion_tokens_p95": 20, "gen_time_frac": 0.5,
                          "reward_mean": 0.1},
                         {"step": 1, "completion_tokens_p50": 12, "completion_tokens_p95": 30, "gen_time_frac": 0.7}])
    seed1 = seed_record(1, 2, 300.0, 12.0, result((1, 0, 0, 0), (True, False, True, False), sampled[2]),
                        result((0, 1, 0, 0), (True, True, True, False), sampled[3]),
                        [{"step": 0, "skipped": "no signal"},
                         {"step": 1, "completion_tokens_p50": 14, "completion_tokens_p95": 24, "gen_time_frac": 0.9}])
    return json.loads(json.dumps([seed0, seed1]))


def test_gains_are_paired_per_question_and_averaged_over_seeds() -> None:
    out = summarize(records())
    gains = [{"chain_sum\0q1": 0.0, "chain_sum\0q2": 1.0, "gcd\0q3": 0.0, "gcd\0q4": 1.0},
             {"chain_sum\0q1": -1.0, "chain_sum\0q2": 1.0, "gcd\0q3": 0.0, "gcd\0q4": 0.0}]
    assert (out["eval_acc_before"], out["eval_acc_after"], out["gain"]) == (0.25, 0.5, 0.25)
    assert out["gain_ci95"] == list(seeds_then_questions(gains).ci95)
    assert out["eval_distinct_questions"] == 4
    assert (out["well_formed_frac_before"], out["well_formed_frac_after"]) == (0.5, 0.875)
    assert "sampled_reward_before" not in out  # the evals did not sample
    assert list(out["per_specialty"]) == ["chain_sum", "gcd"]  # in eval order
    chain, gcd = out["per_specialty"]["chain_sum"], out["per_specialty"]["gcd"]
    assert (chain["eval_acc_before"], chain["eval_acc_after"], chain["gain"]) == (0.5, 0.75, 0.25)
    assert chain["gain_ci95"] == list(seeds_then_questions([{k: v for k, v in g.items() if k.startswith("chain")}
                                                            for g in gains]).ci95)
    assert (chain["eval_distinct_questions"], chain["well_formed_frac_before"], chain["well_formed_frac_after"]) == (
        2, 0.75, 1.0)
    assert (gcd["eval_acc_before"], gcd["eval_acc_after"], gcd["gain"]) == (0.0, 0.25, 0.25)
    assert (gcd["well_formed_frac_before"], gcd["well_formed_frac_after"]) == (0.25, 0.75)


def test_times_and_step_metrics_are_medians_overall_and_per_seed() -> None:
    out = summarize(records())
    assert out["solo_s"] == 200.0
    assert (out["completion_tokens_p50"], out["completion_tokens_p95"], out["gen_time_frac"]) == (12, 24, 0.7)
    seed0, seed1 = out["per_seed"]
    assert (seed0["seed"], seed0["steps"], seed0["solo_s"], seed0["eval_s"]) == (0, 2, 100.0, 10.0)
    assert (seed0["completion_tokens_p50"], seed0["completion_tokens_p95"], seed0["gen_time_frac"]) == (11, 25, 0.6)
    assert (seed1["completion_tokens_p50"], seed1["completion_tokens_p95"], seed1["gen_time_frac"]) == (14, 24, 0.9)
    # each seed alone: its own accuracies and gain, its interval over questions only
    assert (seed0["eval_acc_before"], seed0["eval_acc_after"], seed0["gain"]) == (0.25, 0.75, 0.5)
    assert (seed1["eval_acc_before"], seed1["eval_acc_after"], seed1["gain"]) == (0.25, 0.25, 0.0)
    assert seed1["per_specialty"]["chain_sum"]["gain_ci95"] == list(
        seeds_then_questions([{"chain_sum\0q1": -1.0, "chain_sum\0q2": 1.0}]).ci95)


def test_sampled_rewards_are_means_over_seeds_when_the_evals_sampled() -> None:
    out = summarize(records((0.25, 0.5, 0.125, 0.75)))
    assert (out["sampled_reward_before"], out["sampled_reward_after"]) == (0.1875, 0.625)
    assert out["per_seed"][1]["sampled_reward_after"] == 0.75


def test_the_readme_row_reads_the_new_fields(tmp_path: Path) -> None:
    specialty = {"eval_acc_before": 0.2, "eval_acc_after": 0.35, "gain": 0.15, "gain_ci95": [0.12, 0.18]}
    fixture = {"eval_acc_before": 0.2056, "eval_acc_after": 0.3104, "gain": 0.1049, "gain_ci95": [0.0912, 0.1187],
               "eval_distinct_questions": 4000, "well_formed_frac_before": 0.91, "well_formed_frac_after": 0.97,
               "per_specialty": {"chain_sum": specialty,
                                 "gcd": {**specialty, "gain": -0.01, "gain_ci95": [-0.03, 0.01]}},
               "build_s": 258.4, "solo_s": 1500.2, "steps": 300, "seeds": [0, 1, 2], "split": "test",
               "per_seed": [{"gain": 0.1}, {"gain": 0.12}, {"gain": 0.095}],
               "provenance": {"commit": "0123456789abcdef", "date": "2026-11-27T10:00:00Z"}}
    (tmp_path / "solo_learning.json").write_text(json.dumps(fixture))
    cell = render_section(tmp_path, {"solo_learning": ROWS["solo_learning"]}).splitlines()[-1].split(" | ")[2]
    assert cell == ("300 steps, 3 seeds: greedy 0.206 -> 0.310 on 4000 test questions, gain +10.5 pts (95% "
                    "interval +9.1 to +11.9; seeds +9.5 / +10.0 / +12.0); per specialty chain_sum +15.0 "
                    "[+12.0, +18.0], gcd -1.0 [-3.0, +1.0]; well-formed 0.91 -> 0.97; 1500 s/seed, build 258 s")


def test_a_cut_short_run_resumes_from_the_next_seed_and_never_reuses_other_settings(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import bench.solo_learning as bench

    ran: list[tuple[int, int]] = []

    def fake_seed(seed: int, args: argparse.Namespace, overrides: dict) -> dict:
        if seed == 1 and args.steps == 5 and not args.resume:
            raise KeyboardInterrupt  # the session ends during seed 1
        ran.append((seed, args.steps))
        return {"seed": seed, "steps": args.steps}

    monkeypatch.setattr(bench, "run_seed", fake_seed)

    def args(steps: int, resume: bool) -> argparse.Namespace:
        return argparse.Namespace(seeds=[0, 1], steps=steps, problems=8, split="test", samples=0, sampler="hf",
                                  parallel=False, run_root=str(tmp_path), resume=resume)

    with pytest.raises(KeyboardInterrupt):
        bench.run_seeds_in_turn(args(5, resume=False), {})
    assert ran == [(0, 5)] and (tmp_path / "seed0.json").exists() and not (tmp_path / "seed1.json").exists()
    assert bench.run_seeds_in_turn(args(5, resume=True), {}) == [{"seed": 0, "steps": 5}, {"seed": 1, "steps": 5}]
    assert ran == [(0, 5), (1, 5)]  # seed 0 reused
    bench.run_seeds_in_turn(args(6, resume=True), {})  # other settings: both seeds run again
    assert ran[2:] == [(0, 6), (1, 6)]
    bench.run_seeds_in_turn(args(6, resume=True), {"train.lr": 1e-4})  # another override: run again
    assert ran[4:] == [(0, 6), (1, 6)]
    bench.run_seeds_in_turn(args(6, resume=False), {"train.lr": 1e-4})  # without --resume nothing is reused
    assert ran[6:] == [(0, 6), (1, 6)]
