"""A node with a prompt format (issue 29 item 1): its prompts, scoring, share context and group signer all use the
format; the default stays answer-line for a model without a chat template; a budget too small is one line."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from swarm_node.config import load_config
from swarm_node.errors import UserError
from swarm_node.model.default_model import load_tokenizer
from swarm_node.node.assembly import Sharing, assemble
from swarm_node.node.run_files import NodeEvents
from tests.unit.test_prompt_formats import LLAMA_LIKE


def with_template(tiny_model_dir: Path, tmp_path: Path) -> Path:
    path = tmp_path / "chat-model"
    shutil.copytree(tiny_model_dir, path)
    tok = load_tokenizer(path)
    tok.chat_template = LLAMA_LIKE
    tok.save_pretrained(path)
    return path


def config(model: Path, tmp_path: Path, **extra: object) -> object:
    return load_config(None, {"model.path": str(model), "sampler.kind": "hf", "run.steps": 1,
                              "run.prompts_per_step": 2, "run.group_size": 2, "run.eval_problems": 0,
                              "run.run_dir": str(tmp_path / "run"), "train.threads": 1, "status.port": -1,
                              "run.memory_guard": False, **extra})


def test_a_node_in_the_boxed_format_with_a_chat_template(tiny_model_dir: Path, tmp_path: Path) -> None:
    model = with_template(tiny_model_dir, tmp_path)
    parts = assemble(config(model, tmp_path, **{"task.prompt_format": "boxed", "sampler.max_new_tokens": 12}),
                     Sharing.ROLLOUTS, events=NodeEvents(log=lambda _m: None))
    node = parts.node
    try:
        assert node.prompter.name == "boxed" and node.prompter.chat
        assert parts.signer.prompt_format == "boxed" and parts.context.prompter is node.prompter
        groups, _, _ = node.generate_groups()
        for g in groups:
            assert list(g.prompt_ids) == node.prompter.ids(g.inst)
            text = node.tokenizer.decode(list(g.prompt_ids))
            assert "Today Date: 26 Jul 2024" in text and text.endswith("<|assistant|>\n")
            assert len(g.correct) == len(g.completions) == 2
    finally:
        node.close()


def test_the_embedded_models_default_stays_answer_line(tiny_model_dir: Path, tmp_path: Path) -> None:
    parts = assemble(config(tiny_model_dir, tmp_path), Sharing.ROLLOUTS, events=NodeEvents(log=lambda _m: None))
    try:
        assert parts.node.prompter.name == "answer-line" and parts.signer.prompt_format == "answer-line"
    finally:
        parts.node.close()


def test_a_budget_too_small_for_the_format_stops_the_node_in_one_line(tiny_model_dir: Path, tmp_path: Path) -> None:
    model = with_template(tiny_model_dir, tmp_path)
    with pytest.raises(UserError, match=r"^prompt format 'think-answer' needs a generation budget of at least 37 "
                                        r"tokens \(its shortest well-formed completion, EOS included\), got "
                                        r"--max-new-tokens 8$"):
        assemble(config(model, tmp_path), events=NodeEvents(log=lambda _m: None))  # the model's own: think-answer
