"""The held-out partition: disjoint from training and the same everywhere; peers cannot make us train on eval
problems; evaluation reports accuracy per specialty and overall."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from collections import Counter

import pytest
import torch

from protocol.messages import CompletionWire, RolloutGroup, TaskRefWire
from swarm_node import tasks
from swarm_node.errors import UserError
from swarm_node.model.tokenizer import build_char_tokenizer, tokenizer_hash
from swarm_node.sampler.base import Completion, Sampler, SamplingParams
from swarm_node.sharing.exchange import Received
from swarm_node.sharing.ingest import Ingest
from swarm_node.sharing.rescore import CompletionBounds, ShareContext, accept_external
from swarm_node.status.stats import NodeStats
from swarm_node.train.evaluate import EvalResult, evaluate

QUESTION = "State the final answer to the following arithmetic problem: 8 - 0 ="  # held out (index 5 of seed 0)


def questions(refs: list[tasks.TaskRef]) -> set[str]:
    return {tasks.instance(r).question for r in refs}


def test_bucket_is_the_same_in_another_process_and_for_every_seed() -> None:
    assert tasks.bucket("chain_sum", QUESTION) < tasks.EVAL_PERCENT and tasks.is_heldout_question("chain_sum", QUESTION)
    code = f"from swarm_node import tasks; print(tasks.bucket('chain_sum', {QUESTION!r}))"
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert int(out.stdout) == tasks.bucket("chain_sum", QUESTION)
    assert tasks.bucket("basic_arithmetic", QUESTION) != tasks.bucket("chain_sum", QUESTION)  # dataset is hashed
    # the same question under another seed or index is on the same side
    source = tasks.TaskSource()
    by_question: dict[str, bool] = {}
    for seed in (0, 1, 99):
        for i in range(1000):
            inst = tasks.instance(tasks.TaskRef(source.name, source.config, seed, i))
            assert by_question.setdefault(inst.question, tasks.is_heldout(inst)) == tasks.is_heldout(inst)
    splits = Counter("test" if tasks.in_split("test", "chain_sum", q) else "validation" if held else "train"
                     for q, held in by_question.items())
    # the default task: 200 problems, ~15% test and ~5% validation (exactly 32 and 10: test_splits.py)
    assert len(by_question) >= 190 and 0.10 <= splits["test"] / len(by_question) <= 0.20
    assert 0.15 <= (splits["test"] + splits["validation"]) / len(by_question) <= 0.25


def test_training_and_eval_draws_never_share_a_question() -> None:
    eval_questions: set[str] = set()
    validation_questions: set[str] = set()
    train_questions: set[str] = set()
    for seed in (0, 1):
        source = tasks.TaskSource(seed=seed)
        eval_refs = source.eval_refs(32)  # the whole test split, each question once
        assert eval_refs == tasks.TaskSource(seed=seed).eval_refs(32)  # deterministic
        eval_questions |= questions(eval_refs)
        validation_questions |= questions(source.eval_refs(10, "validation"))
        rng = random.Random(seed)
        train_questions |= questions([r for _ in range(100) for r in source.draw(rng, 16)])  # 1600 draws
    assert eval_questions and train_questions and not eval_questions & train_questions
    assert not validation_questions & (eval_questions | train_questions)
    assert all(tasks.is_heldout_question("chain_sum", q) for q in eval_questions | validation_questions)
    assert (len(eval_questions), len(validation_questions)) == (32, 10)
    # together they cover the whole problem space
    assert len(eval_questions) + len(validation_questions) + len(train_questions) == 200


TOK = build_char_tokenizer()
SOURCE = tasks.TaskSource()


def held_out_group() -> RolloutGroup:
    ref = tasks.TaskRef(SOURCE.name, SOURCE.config, 0, 5)
    inst = tasks.instance(ref)
    assert inst.question == QUESTION
    comps = tuple(CompletionWire(tuple(TOK.encode(t) + [TOK.eos_token_id]), t, (-0.5,) * (len(t) + 1), r)
                  for t, r in ((inst.answer, 1.0), ("x", 0.0)))
    return RolloutGroup(b"\x02" * 16, "peerA", 1, TaskRefWire(ref.dataset, ref.config, ref.seed, ref.index),
                        comps, tokenizer_hash(TOK), "qwen2", 1000.0)


def test_a_peer_group_on_a_held_out_question_is_dropped_and_counted() -> None:
    ctx = ShareContext(TOK, tokenizer_hash(TOK), SOURCE, CompletionBounds(8, 256, len(TOK), 2))
    out = accept_external(held_out_group(), "peerA", ctx, 1000.0)
    assert (out.external, out.reason) == (None, "heldout")
    stats = NodeStats()
    ingest = Ingest(ctx, stats)
    dropped = ingest([Received("peerA", 1000.0, held_out_group())], 1000.0, lambda ext, sender: [])
    assert dropped == {"heldout": 1} and stats.snapshot()["dropped"] == {"heldout": 1}
    assert ingest.peer_drops[("peerA", "heldout")] == 1


class AnswerBook(Sampler):
    """Answers from a book of prompt -> answer (wrong when the prompt is not in it), then EOS."""

    def __init__(self, book: dict[str, str]) -> None:
        self.book = book

    def generate(self, prompts: list[list[int]], n: int, params: SamplingParams) -> list[list[Completion]]:
        out = []
        for ids in prompts:
            text = self.book.get(TOK.decode(ids), "wrong")
            ids = TOK.encode(text) + [TOK.eos_token_id]  # stopped, as a sampler's completion does
            out.append([Completion(ids, text, [0.0] * len(ids), 0)] * n)
        return out

    def load_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        pass


def test_eval_result_per_task_on_a_hand_built_case() -> None:
    """Five eval problems over a mix of two (3 chain_sum + 2 leg_counting): all chain_sum right, one leg_counting."""
    source = tasks.TaskSource(mix=[{"name": "chain_sum"}, {"name": "leg_counting"}])
    insts = [tasks.instance(r) for r in source.eval_refs(5)]
    assert [i.ref.dataset for i in insts] == ["chain_sum"] * 3 + ["leg_counting"] * 2
    book = {i.prompt: i.answer for i in insts[:4]}
    result = evaluate(AnswerBook(book), TOK, source, problems=5, samples=2)
    assert result.problems == 5 and result.greedy_acc == 0.8
    assert result.per_task == {"chain_sum": 1.0, "leg_counting": 0.5}
    assert result.sampled_reward == 0.8
    assert [o[2] for o in result.outcomes] == [1.0, 1.0, 1.0, 1.0, 0.0]  # one outcome per problem, in order
    assert str(result) == "greedy accuracy 0.800 on 5 problems (chain_sum 1.000, leg_counting 0.500)"


class ShapedBook(Sampler):
    """Completions from a book of prompt -> (text, whether EOS ends it): a completion without EOS was cut."""

    def __init__(self, book: dict[str, tuple[str, bool]]) -> None:
        self.book = book

    def generate(self, prompts: list[list[int]], n: int, params: SamplingParams) -> list[list[Completion]]:
        out = []
        for ids in prompts:
            text, stopped = self.book[TOK.decode(ids)]
            ids = TOK.encode(text) + [TOK.eos_token_id] * stopped
            out.append([Completion(ids, text, [0.0] * len(ids), 0)] * n)
        return out

    def load_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        pass


def test_eval_result_says_which_greedy_completions_were_well_formed() -> None:
    """Five problems (3 chain_sum + 2 leg_counting): right then EOS, right but cut (no EOS), wrong then EOS; two
    lines then EOS, right then EOS. Well-formed: 3 of 5 (chain_sum 2 of 3, leg_counting 1 of 2); right: 2 of 5."""
    source = tasks.TaskSource(mix=[{"name": "chain_sum"}, {"name": "leg_counting"}])
    insts = [tasks.instance(r) for r in source.eval_refs(5)]
    shapes = [(insts[0].answer, True), (insts[1].answer, False), ("wrong", True), (f"{insts[3].answer}\nx", True),
              (insts[4].answer, True)]
    book = {i.prompt: shape for i, shape in zip(insts, shapes, strict=True)}
    result = evaluate(ShapedBook(book), TOK, source, problems=5)
    assert result.well_formed == (True, False, True, False, True)
    assert [o[2] for o in result.outcomes] == [1.0, 0.0, 0.0, 0.0, 1.0]
    assert result.greedy_acc == 0.4 and result.per_task == {"chain_sum": 1 / 3, "leg_counting": 0.5}
    assert result.well_formed_frac() == 0.6
    assert result.well_formed_frac("chain_sum") == 2 / 3 and result.well_formed_frac("leg_counting") == 0.5
    assert result.well_formed_frac("gcd") is None  # no problem of that dataset
    assert EvalResult(0.5, None, 4, {"chain_sum": 0.5}).well_formed_frac() is None  # built without flags


def test_eval_reports_its_progress_after_each_batch() -> None:
    source = tasks.TaskSource(mix=[{"name": "chain_sum"}, {"name": "leg_counting"}])
    book = {tasks.instance(r).prompt: tasks.instance(r).answer for r in source.eval_refs(5)}
    calls: list[tuple[int, int]] = []
    evaluate(AnswerBook(book), TOK, source, problems=5, batch=2,
             progress=lambda done, total: calls.append((done, total)))
    assert calls == [(2, 5), (4, 5), (5, 5)]


def test_heldout_line_without_a_before_eval() -> None:
    from cli.main import heldout_line

    after = EvalResult(0.5, None, 4, {"chain_sum": 0.5})
    assert heldout_line(None, after) == "held-out greedy accuracy 0.500 on 4 problems (chain_sum 0.500)"
    before = EvalResult(0.25, None, 4, {"chain_sum": 0.25})
    assert heldout_line(before, after) == ("held-out greedy accuracy 0.250 -> 0.500 (before -> after training; change "
                                           "[95% interval]) on 4 problems (chain_sum 0.250 -> 0.500)")


def test_heldout_line_pairs_the_two_evals_question_by_question() -> None:
    """With per-question outcomes, the change carries its paired interval: 4 questions, one gained, none lost."""
    from cli.main import heldout_line

    rows = [("chain_sum", "q1"), ("chain_sum", "q2"), ("gcd", "q3"), ("gcd", "q4")]
    before = EvalResult(0.25, None, 4, {"chain_sum": 0.5, "gcd": 0.0},
                        outcomes=tuple((d, q, r) for (d, q), r in zip(rows, (1.0, 0.0, 0.0, 0.0), strict=True)))
    after = EvalResult(0.5, None, 4, {"chain_sum": 0.5, "gcd": 0.5},
                       outcomes=tuple((d, q, r) for (d, q), r in zip(rows, (1.0, 0.0, 1.0, 0.0), strict=True)))
    assert after.by_question("gcd") == {"gcd\0q3": 1.0, "gcd\0q4": 0.0}
    line = heldout_line(before, after)
    assert line.startswith("held-out greedy accuracy 0.250 -> 0.500 (+0.250 [+0.000, +0.750]) (before -> after")
    assert "(chain_sum 0.500 -> 0.500 (+0.000 [+0.000, +0.000]), gcd 0.000 -> 0.500 (+0.500 [+0.000, +1.000]))" in line


def test_an_eval_says_how_many_distinct_questions_its_problems_are() -> None:
    """An eval built with repeats says so (the first default mix's 200 problems were 113 distinct questions); an eval
    draw is distinct questions only: 200 problems of the default mix are 200 questions, and the first mix, too
    small for them, is an error naming its smallest entry."""
    from cli.main import heldout_line

    after = EvalResult(0.5, None, 200, {"chain_sum": 0.5}, distinct=113)
    assert str(after) == "greedy accuracy 0.500 on 200 problems (113 distinct questions)"
    assert heldout_line(None, after).endswith("on 200 problems (113 distinct questions) (chain_sum 0.500)")
    assert str(EvalResult(0.5, None, 4, {}, distinct=4)) == "greedy accuracy 0.500 on 4 problems"
    from swarm_node.config import NodeConfig

    source = NodeConfig().task.build_source()
    insts = [tasks.instance(r) for r in source.eval_refs(200)]
    assert len({(i.ref.dataset, i.question) for i in insts}) == 200
    small = tasks.TaskSource(mix=tasks.MIXES["small-2026-11"])
    with pytest.raises(UserError, match=r"^task mix entry chain_sum .*: its test split has 32 distinct questions, "
                                        r"fewer than the 50 the eval asks for;"):
        small.eval_refs(200)
