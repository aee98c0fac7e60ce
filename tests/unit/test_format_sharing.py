"""The prompt format across a swarm (issue 29 item 1): a group names the format it was generated in, a receiver
drops another format's group with its own reason (free of reputation cost), and re-scores its own format's groups
with the prompt it rebuilds itself and the answer its format extracts."""

from __future__ import annotations

from protocol.codec import decode, encode
from protocol.limits import Limits
from protocol.messages import RolloutBatch
from swarm_node import tasks
from swarm_node.model.prompting import build_prompter
from swarm_node.model.tokenizer import build_char_tokenizer, tokenizer_hash
from swarm_node.sharing.reputation import Reputation
from swarm_node.sharing.rescore import CompletionBounds, ShareContext, accept_external
from swarm_node.sharing.wire import GroupSigner
from swarm_node.train.scoring import score_group
from swarm_node.types import Completion
from tests.unit.test_prompt_formats import LLAMA_LIKE

NOW = 1_700_000_000.0
SOURCE = tasks.TaskSource()
REF = tasks.TaskRef(SOURCE.name, SOURCE.config, SOURCE.seed, 7)  # "6 + 0 =", a training problem
INST = tasks.instance(REF)
TEXTS = ("<think>\n6 + 0\n</think>\n<answer>6</answer>", "<think>\n6 - 0\n</think>\n<answer>7</answer>")


def chat_tok() -> object:
    tok = build_char_tokenizer()
    tok.chat_template = LLAMA_LIKE
    return tok


def context(tok: object, fmt: str) -> ShareContext:
    bounds = CompletionBounds(max_completion_tokens=64, max_context=1024, vocab_size=len(tok), group_size=2)
    return ShareContext(tok, tokenizer_hash(tok), SOURCE, bounds, prompter=build_prompter(fmt, tok, 64))


def think_group(tok: object) -> list:
    """Our think-answer group as a SAPO peer publishes it (through the codec, schema 2)."""
    prompter = build_prompter("think-answer", tok, 64)
    comps = [Completion(tok.encode(t) + [tok.eos_token_id], t, [-0.5] * (len(t) + 1), 0) for t in TEXTS]
    group = score_group(INST, prompter.ids(INST), comps, SOURCE.reward, eos_id=tok.eos_token_id, fmt=prompter.fmt)
    assert group.rewards == (1.0, 0.0)
    signer = GroupSigner(tokenizer_hash(tok), "qwen2", 0, prompter.name)
    wires = signer.wire([group], "peerA", 3, "peerA", 0, now=NOW)
    assert wires[0].prompt_format == "think-answer"
    return list(decode(encode(RolloutBatch(tuple(wires))), Limits(vocab_size=len(tok))).groups)


def test_a_group_of_another_format_is_dropped_with_its_reason() -> None:
    tok = chat_tok()
    out = accept_external(think_group(tok)[0], "peerA", context(tok, "answer-line"), NOW)
    assert (out.external, out.reason) == (None, "prompt_format_mismatch")
    rep = Reputation()
    rep.record("peerA", out.reason, NOW)
    assert rep.score("peerA", NOW) == 0.0  # another configuration, not a lie


def test_a_group_of_our_format_is_rescored_with_our_prompt_and_extraction() -> None:
    tok = chat_tok()
    ctx = context(tok, "think-answer")
    out = accept_external(think_group(tok)[0], "peerA", ctx, NOW)
    assert out.reason == "" and not out.forged_reward and out.malformed == 0
    group = out.external.group
    assert group.rewards == (1.0, 0.0) and group.correct == (True, False)
    assert list(group.prompt_ids) == ctx.prompter.ids(INST)  # rebuilt here, through the chat template
    assert group.prompt_ids != tuple(tok.encode(INST.prompt))
