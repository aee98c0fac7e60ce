"""Held-out splits and eval draws: the test and validation buckets of known questions; neither split is drawn for
training or taken from a peer; an eval draws distinct questions of one split, 4,000 of them (1,000 per specialty)
from the default mix; a mix entry too small for its eval is one line naming it; the embedded mixes by name."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import pytest

from protocol.messages import CompletionWire, RolloutGroup, TaskRefWire
from swarm_node import tasks
from swarm_node.config import load_config
from swarm_node.errors import ConfigError, UserError
from swarm_node.model.tokenizer import build_char_tokenizer, tokenizer_hash
from swarm_node.sharing.rescore import CompletionBounds, ShareContext, accept_external

DEFAULT = tasks.MIXES["reasoning-2026-11"]
SMALL = tasks.MIXES["small-2026-11"]
CHAIN = "State the final answer to the following arithmetic problem: {} ="
GCD = "Find the Greatest Common Divisor (GCD) of these numbers: {}. Give only the GCD as your final answer."
BITS = "How many 1 bits are there in the binary representation of the number {}?"
# (dataset, question, its bucket: sha256(dataset + NUL + question) mod 100)
KNOWN = [
    ("chain_sum", CHAIN.format("8 - 0"), 5),  # test
    ("chain_sum", CHAIN.format("13 + 21"), 17),  # validation
    ("chain_sum", CHAIN.format("47 - 85 + 9"), 48),
    ("gcd", GCD.format("6, 9"), 12),  # test
    ("gcd", GCD.format("900, 150"), 20),  # the first training bucket
    ("gcd", GCD.format("610, 987"), 36),
    ("count_bits", BITS.format(65535), 7),  # test
    ("count_bits", BITS.format(4001), 19),  # the last validation bucket
    ("count_bits", BITS.format(255), 88),
    ("basic_arithmetic", "Calculate 12 * 34.", 81),
]
# The distinct questions of each split, by enumeration of the question texts (docs/TASK_MIX.md)
CHAIN_TEST, CHAIN_VALIDATION = 32, 10  # one-digit chain_sum (the single-task default), of 200
GCD_30_TEST = 117  # gcd over 1-30, of 900
SMALL_MAX_EVAL = 4 * CHAIN_TEST  # "small-2026-11": test splits of 32, 52, 117 and 35 questions
# Seed 0's first 500 indices per specialty of the default mix that fall in the validation split
VALIDATION_IN_FIRST_500 = {"chain_sum": 28, "basic_arithmetic": 28, "gcd": 35, "count_bits": 24}
VALIDATION_INDEX, VALIDATION_QUESTION = 6, CHAIN.format("4 + 0")  # one-digit chain_sum, seed 0
FIRST_TEST_INDICES = [11, 12, 18, 27]  # chain_sum's first test questions of the default mix's eval stream
# indices each eval stream of the default mix scans for 1,000 distinct test questions
TEST_INDICES_SCANNED = {"chain_sum": 9533, "basic_arithmetic": 7491, "gcd": 6920, "count_bits": 7218}


def split_of(dataset: str, question: str) -> str:
    return next((s for s in tasks.SPLITS if tasks.in_split(s, dataset, question)), "train")


def test_the_splits_and_the_buckets_of_known_questions() -> None:
    assert dict(tasks.SPLITS) == {"test": range(0, 15), "validation": range(15, 20)}
    assert tasks.EVAL_PERCENT == 15 and tasks.HELDOUT_BUCKETS == frozenset(range(20))
    for dataset, question, expected in KNOWN:
        assert tasks.bucket(dataset, question) == expected
        split = "test" if expected < 15 else "validation" if expected < 20 else "train"
        assert split_of(dataset, question) == split
        assert tasks.is_heldout_question(dataset, question) == (split != "train")
    with pytest.raises(KeyError, match="unknown eval split 'dev'; choose one of test, validation"):
        tasks.in_split("dev", "gcd", GCD.format("2, 4"))
    with pytest.raises(UserError, match="^unknown eval split 'dev'; choose one of test, validation$"):
        tasks.TaskSource().eval_refs(0, "dev")


def test_training_draws_never_take_a_test_or_validation_question() -> None:
    source = tasks.TaskSource(mix=DEFAULT, selection="balanced")
    rng = random.Random(0)
    refs = [r for _ in range(50) for r in source.draw(rng, 40)]
    assert Counter(r.dataset for r in refs) == {name: 500 for name in source.names}
    assert min(tasks.bucket(r.dataset, tasks.instance(r).question) for r in refs) == 20
    # not vacuous: the first 500 indices of each specialty's training seed hold this many validation questions
    data = {name: tasks.dataset(name, tasks.canonical_config(spec["options"]), 0) for name, spec in
            zip(source.names, DEFAULT, strict=True)}
    validation = {name: sum(tasks.in_split("validation", name, d[i]["question"]) for i in range(500))
                  for name, d in data.items()}
    assert validation == VALIDATION_IN_FIRST_500


TOK = build_char_tokenizer()


def test_a_peer_group_on_a_validation_question_is_dropped_as_heldout() -> None:
    source = tasks.TaskSource()  # one-digit chain_sum
    ref = tasks.TaskRef(source.name, source.config, 0, VALIDATION_INDEX)
    inst = tasks.instance(ref)
    assert (inst.question, split_of("chain_sum", inst.question)) == (VALIDATION_QUESTION, "validation")
    comps = tuple(CompletionWire(tuple(TOK.encode(t) + [TOK.eos_token_id]), t, (-0.5,) * (len(t) + 1), r)
                  for t, r in ((inst.answer, 1.0), ("x", 0.0)))
    group = RolloutGroup(b"\x03" * 16, "peerA", 1, TaskRefWire(ref.dataset, ref.config, ref.seed, ref.index),
                         comps, tokenizer_hash(TOK), "qwen2", 1000.0)
    ctx = ShareContext(TOK, tokenizer_hash(TOK), source, CompletionBounds(8, 256, len(TOK), 2))
    out = accept_external(group, "peerA", ctx, 1000.0)
    assert (out.external, out.reason) == (None, "heldout")


def test_an_eval_of_the_default_mix_is_4000_distinct_test_questions_1000_per_specialty() -> None:
    source = tasks.TaskSource(mix=DEFAULT)
    refs = source.eval_refs(4000)
    assert Counter(r.dataset for r in refs) == {name: 1000 for name in source.names}
    assert {r.seed for r in refs} == {tasks.EVAL_SEED_OFFSET}
    questions = [(r.dataset, tasks.dataset(r.dataset, r.config, r.seed)[r.index]["question"]) for r in refs]
    assert len(set(questions)) == 4000 and all(tasks.in_split("test", d, q) for d, q in questions)
    assert [r.index for r in refs[:4]] == FIRST_TEST_INDICES
    # how far each specialty's stream went for its 1,000 (chain_sum repeats its 200 one-digit sums most)
    assert {name: source._eval[("test", name)].next_index for name in source.names} == TEST_INDICES_SCANNED
    assert source.eval_refs(10) == refs[:3] + refs[1000:1003] + refs[2000:2002] + refs[3000:3002]  # a prefix


def test_a_validation_eval_is_disjoint_from_the_test_eval_and_deterministic() -> None:
    source = tasks.TaskSource(mix=DEFAULT)
    validation = source.eval_refs(400, "validation")
    assert validation == tasks.TaskSource(mix=DEFAULT).eval_refs(400, "validation")
    assert Counter(r.dataset for r in validation) == {name: 100 for name in source.names}
    val_questions = {(r.dataset, tasks.instance(r).question) for r in validation}
    test_questions = {(r.dataset, tasks.instance(r).question) for r in source.eval_refs(400)}
    assert len(val_questions) == 400 and not val_questions & test_questions
    assert all(split_of(d, q) == "validation" for d, q in val_questions)


def test_a_split_smaller_than_its_eval_is_one_line_naming_the_entry() -> None:
    source = tasks.TaskSource(mix=[{"name": "gcd", "options": {"max_value": 30}}])
    with pytest.raises(tasks.SplitTooSmall) as err:
        source.eval_refs(1000)
    assert str(err.value) == (f"task mix entry gcd {{max_value: 30}}: its test split has {GCD_30_TEST} distinct "
                              "questions, fewer than the 1,000 the eval asks for; enlarge its options or lower "
                              "--eval-problems")
    stream = source._eval[("test", "gcd")]
    assert stream.exhausted and stream.since_new == tasks.GIVE_UP_RUN  # gave up after 10,000 indices with nothing new
    assert len(source.eval_refs(GCD_30_TEST)) == GCD_30_TEST  # all of them are there to be had
    # in a mix, the entry that is too small is named, with its share of the eval
    mixed = tasks.TaskSource(mix=[DEFAULT[0], {"name": "gcd", "options": {"max_value": 30}}])
    with pytest.raises(UserError, match=rf"^task mix entry gcd {{max_value: 30}}: its test split has {GCD_30_TEST} "
                                        r"distinct questions, fewer than the 2,000 the eval asks for;"):
        mixed.eval_refs(4000)


def test_one_digit_chain_sum_has_exactly_its_splits(tmp_path: Path) -> None:
    """The single-task default keeps its 200 questions: all of its test split is an eval, one more is the error."""
    source = tasks.TaskSource()
    assert len({tasks.instance(r).question for r in source.eval_refs(CHAIN_TEST)}) == CHAIN_TEST
    assert len(source.eval_refs(CHAIN_VALIDATION, "validation")) == CHAIN_VALIDATION
    with pytest.raises(tasks.SplitTooSmall, match=rf"^task mix entry chain_sum {{max_digits: 1, max_terms: 2, "
                                                  rf"min_digits: 1, min_terms: 2}}: its test split has {CHAIN_TEST} "
                                                  rf"distinct questions, fewer than the {CHAIN_TEST + 1} the eval"):
        source.eval_refs(CHAIN_TEST + 1)
    path = tmp_path / "c.toml"
    path.write_text('[task]\nname = "chain_sum"\n')
    assert load_config(path).task.build_source().config == tasks.canonical_config(tasks.DEFAULT_TASK_OPTIONS)


def test_the_embedded_mixes_by_name(tmp_path: Path) -> None:
    assert tasks.DEFAULT_MIX_NAME == "reasoning-2026-11" and tasks.DEFAULT_MIX is DEFAULT
    assert [(e["name"], e["options"]) for e in SMALL] == [
        ("chain_sum", {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}),
        ("basic_arithmetic", {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1,
                              "operators": ["+", "-", "*"], "allow_parentheses": False, "allow_negation": False}),
        ("gcd", {"min_value": 1, "max_value": 30}), ("count_bits", {"min_n": 1, "max_n": 255})]
    assert [(e["name"], e["options"]) for e in DEFAULT] == [
        ("chain_sum", {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 2}),
        ("basic_arithmetic", {"min_terms": 2, "max_terms": 2, "min_digits": 2, "max_digits": 2,
                              "operators": ["+", "-", "*"], "allow_parentheses": False, "allow_negation": False}),
        ("gcd", {"min_value": 1, "max_value": 1000}), ("count_bits", {"min_n": 1, "max_n": 65535})]
    path = tmp_path / "c.toml"
    path.write_text('[task]\nmix_name = "small-2026-11"\n')
    task = load_config(path).task
    assert task.specialties() == list(SMALL)
    task.specialties()[0]["options"]["max_digits"] = 9  # a copy: the embedded mix is not changed through it
    assert SMALL[0]["options"]["max_digits"] == 1
    source = task.build_source(eval_problems=SMALL_MAX_EVAL)  # the largest eval its smallest test split fills
    assert [s.config for s in source.mix] == [tasks.canonical_config(e["options"]) for e in SMALL]
    with pytest.raises(tasks.SplitTooSmall, match=r"^task mix entry chain_sum .* fewer than the 50 the eval asks"):
        task.build_source(eval_problems=200)  # the old default eval: 50 per specialty
    for text, message in [('mix_name = "big"', "task.mix_name 'big' unknown; choose one of small-2026-11, "
                                                "reasoning-2026-11"),
                          ('mix_name = "small-2026-11"\nname = "gcd"',
                           "task.mix_name names a whole mix: set it without task.mix or task.name")]:
        path.write_text(f"[task]\n{text}\n")
        with pytest.raises(ConfigError) as err:
            load_config(path)
        assert message in str(err.value) and "\n" not in str(err.value)
