"""Every command's --help renders (option defaults such as [/ip4/...] are plain text, not markup)."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from cli.main import app


@pytest.mark.parametrize(("command", "option"), [
    ("solo", "--max-staleness"), ("join", "--listen"), ("join", "--cost-per-hour"), ("simulate", "--transport"),
    ("plan", "--worker"), ("status", "--token"), ("keygen", "--force"),
])
def test_help_renders(command: str, option: str) -> None:
    result = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert option in result.output


@pytest.mark.parametrize(("command", "option", "default"), [
    ("solo", "--steps", "[200]"), ("solo", "--sampler", "auto | vllm | native | hf [auto]"),
    ("solo", "--lr", "[5e-05]"),
    ("join", "--external-correction", "none | is | ftis | decoupled [is]"), ("join", "--upnp", "[on]"),
    ("join", "--listen", "[/ip4/0.0.0.0/tcp/0]"), ("join", "--role", "[peer]"),
    ("solo", "--max-new-tokens", "[0]"), ("join", "--max-new-tokens", "[0]"), ("solo", "--max-model-len", "[0]"),
    ("solo", "--temperature", "[the model's own"), ("join", "--lora-rank", "[0]"),
    ("join", "--filter-no-signal", "[on]"),
])
def test_help_shows_the_config_default(command: str, option: str, default: str) -> None:
    result = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "250"})
    entries = re.split(r"\n(?=  -)", result.output)  # an option's entry: its line and the wrapped ones after it
    entry = " ".join(next(e for e in entries if e.split()[0] == option).split())
    assert default in entry, entry


def test_flags_become_config_keys_by_the_table() -> None:
    from cli.options import NODE_KEYS, default_of, node_overrides
    from swarm_node.config import load_config

    for key in NODE_KEYS.values():
        default_of(key)  # every key the table names exists in the config
    overrides = node_overrides({"steps": 7, "external_correction": "ftis", "sampler": None, "resume": False,
                                "task_option": ["max_value=12"], "task": "gcd", "memory_budget": "1GiB"})
    assert overrides == {"run.steps": 7, "share.correction.kind": "ftis", "sampler.kind": None, "run.resume": None,
                         "task.options": {"max_value": 12}, "task.name": "gcd", "run.memory_budget_mib": 1024}
    cfg = load_config(None, overrides)
    assert (cfg.run.steps, cfg.share.correction.kind, cfg.run.memory_budget_mib) == (7, "ftis", 1024)


def test_the_model_settings_users_need_are_flags() -> None:
    from cli.options import node_overrides
    from swarm_node.config import load_config

    cfg = load_config(None, node_overrides({"max_new_tokens": 1024, "max_model_len": 1536, "temperature": 0.7,
                                            "lora_rank": 16, "sampler": "vllm"}))
    assert (cfg.sampler.max_new_tokens, cfg.sampler.max_model_len, cfg.sampler.temperature, cfg.train.lora_rank) == \
        (1024, 1536, 0.7, 16)


@pytest.mark.parametrize("command", ["solo", "join", "simulate"])
def test_prompt_format_flag_names_the_formats_and_the_models_own_default(command: str) -> None:
    result = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "250"})
    entries = re.split(r"\n(?=  -)", result.output)
    entry = " ".join(next(e for e in entries if e.split()[0] == "--prompt-format").split())
    assert "answer-line | think-answer | boxed [the model's own: answer-line for the embedded model, think-answer " \
           "with a chat template]" in entry, entry


def test_prompt_format_flag_sets_the_task_key() -> None:
    from cli.options import node_overrides
    from swarm_node.config import load_config

    assert load_config(None, node_overrides({"prompt_format": "think-answer"})).task.prompt_format == "think-answer"
    assert load_config(None, node_overrides({"prompt_format": None})).task.prompt_format == ""
