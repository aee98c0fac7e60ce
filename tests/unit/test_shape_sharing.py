"""Peers with other tokenizers (issue 29 item 6) on the shaped tokenizers of `model/shapes.py`: a Llama-3-shaped
receiver re-scores a Qwen2.5-shaped sender's think-answer group from its text, and the reverse; the receiver's ids
are its own encoding without special tokens (no BOS) and its EOS, and the group keeps its signal."""

from __future__ import annotations

from dataclasses import replace

import pytest

from protocol.codec import decode, encode
from protocol.errors import WireError
from protocol.limits import Limits
from protocol.messages import RolloutBatch, RolloutGroup
from swarm_node.model.prompting import build_prompter
from swarm_node.model.shapes import SHAPES, shaped_tokenizer
from swarm_node.model.tokenizer import eos_ids, tokenizer_hash
from swarm_node.sharing.rescore import CompletionBounds, ShareContext, accept_external
from swarm_node.sharing.wire import GroupSigner
from swarm_node.train.scoring import score_group
from swarm_node.types import Completion
from tests.unit.test_format_sharing import INST, NOW, SOURCE, TEXTS

FAMILY = {"qwen2.5-instruct": "qwen2", "llama-3-instruct": "llama"}


def generation_eos(shape: str, tok: object) -> tuple[int, ...]:
    return eos_ids(tok, [tok.convert_tokens_to_ids(t) for t in SHAPES[shape].generation_eos])


def sent_group(shape: str) -> RolloutGroup:
    """A right and a wrong think-answer completion, scored and signed by a node of `shape`, through the codec."""
    tok = shaped_tokenizer(shape)
    prompter = build_prompter("think-answer", tok, 64)
    ids = [tok.encode(t, add_special_tokens=False) + [tok.eos_token_id] for t in TEXTS]
    comps = [Completion(i, t, [-0.5] * len(i), 0) for i, t in zip(ids, TEXTS, strict=True)]
    group = score_group(INST, prompter.ids(INST), comps, SOURCE.reward, eos_id=generation_eos(shape, tok),
                        special_ids=frozenset(tok.all_special_ids), fmt=prompter.fmt)
    assert group.rewards == (1.0, 0.0)
    wires = GroupSigner(tokenizer_hash(tok), FAMILY[shape], 0, prompter.name).wire([group], "peerA", 3, "peerA", 0,
                                                                                  now=NOW)
    return decode(encode(RolloutBatch(tuple(wires))), Limits(vocab_size=len(tok))).groups[0]


@pytest.mark.parametrize(("sender", "receiver"), [("qwen2.5-instruct", "llama-3-instruct"),
                                                  ("llama-3-instruct", "qwen2.5-instruct")])
def test_a_peer_of_the_other_shape_is_rescored_from_its_text(sender: str, receiver: str) -> None:
    tok = shaped_tokenizer(receiver)
    ctx = ShareContext(tok, tokenizer_hash(tok), SOURCE, CompletionBounds(max_completion_tokens=64, max_context=1024,
                                                                          vocab_size=len(tok), group_size=2),
                       eos_ids=generation_eos(receiver, tok), prompter=build_prompter("think-answer", tok, 64))
    out = accept_external(sent_group(sender), "peerA", ctx, NOW)
    assert (out.reason, out.forged_reward, out.malformed) == ("", False, 0)
    assert out.external is not None and out.external.retokenized
    group = out.external.group
    assert group.rewards == (1.0, 0.0) and group.correct == (True, False)
    assert [list(c.token_ids) for c in group.completions] == [
        tok.encode(t, add_special_tokens=False) + [tok.eos_token_id] for t in TEXTS]
    assert all(c.token_ids[0] != tok.bos_token_id for c in group.completions)  # Llama's BOS is never prepended
    assert list(group.prompt_ids) == ctx.prompter.ids(INST)  # our own chat template's prompt


def test_a_larger_vocabulary_senders_group_reaches_the_rescoring() -> None:
    sender, receiver = shaped_tokenizer("llama-3-instruct"), shaped_tokenizer("qwen2.5-instruct")
    assert len(sender) > len(receiver)
    group = sent_group("llama-3-instruct")
    high = group.completions[0]
    ids = (*high.token_ids[:-2], len(sender) - 1, high.token_ids[-1])  # a real id of the sender, past the receiver's
    wire = RolloutGroup(group.group_id, group.policy_id, group.policy_version, group.task,
                        (replace(high, token_ids=ids, logprobs=(-0.5,) * len(ids)), *group.completions[1:]),
                        group.tokenizer_hash, group.model_family, group.created_at, group.prompt_format)
    limits = Limits(vocab_size=len(receiver), tokenizer_hash=tokenizer_hash(receiver))
    decoded = decode(encode(RolloutBatch((wire,))), limits).groups
    assert len(decoded) == 1 and decoded[0].completions[0].token_ids[-2] == len(sender) - 1
    ctx = ShareContext(receiver, tokenizer_hash(receiver), SOURCE,
                       CompletionBounds(max_completion_tokens=64, max_context=1024, vocab_size=len(receiver),
                                        group_size=2), eos_ids=generation_eos("qwen2.5-instruct", receiver),
                       prompter=build_prompter("think-answer", receiver, 64))
    out = accept_external(decoded[0], "peerA", ctx, NOW)
    assert out.reason == "" and out.external is not None and out.external.retokenized
    # the same id in a group of the receiver's own tokenizer is past its vocabulary: dropped
    ours = replace(wire, tokenizer_hash=tokenizer_hash(receiver))
    with pytest.raises(WireError) as err:
        decode(encode(RolloutBatch((ours,))), limits)
    assert err.value.reason == "token_out_of_vocab"
    # another tokenizer's ids are still bounded: past max_foreign_vocab is dropped
    with pytest.raises(WireError) as err:
        decode(encode(RolloutBatch((wire,))), replace(limits, max_foreign_vocab=len(sender) - 1))
    assert err.value.reason == "token_out_of_vocab"
