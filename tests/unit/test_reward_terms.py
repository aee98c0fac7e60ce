"""Rewards beyond correctness (issue 29 item 2): the format bonus and the length penalty, registered by name, added
to a well-formed completion's correctness only; accuracy still counts right answers; defaults change nothing."""

from __future__ import annotations

import pytest

from swarm_node import tasks
from swarm_node.config import load_config
from swarm_node.errors import ConfigError
from swarm_node.model.tokenizer import build_char_tokenizer
from swarm_node.train.scoring import score_group
from swarm_node.types import Completion

TOK = build_char_tokenizer()
EOS = TOK.eos_token_id
SOURCE = tasks.TaskSource()
INST = tasks.instance(tasks.TaskRef(SOURCE.name, SOURCE.config, SOURCE.seed, 7))  # "6 + 0 =", answer 6
BUDGET = 8


def comp(text: str, eos: bool = True) -> Completion:
    ids = TOK.encode(text) + ([EOS] if eos else [])
    return Completion(ids, text, [-0.5] * len(ids), 0)


# right (2 ids with EOS), wrong, and right but malformed (cut: no EOS)
GROUP = [comp("6"), comp("7"), comp("6", eos=False)]


def rewards(terms: tasks.RewardTerms) -> tuple[float, ...]:
    group = score_group(INST, [5], GROUP, SOURCE.reward, eos_id=EOS, terms=terms)
    assert group.correct == (True, False, False) and group.accuracy == pytest.approx(1 / 3)
    return group.rewards


def test_terms_are_registered_by_name() -> None:
    assert sorted(tasks.REWARD_TERMS) == ["format_bonus", "length_penalty"]
    with pytest.raises(KeyError, match="unknown reward term 'brevity'"):
        tasks.RewardTerms((("brevity", 1.0),), BUDGET)
    with pytest.raises(ValueError, match="need the generation budget"):
        tasks.RewardTerms((("format_bonus", 0.1),))


def test_no_terms_is_correctness_alone() -> None:
    assert rewards(tasks.NO_TERMS) == (1.0, 0.0, 0.0)
    assert rewards(load_config().task.reward_terms(BUDGET)) == (1.0, 0.0, 0.0)  # the defaults are off


def test_format_bonus_rewards_every_well_formed_completion_only() -> None:
    assert rewards(tasks.RewardTerms((("format_bonus", 0.1),), BUDGET)) == (1.1, 0.1, 0.0)


def test_length_penalty_scales_right_answers_by_their_tokens() -> None:
    # the right answer uses 2 of 8 ids: 1 - 0.5 * 2 / 8
    assert rewards(tasks.RewardTerms((("length_penalty", 0.5),), BUDGET)) == (0.875, 0.0, 0.0)
    both = load_config(overrides={"task.format_bonus": 0.1, "task.length_penalty": 0.5}).task.reward_terms(BUDGET)
    assert rewards(both) == pytest.approx((0.975, 0.1, 0.0))


def test_config_checks_the_terms_and_the_format() -> None:
    with pytest.raises(ConfigError, match=r"^task.length_penalty must be >= 0, got -0.1$"):
        load_config(overrides={"task.length_penalty": -0.1})
    with pytest.raises(ConfigError, match=r"task.length_penalty at most 1, got 0.0 and 1.5$"):
        load_config(overrides={"task.length_penalty": 1.5})
    with pytest.raises(ConfigError, match=r"^task.prompt_format 'nope' unknown; choose one of answer-line, "
                                          r"think-answer, boxed \(empty: the model's own\)$"):
        load_config(overrides={"task.prompt_format": "nope"})
    assert load_config(overrides={"task.prompt_format": "boxed"}).task.prompt_format == "boxed"
