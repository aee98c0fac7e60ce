"""A tiny shaped model warmed up supervised on think-answer traces (200 steps, ~1 minute on one busy core) answers
held-out problems in that format, greedy: `<think>` .. `</think>`, `<answer>X</answer>`, then one EOS."""

from __future__ import annotations

import re

import pytest
import torch

from swarm_node import tasks
from swarm_node.model.shapes import SHAPES, build_shaped_model, generation_config
from swarm_node.model.warmup import WarmupSettings, supervised_warm_up, think_answer_draw

THINK_ANSWER = re.compile(r"<think>\n(?:[^<\n]+\n)+</think>\n<answer>[^<\n]+</answer>")


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_warmed_up_model_writes_think_answer(shape: str) -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # deterministic and quick on a busy machine
    try:
        model, tokenizer = build_shaped_model(shape, seed=0)

        def prompt(inst: tasks.TaskInstance) -> str:
            return tokenizer.apply_chat_template([{"role": "user", "content": inst.question}], tokenize=False,
                                                 add_generation_prompt=True, date_string="01 Jan 2026")

        def prompt_ids(inst: tasks.TaskInstance) -> list[int]:
            return tokenizer.encode(prompt(inst), add_special_tokens=False)  # the template writes any BOS itself

        # the first default mix: its traces fit max_new_tokens = 80 below (gcd up to 1,000 takes up to 15 lines)
        source = tasks.TaskSource(seed=5, selection="balanced", mix=tasks.MIXES["small-2026-11"])
        draw = think_answer_draw(tokenizer, source, prompt_ids)
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        losses = supervised_warm_up(model, draw, WarmupSettings(steps=200, batch=16, lr=1e-2, seed=0), pad_id)
        assert losses[-1] < losses[0] / 5

        eos_ids = set(generation_config(shape, tokenizer).eos_token_id)
        special = set(tokenizer.all_special_ids) | {tokenizer.convert_tokens_to_ids(t)
                                                    for t in SHAPES[shape].tokenizer.special_tokens}
        well_formed = 0
        problems = [tasks.instance(ref) for ref in source.eval_refs(16)]
        for inst in problems:
            ids = torch.tensor([prompt_ids(inst)])
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=80, do_sample=False,
                                 eos_token_id=sorted(eos_ids), pad_token_id=pad_id)
            completion = out[0, ids.shape[1]:].tolist()
            body = completion[:-1]
            ok = (completion[-1] in eos_ids and not special & set(body)
                  and THINK_ANSWER.fullmatch(tokenizer.decode(body)) is not None)
            well_formed += ok
        assert well_formed >= 14, f"{well_formed} of {len(problems)} well-formed"
    finally:
        torch.set_num_threads(threads)
