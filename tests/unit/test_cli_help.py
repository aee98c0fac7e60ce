"""Every command's --help renders (option defaults such as [/ip4/...] are plain text, not markup)."""

from __future__ import annotations

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
