"""Sharing: wire conversion, re-scoring of untrusted groups, drop reasons, tokenizer handling, IS weights."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from protocol.codec import decode, encode
from protocol.limits import Limits
from protocol.messages import CompletionWire, RolloutBatch, RolloutGroup, TaskRefWire
from swarm_node import tasks
from swarm_node.config import SamplerConfig, TrainConfig
from swarm_node.model.default_model import load_model
from swarm_node.model.tokenizer import build_char_tokenizer, tokenizer_hash
from swarm_node.sampler.base import Completion
from swarm_node.sharing.corrections import external_samples, policy_logprobs, sequence_is_weight
from swarm_node.sharing.pool import PoolEntry
from swarm_node.sharing.rescore import CompletionBounds, ShareContext, accept_external
from swarm_node.sharing.wire import group_id_for, to_wire, wire_spans
from swarm_node.train.scoring import score_group
from swarm_node.train.trainer import Trainer
from swarm_node.types import Origin, TrainSample

NOW = 1_700_000_000.0
TOK = build_char_tokenizer()
SOURCE = tasks.TaskSource()
REF = tasks.TaskRef(SOURCE.name, SOURCE.config, SOURCE.seed, 7)  # a training problem ("6 + 0 =", not held out)
INST = tasks.instance(REF)
EOS = TOK.eos_token_id
PROMPT_LEN = len(TOK.encode(INST.prompt))
MAX_NEW = 8
BOUNDS = CompletionBounds(max_completion_tokens=MAX_NEW, max_context=PROMPT_LEN + MAX_NEW, vocab_size=len(TOK),
                          group_size=2)
CTX = ShareContext(TOK, tokenizer_hash(TOK), SOURCE, BOUNDS)


def completion(text: str, claimed: float, lp: float = -0.5) -> CompletionWire:
    ids = TOK.encode(text) + [EOS]
    return CompletionWire(tuple(ids), text, tuple([lp] * len(ids)), claimed)


def wire(*completions: CompletionWire, sender: str = "peerA", ref: tasks.TaskRef = REF, created: float = NOW,
         tok_hash: str | None = None) -> RolloutGroup:
    return RolloutGroup(b"\x01" * 16, sender, 3, TaskRefWire(ref.dataset, ref.config, ref.seed, ref.index),
                        completions, tok_hash or CTX.tokenizer_hash, "qwen2", created)


def test_honest_group_is_rescored_with_our_verifier() -> None:
    out = accept_external(wire(completion(INST.answer, 1.0), completion("9999", 0.0)), "peerA", CTX, NOW)
    assert out.reason == "" and not out.forged_reward
    g = out.external.group
    assert g.rewards == (1.0, 0.0) and g.advantages == (1.0, -1.0)
    assert g.origin == Origin.peer("peerA") and g.prompt_ids == tuple(TOK.encode(INST.prompt))
    assert g.completions[0].token_ids == (*TOK.encode(INST.answer), EOS)
    assert not out.external.retokenized


def test_forged_rewards_are_ignored_and_flagged() -> None:
    # claims the wrong answer is right and vice versa: our scores win, the sender is flagged
    out = accept_external(wire(completion(INST.answer, 0.0), completion("9999", 1.0)), "peerA", CTX, NOW)
    assert out.forged_reward and out.external.group.rewards == (1.0, 0.0)
    # all-wrong group claimed correct: zero advantage after re-scoring, dropped and still flagged
    out = accept_external(wire(completion("9999", 1.0), completion("8888", 1.0)), "peerA", CTX, NOW)
    assert (out.external, out.reason, out.forged_reward) == (None, "zero_advantage", True)


def test_text_is_ours_not_the_senders() -> None:
    """Same tokenizer: we score our decoding of the token ids; a lying text field cannot buy a reward."""
    lying = CompletionWire(tuple(TOK.encode("9999") + [EOS]), INST.answer, (-0.5,) * 5, 1.0)
    out = accept_external(wire(lying, completion(INST.answer, 1.0)), "peerA", CTX, NOW)
    assert out.external.group.rewards == (0.0, 1.0) and out.external.group.completions[0].text == "9999"


@pytest.mark.parametrize(("group", "sender", "reason"), [
    (wire(completion("1", 0.0), sender="peerB"), "peerA", "forged_attribution"),
    (wire(completion("1", 0.0), created=NOW + 31), "peerA", "future"),
    (wire(completion("1", 0.0), created=NOW - 601), "peerA", "stale"),
    (wire(completion("1", 0.0), ref=tasks.TaskRef("basic_arithmetic", "{}", 0, 1)), "peerA", "task_not_allowed"),
    (wire(completion("1", 0.0), ref=tasks.TaskRef("chain_sum", '{"max_terms":9}', 0, 1)), "peerA",
     "task_not_allowed"),
    (wire(completion("1", 0.0), ref=dataclasses.replace(REF, seed=77)), "peerA", "task_not_allowed"),
    (wire(completion("1", 0.0), ref=dataclasses.replace(REF, index=tasks.DATASET_SIZE)), "peerA",
     "task_not_allowed"),
    # Groups of our group size (2), so that the completion's own fault is what drops them.
    (wire(CompletionWire((500,), "x", (-0.1,), 0.0), completion("1", 0.0)), "peerA", "token_out_of_vocab"),
    (wire(CompletionWire((5, 6), "x", (-0.1, 0.2), 0.0), completion("1", 0.0)), "peerA", "bad_logprob"),
    (wire(CompletionWire((5, 6), "x", (-0.1, math.nan), 0.0), completion("1", 0.0)), "peerA", "bad_logprob"),
])
def test_drop_reasons(group: RolloutGroup, sender: str, reason: str) -> None:
    out = accept_external(group, sender, CTX, NOW)
    assert (out.external, out.reason) == (None, reason)


def test_other_tokenizer_retokenizes_the_text() -> None:
    foreign = (CompletionWire((1, 2, 3), INST.answer, (-0.1,) * 3, 1.0), CompletionWire((4,), "9999", (-0.1,), 0.0))
    out = accept_external(wire(*foreign, tok_hash="other"), "peerA", CTX, NOW)
    ext = out.external
    assert ext.retokenized and ext.group.rewards == (1.0, 0.0)
    assert ext.group.completions[0].token_ids == (*TOK.encode(INST.answer), EOS)
    assert ext.group.completions[0].logprobs == ()


def test_content_key_ignores_order_and_group_id() -> None:
    a = accept_external(wire(completion(INST.answer, 1.0), completion("99", 0.0)), "peerA", CTX, NOW)
    b = accept_external(dataclasses.replace(wire(completion("99", 0.0), completion(INST.answer, 1.0)),
                                                    group_id=b"\x02" * 16), "peerA", CTX, NOW)
    assert a.external.key == b.external.key
    c = accept_external(wire(completion(INST.answer, 1.0), completion("98", 0.0)), "peerA", CTX, NOW)
    assert c.external.key != a.external.key


def test_to_wire_round_trip_through_accept() -> None:
    comps = [Completion(TOK.encode(t) + [EOS], t, [-0.25] * (len(t) + 1) + [], 2) for t in (INST.answer, "77")]
    comps[0] = Completion(comps[0].token_ids, comps[0].text, (*comps[0].logprobs[:-1], 1e-9), 2)  # rounding
    local = score_group(INST, TOK.encode(INST.prompt), comps)
    w = to_wire(local, "peerA", 2, CTX.tokenizer_hash, "qwen2", NOW, group_id_for("peerA", 0, 0, 0))
    assert w.completions[0].logprobs[-1] == 0.0 and w.completions[0].claimed_reward == 1.0
    out = accept_external(w, "peerA", CTX, NOW)
    assert not out.forged_reward and out.external.group.rewards == local.rewards
    assert len(w.group_id) == 16 and w.group_id != group_id_for("peerA", 0, 1, 0)


def _ids(text: str) -> list[int]:
    return [*TOK.encode(text), EOS]


def test_to_wire_carries_the_spans_of_resumed_and_older_completions_and_rescore_keeps_them() -> None:
    """Group version 3: a completion APRIL resumed (tokens 0-1 by version 1, the rest by 3) carries its spans, one
    carried over and finished by version 2 carries the single span (0, 2), a fresh one none; through the codec, a
    receiver of our tokenizer rebuilds each with the same versions (not the group's 3 for all)."""
    resumed = Completion(_ids("77"), "77", [-0.5] * 3, 3, ((0, 1), (2, 3)))
    older = Completion(_ids(INST.answer), INST.answer, [-0.5] * len(_ids(INST.answer)), 2)
    fresh = Completion(_ids("9"), "9", [-0.5] * 2, 3)
    local = score_group(INST, TOK.encode(INST.prompt), [resumed, older, fresh])
    w = to_wire(local, "peerA", 3, CTX.tokenizer_hash, "qwen2", NOW, group_id_for("peerA", 0, 0, 0))
    assert [c.spans for c in w.completions] == [((0, 1), (2, 3)), ((0, 2),), ()]
    received = decode(encode(RolloutBatch((w,))), Limits(vocab_size=len(TOK), tokenizer_hash=CTX.tokenizer_hash))
    ctx = dataclasses.replace(CTX, bounds=dataclasses.replace(BOUNDS, group_size=3))
    out = accept_external(received.groups[0], "peerA", ctx, NOW)
    got = out.external.group.completions
    assert [(c.version, c.spans) for c in got] == [(3, ((0, 1), (2, 3))), (2, ()), (3, ())]
    assert [c.oldest_version for c in got] == [1, 2, 3] and out.external.group.oldest_version == 1
    assert got[1] == dataclasses.replace(older, logprobs=got[1].logprobs)  # as the sender held it (float32 aside)


def test_wire_spans_leave_out_spans_without_tokens() -> None:
    # A resume that added no token under version 2 (a span starting where the next does), and one at the end.
    c = Completion(_ids("77"), "77", [-0.5] * 3, 4, ((0, 1), (1, 2), (1, 3), (3, 4)))
    assert wire_spans(c, 4) == ((0, 1), (1, 3))
    assert wire_spans(Completion(_ids("77"), "77", [-0.5] * 3, 4, ((0, 2), (0, 4))), 4) == ()  # all by version 4
    assert wire_spans(Completion([], "", [], 2), 4) == ()  # no token: no span to carry


def test_another_tokenizer_takes_the_oldest_span_version() -> None:
    """Re-tokenized text: the sender's token indices do not map to our ids, so a resumed completion counts as old
    as its oldest span, as one span; one without spans takes the group's version."""
    foreign = (CompletionWire((1, 2, 3), INST.answer, (-0.1,) * 3, 1.0, ((0, 1), (2, 3))),
               CompletionWire((4,), "9999", (-0.1,), 0.0))
    out = accept_external(wire(*foreign, tok_hash="other"), "peerA", CTX, NOW)
    assert out.external.retokenized
    assert [(c.version, c.spans) for c in out.external.group.completions] == [(1, ()), (3, ())]


def test_sequence_is_weight_is_truncated() -> None:
    assert sequence_is_weight([-1.0, -1.0], [-1.0, -1.0], 2.0) == 1.0
    assert sequence_is_weight([-2.0, -2.0], [-1.0, -1.0], 2.0) == pytest.approx(math.exp(-1.0))
    # a sender claiming its tokens were nearly impossible cannot enlarge the gradient past the cap
    assert sequence_is_weight([-0.1], [-1e30], 2.0) == 2.0
    assert sequence_is_weight([-0.1, -0.3], [-0.2, -0.2], 1.5) == pytest.approx(1.0)
    assert sequence_is_weight([], [], 2.0) == 1.0


def test_external_samples_are_on_policy_and_is_only_shrinks(tiny_model_dir: Path) -> None:
    model, tok = load_model(tiny_model_dir)
    trainer = Trainer(model, TrainConfig(minibatches=1), SamplerConfig(), tok.pad_token_id)
    out = accept_external(wire(completion(INST.answer, 1.0, lp=-50.0), completion("9999", 0.0, lp=-1e-3)),
                                  "peerA", ShareContext(tok, tokenizer_hash(tok), SOURCE, BOUNDS), NOW)
    entry = PoolEntry(out.external.group, "peerA", out.external.key, 0)
    plain = external_samples(trainer, [entry], "none", 1.0)
    local = policy_logprobs(trainer, plain)
    assert [list(s.behaviour_logprobs) for s in plain] == local  # ratio 1 at the first minibatch
    assert [s.advantage for s in plain] == [1.0, -1.0]
    weighted = external_samples(trainer, [entry], "is", 1.0)
    # completion 0: sender claims lp -50 per token -> ratio huge -> capped at 1, never enlarged; completion 1:
    # sender claims near-certainty -> ratio exp(mean(local) + 1e-3) < 1 shrinks it
    expected_1 = math.exp(sum(x + 1e-3 for x in local[1]) / len(local[1]))
    assert weighted[0].advantage == 1.0
    assert weighted[1].advantage == pytest.approx(-expected_1) and abs(weighted[1].advantage) < 1.0
    retok = external_samples(trainer, [dataclasses.replace(entry, retokenized=True)], "is", 1.0)
    assert [s.advantage for s in retok] == [1.0, -1.0]  # no sender log-probs for another tokenizer
    with pytest.raises(ValueError, match="cap must be in \\(0, 1\\]"):
        external_samples(trainer, [entry], "is", 2.0)


BOUNDED = CTX


def ids_completion(ids: list[int], claimed: float = 0.0) -> CompletionWire:
    return CompletionWire(tuple(ids), "ignored", (-0.5,) * len(ids), claimed)


def test_a_group_exactly_at_the_bounds_is_accepted() -> None:
    right = completion(INST.answer, 1.0)
    stopped = completion("9" * (MAX_NEW - 1), 0.0)  # max_new_tokens new tokens, the last one EOS
    truncated = ids_completion(TOK.encode("9" * MAX_NEW))  # max_new_tokens new tokens, no EOS: cut off
    top = ids_completion(TOK.encode("9" * (MAX_NEW - 1)) + [len(TOK) - 1])  # the highest id in the vocabulary
    for other in (stopped, truncated, top):
        assert len(other.token_ids) == MAX_NEW
        out = accept_external(wire(right, other), "peerA", BOUNDED, NOW)
        assert out.reason == "" and out.external.group.rewards == (1.0, 0.0)
    retok = accept_external(wire(right, CompletionWire((7,), "9" * (MAX_NEW - 1), (-0.1,), 0.0), tok_hash="other"),
                            "peerA", BOUNDED, NOW)  # re-tokenized: 7 characters + our EOS = 8 ids
    assert retok.reason == "" and retok.external.retokenized
    assert len(retok.external.group.completions[1].token_ids) == MAX_NEW


@pytest.mark.parametrize(("group", "bounds", "reason"), [
    # a peer with a larger max_new_tokens: its longer completions drop the group
    (wire(completion(INST.answer, 1.0), completion("9" * MAX_NEW, 0.0)), BOUNDS, "over_length"),
    (wire(completion(INST.answer, 1.0), ids_completion([5] * 4096)), BOUNDS, "over_length"),
    (wire(completion(INST.answer, 1.0), CompletionWire((4,), "9" * MAX_NEW, (-0.1,), 0.0), tok_hash="other"),
     BOUNDS, "over_length"),  # 8 characters re-tokenized + EOS = 9 ids
    (wire(completion(INST.answer, 1.0), completion("9" * (MAX_NEW - 1), 0.0)),
     dataclasses.replace(BOUNDS, max_context=PROMPT_LEN + MAX_NEW - 1), "over_context"),
    (wire(completion(INST.answer, 1.0), CompletionWire((4,), "9" * (MAX_NEW - 1), (-0.1,), 0.0), tok_hash="other"),
     dataclasses.replace(BOUNDS, max_context=PROMPT_LEN + MAX_NEW - 1), "over_context"),
    (wire(completion(INST.answer, 1.0), ids_completion([5, len(TOK)])), BOUNDS, "token_out_of_vocab"),
    (wire(completion(INST.answer, 1.0), ids_completion([5, -1])), BOUNDS, "token_out_of_vocab"),
    # a model with fewer embedding rows than the tokenizer has ids: both paths check the model's vocabulary
    (wire(completion(INST.answer, 1.0), ids_completion([5, TOK.convert_tokens_to_ids("~")])),
     dataclasses.replace(BOUNDS, vocab_size=TOK.convert_tokens_to_ids("~")), "token_out_of_vocab"),
    (wire(completion(INST.answer, 1.0), CompletionWire((4,), "9~", (-0.1,), 0.0), tok_hash="other"),
     dataclasses.replace(BOUNDS, vocab_size=TOK.convert_tokens_to_ids("~")), "token_out_of_vocab"),
    (wire(completion(INST.answer, 1.0), completion("9", 0.0), completion("8", 0.0)), BOUNDS, "group_size"),
    (wire(completion(INST.answer, 1.0)), BOUNDS, "group_size"),
])
def test_groups_over_our_bounds_are_dropped(group: RolloutGroup, bounds: CompletionBounds, reason: str) -> None:
    out = accept_external(group, "peerA", dataclasses.replace(CTX, bounds=bounds), NOW)
    assert (out.external, out.reason) == (None, reason)


def test_bounds_are_checked_before_any_decoding_or_scoring(monkeypatch: pytest.MonkeyPatch) -> None:
    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("computed on a group over the bounds")

    monkeypatch.setattr(TOK, "decode", forbidden)
    monkeypatch.setattr(tasks, "instance", forbidden)
    monkeypatch.setattr(SOURCE, "reward", forbidden)
    attack = wire(completion(INST.answer, 1.0), ids_completion([5] * 4096))
    assert accept_external(attack, "peerA", BOUNDED, NOW).reason == "over_length"
    too_many = wire(*[ids_completion([5] * 4096)] * 64)
    assert accept_external(too_many, "peerA", BOUNDED, NOW).reason == "group_size"


def test_bounds_must_be_positive_ints() -> None:
    with pytest.raises(ValueError, match="group_size"):
        CompletionBounds(8, 256, 99, 0)
    with pytest.raises(ValueError, match="max_context"):
        CompletionBounds(8, 256.0, 99, 8)  # type: ignore[arg-type]


def test_policy_logprobs_in_microbatches_match_one_batch(tiny_model_dir: Path) -> None:
    model, tok = load_model(tiny_model_dir)
    trainer = Trainer(model, TrainConfig(minibatches=1), SamplerConfig(temperature=0.7), tok.pad_token_id)
    prompt = tok.encode(INST.prompt)
    samples = [TrainSample(prompt[: 10 + 7 * k], [20 + k] * (1 + 5 * (k % 3)) + [EOS], [0.0] * (2 + 5 * (k % 3)), 0.0)
               for k in range(9)]
    whole = policy_logprobs(trainer, samples, max_tokens=10**6)
    split = policy_logprobs(trainer, samples, max_tokens=1)  # one row per forward
    assert [len(x) for x in split] == [len(s.completion_ids) for s in samples]
    for a, b in zip(whole, split, strict=True):
        assert a == pytest.approx(b, rel=1e-5, abs=1e-6)
