"""Saying when nothing is learnt (train/signal.py): the streak, the cause measured from the completions, once."""

from __future__ import annotations

from pathlib import Path

from swarm_node import tasks
from swarm_node.config import load_config
from swarm_node.node.core import Node, NodeEvents
from swarm_node.train.signal import SignalWatch
from swarm_node.types import Completion, ScoredGroup

EOS = 1
INST = tasks.TaskInstance(tasks.TaskRef("chain_sum", "{}", 0, 0), "q", "7", "q\nAnswer: ", {})


def group(ids: list[tuple[int, ...]], texts: list[str], rewards: list[float]) -> ScoredGroup:
    comps = [Completion(i, t, [-0.1] * len(i), 0) for i, t in zip(ids, texts, strict=True)]
    adv = [r - sum(rewards) / len(rewards) for r in rewards]
    return ScoredGroup(INST, (5,), comps, rewards, adv)


CUT = group([(7, 7, 7, 7)] * 2, ["7777", "7777"], [0.0, 0.0])  # 4 tokens of a 4-token budget, no EOS
MALFORMED = group([(7, 9, EOS)] * 2, ["7\n9", "7\n9"], [0.0, 0.0])  # ended, but two lines
WRONG = group([(8, EOS)] * 2, ["8", "8"], [0.0, 0.0])
RIGHT = group([(7, EOS)] * 2, ["7", "7"], [1.0, 1.0])
SIGNAL = group([(7, EOS), (8, EOS)], ["7", "8"], [1.0, 0.0])


def watch() -> SignalWatch:
    return SignalWatch(after_steps=3, max_new_tokens=4, eos_id=EOS)


def test_the_cause_is_what_most_completions_were() -> None:
    for groups, cause in (([CUT, CUT, WRONG], "cut"), ([MALFORMED, MALFORMED, CUT], "malformed"),
                          ([WRONG, WRONG, RIGHT], "all_wrong"), ([RIGHT, RIGHT, WRONG], "all_right")):
        w = watch()
        reports = [w.observe(groups) for _ in range(3)]
        assert reports[:2] == [None, None] and reports[2] is not None
        assert reports[2].cause == cause and reports[2].steps == 3


def test_said_once_per_streak_and_again_after_signal() -> None:
    w = watch()
    said = [w.observe([CUT]) is not None for _ in range(5)]
    assert said == [False, False, True, False, False]
    assert w.observe([CUT, SIGNAL]) is None and w.streak == 0
    assert [w.observe([WRONG]) is not None for _ in range(3)] == [False, False, True]
    report = watch()
    for _ in range(3):
        last = report.observe([CUT])
    assert last is not None
    assert last.status(4) == {"steps": 3, "cause": "cut", "counts": {"cut": 6, "all_wrong": 3},
                              "message": last.line(4)}
    assert "raise --max-new-tokens" in last.line(4) and "4 tokens" in last.line(4)


def test_a_node_whose_groups_never_have_signal_says_why(tiny_model_dir: Path, tmp_path: Path) -> None:
    """The tiny random model never answers a two-digit sum: every group is all wrong, and the node says so."""
    cfg = load_config(None, {"model.path": str(tiny_model_dir), "sampler.kind": "hf", "run.steps": 21,
                             "run.prompts_per_step": 1, "run.group_size": 2, "run.eval_problems": 0,
                             "run.run_dir": str(tmp_path / "run"), "train.threads": 1, "status.port": -1,
                             "task.name": "chain_sum", "task.options": {"min_terms": 2, "max_terms": 2,
                                                                        "min_digits": 2, "max_digits": 2}})
    lines: list[str] = []
    node = Node(cfg, events=NodeEvents(log=lines.append))
    try:
        node.run()
    finally:
        node.close()
    said = [line for line in lines if line.startswith("warning: no training signal")]
    assert len(said) == 1 and "for 20 steps" in said[0]
    status = node.stats.snapshot()["training_signal"]
    assert status["steps"] == 20 and status["cause"] in ("cut", "malformed")  # a random model answers nothing
