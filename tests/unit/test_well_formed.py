"""Well-formed completions (issue 14 item 5): the answer alone, then EOS. A right first line followed by junk,
padded to the budget, or never stopped passes the verifier (`parse_answer` reads the first line) but scores 0, for
our own groups and peers' groups alike, so it never gets a positive advantage."""

from __future__ import annotations

import pytest

from protocol.messages import CompletionWire, RolloutGroup, TaskRefWire
from swarm_node import tasks
from swarm_node.model.tokenizer import build_char_tokenizer, tokenizer_hash
from swarm_node.sharing.rescore import CompletionBounds, ShareContext, accept_external
from swarm_node.train.scoring import score_group
from swarm_node.types import Completion

NOW = 1_700_000_000.0
TOK = build_char_tokenizer()
EOS = TOK.eos_token_id
SPECIAL = frozenset(TOK.all_special_ids)
SOURCE = tasks.TaskSource()
REF = tasks.TaskRef(SOURCE.name, SOURCE.config, SOURCE.seed, 7)  # "6 + 0 =", a training problem
INST = tasks.instance(REF)
ANSWER = INST.answer  # "6"
MAX_NEW = 8  # the node's budget: ids per completion, EOS included
PROMPT_IDS = TOK.encode(INST.prompt)


def ids_text(text: str, eos: bool = True) -> tuple[list[int], str]:
    return TOK.encode(text) + ([EOS] if eos else []), text


# (name, token ids, text, well-formed); every one's first line but "wrong" is the right answer.
CASES = [
    ("answer+eos", *ids_text(ANSWER), True),
    ("answer+newline+junk+eos", *ids_text(ANSWER + "\n+ 0 ="), False),
    ("answer padded to the budget", *ids_text(ANSWER + " " * (MAX_NEW - 2)), False),
    ("answer cut without eos", *ids_text(ANSWER, eos=False), False),  # the text alone would be perfect
    ("wrong answer+eos", *ids_text("7"), True),
]


def completions(cases: list[tuple[str, list[int], str, bool]]) -> list[Completion]:
    return [Completion(ids, text, [-0.5] * len(ids), 0) for _, ids, text, _ in cases]


@pytest.mark.parametrize(("name", "ids", "text", "ok"), CASES)
def test_definition(name: str, ids: list[int], text: str, ok: bool) -> None:
    assert len(ids) <= MAX_NEW
    assert tasks.well_formed(ids, text, EOS, SPECIAL) is ok, name


def test_definition_edges() -> None:
    assert not tasks.well_formed([EOS], "", EOS)  # no answer at all
    assert not tasks.well_formed([], "", EOS)
    assert not tasks.well_formed(TOK.encode("6") + [EOS, EOS], "6", EOS)  # more than one EOS
    assert not tasks.well_formed(TOK.encode(" 6") + [EOS], " 6", EOS)  # leading padding
    assert not tasks.well_formed(TOK.encode("6\t") + [EOS], "6\t", EOS)
    cut = "6\n6\n6\n6\n"[:MAX_NEW]  # repeating to max_new_tokens: cut off, no EOS
    assert not tasks.well_formed(TOK.encode(cut), cut, EOS)
    pad = TOK.pad_token_id  # special ids decode to nothing: padding the ids with them is not the answer alone
    assert not tasks.well_formed(TOK.encode("6") + [pad] * 5 + [EOS], "6", EOS, SPECIAL)
    assert tasks.well_formed(TOK.encode("1 2") + [EOS], "1 2", EOS, SPECIAL)  # inner spaces are the answer's


def test_score_group_zeroes_malformed_completions() -> None:
    group = score_group(INST, PROMPT_IDS, completions(CASES), SOURCE.reward, eos_id=EOS, special_ids=SPECIAL)
    assert group.rewards == (1.0, 0.0, 0.0, 0.0, 0.0)
    assert group.advantages[0] > 0 and all(a <= 0 for a in group.advantages[1:])
    # without an EOS id the check is skipped: the first line alone decides (the verifier's view)
    unchecked = score_group(INST, PROMPT_IDS, completions(CASES), SOURCE.reward)
    assert unchecked.rewards == (1.0, 1.0, 1.0, 1.0, 0.0)


def test_partial_credit_mode_is_zero_when_malformed() -> None:
    partial = tasks.TaskSource(reward="score")
    cases = [ids_text("-" + ANSWER), ids_text("-" + ANSWER + "\njunk"), ids_text("-" + ANSWER, eos=False)]
    comps = [Completion(ids, text, [-0.5] * len(ids), 0) for ids, text in cases]
    group = score_group(INST, PROMPT_IDS, comps, partial.reward, eos_id=EOS, special_ids=SPECIAL)
    assert group.rewards[0] == pytest.approx(0.5) and group.rewards[1:] == (0.0, 0.0)


def ctx(group_size: int) -> ShareContext:
    bounds = CompletionBounds(max_completion_tokens=MAX_NEW, max_context=len(PROMPT_IDS) + MAX_NEW,
                              vocab_size=len(TOK), group_size=group_size)
    return ShareContext(TOK, tokenizer_hash(TOK), SOURCE, bounds)


def wire(cases: list[tuple[str, list[int], str, bool]], claimed: float = 1.0,
         tok_hash: str | None = None) -> RolloutGroup:
    comps = tuple(CompletionWire(tuple(ids), text, (-0.5,) * len(ids), claimed) for _, ids, text, _ in cases)
    return RolloutGroup(b"\x01" * 16, "peerA", 3, TaskRefWire(REF.dataset, REF.config, REF.seed, REF.index),
                        comps, tok_hash or tokenizer_hash(TOK), "qwen2", NOW)


def test_verifier_passing_junk_from_a_peer_is_dropped() -> None:
    junk = CASES[1:4]  # every first line is right, none is well-formed
    assert all(tasks.score(INST, text) == 1.0 for _, _, text, _ in junk)
    out = accept_external(wire(junk), "peerA", ctx(len(junk)), NOW)
    assert (out.external, out.reason, out.malformed) == (None, "zero_advantage", 3)
    # kept (a learner keeps no-signal groups): all rewards 0, so every advantage is 0
    kept = accept_external(wire(junk), "peerA", ctx(len(junk)), NOW, keep_no_signal=True)
    assert kept.external.group.rewards == (0.0,) * 3 and kept.external.group.advantages == (0.0,) * 3


def test_mixed_group_only_the_well_formed_right_answer_gains() -> None:
    out = accept_external(wire(CASES, claimed=0.0), "peerA", ctx(len(CASES)), NOW)
    g = out.external.group
    assert out.malformed == 3 and g.rewards == (1.0, 0.0, 0.0, 0.0, 0.0)
    assert g.advantages[0] > 0 and all(a <= 0 for a in g.advantages[1:])


def test_retokenized_text_is_checked_too() -> None:
    """Another tokenizer: we append our EOS, so the text alone decides; a second line is still malformed."""
    cases = [("right", [], ANSWER, True), ("junk", [], ANSWER + "\njunk", False)]
    out = accept_external(wire(cases, claimed=0.0, tok_hash="other"), "peerA", ctx(2), NOW)
    assert out.external.retokenized and out.malformed == 1 and out.external.group.rewards == (1.0, 0.0)
