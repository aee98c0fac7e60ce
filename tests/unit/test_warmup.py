"""The reusable supervised warm-up: loss on completion tokens only, deterministic runs, think-answer examples from
training problems only (EOS appended, BOS where the tokenizer adds one)."""

from __future__ import annotations

import random

import pytest
import torch

from swarm_node import tasks
from swarm_node.model.shapes import ModelSize, build_shaped_model
from swarm_node.model.warmup import (
    WarmupExample,
    WarmupSettings,
    completion_loss_sum,
    supervised_warm_up,
    think_answer_draw,
    think_answer_example,
)
from swarm_node.tasks.traces import TraceError, think_answer_completion

MICRO = ModelSize(hidden_size=32, layers=1, heads=2, kv_heads=1, intermediate_size=64, max_positions=256)


@pytest.fixture(autouse=True)
def one_thread() -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # deterministic and quick on a busy machine
    yield
    torch.set_num_threads(threads)


def test_loss_counts_completion_tokens_only() -> None:
    model, _ = build_shaped_model("qwen2.5-instruct", MICRO, seed=3)
    long, short = WarmupExample((5, 6, 7), (8, 9)), WarmupExample((5,), (10,))
    with torch.no_grad():
        got = completion_loss_sum(model, [long, short], pad_id=0)
        expected = 0.0
        for ex in (long, short):
            ids = list(ex.prompt_ids + ex.completion_ids)
            logp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0], dim=-1)
            for pos in range(len(ex.prompt_ids), len(ids)):  # token at pos is predicted at pos - 1
                expected -= logp[pos - 1, ids[pos]].item()
    assert got.item() == pytest.approx(expected, rel=1e-5)


def test_warm_up_is_deterministic_and_learns() -> None:
    examples = [WarmupExample((1, 2, 3), (4, 5, 6), "a"), WarmupExample((1, 7), (8, 9), "b")]

    def draw(rng: random.Random, count: int) -> list[WarmupExample]:
        return [rng.choice(examples) for _ in range(count)]

    settings = WarmupSettings(steps=30, batch=4, lr=1e-2, seed=1)
    runs = []
    for _ in range(2):
        model, _ = build_shaped_model("qwen2.5-instruct", MICRO, seed=0)
        runs.append((supervised_warm_up(model, draw, settings, pad_id=0), model))
    (losses, model), (again, other) = runs
    assert losses == again
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), other.parameters(), strict=True))
    assert len(losses) == 30 and losses[-1] < losses[0] / 4
    assert not model.training


def test_think_answer_examples() -> None:
    _, llama = build_shaped_model("llama-3-instruct", MICRO)
    source = tasks.TaskSource(seed=5, selection="balanced", mix=tasks.DEFAULT_MIX)
    examples = think_answer_draw(llama, source, lambda inst: llama.encode(inst.question))(random.Random(0), 40)
    assert len(examples) == 40 and {ex.group for ex in examples} == {spec["name"] for spec in tasks.DEFAULT_MIX}
    for ex in examples:
        assert ex.prompt_ids[0] == llama.bos_token_id  # the caller's encoding, BOS included
        assert ex.completion_ids[-1] == llama.eos_token_id
        assert llama.bos_token_id not in ex.completion_ids
        text = llama.decode(list(ex.completion_ids[:-1]))
        assert text.startswith("<think>\n") and "\n</think>\n<answer>" in text and text.endswith("</answer>")

    inst = tasks.instance(source.eval_refs(1)[0])
    with pytest.raises(TraceError, match="is held out: never a training example"):
        think_answer_example(llama, inst, llama.encode(inst.question))
    training = tasks.instance(source.draw(random.Random(1), 1)[0])
    example = think_answer_example(llama, training, [7, 8])
    assert example.prompt_ids == (7, 8)
    assert llama.decode(list(example.completion_ids[:-1])) == think_answer_completion(training)
