"""`swarm-node peers list | unban` on a run dir's ban file (RUN_DIR/peers.json)."""

from __future__ import annotations

import time
from pathlib import Path

from typer.testing import CliRunner

from cli.main import app
from swarm_node.sharing.reputation import PEERS_FILE, read_bans, write_bans


def test_unban_removes_the_ban_and_list_shows_the_rest(tmp_path: Path) -> None:
    later = time.time() + 3600
    write_bans(tmp_path / PEERS_FILE, {"12D3KooWBad": later, "12D3KooWWorse": later + 60})
    runner = CliRunner()
    listed = runner.invoke(app, ["peers", "list", "--run-dir", str(tmp_path)])
    assert listed.exit_code == 0, listed.output
    assert "12D3KooWBad" in listed.output and "12D3KooWWorse" in listed.output
    result = runner.invoke(app, ["peers", "unban", "12D3KooWBad", "--run-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "unbanned 12D3KooWBad" in result.output
    assert read_bans(tmp_path / PEERS_FILE, time.time()) == {"12D3KooWWorse": later + 60}


def test_unban_of_a_peer_not_banned_is_one_line_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["peers", "unban", "12D3KooWNobody", "--run-dir", str(tmp_path)])
    assert result.exit_code == 2
    assert "is not banned" in result.output and len(result.output.strip().splitlines()) == 1


def test_a_malformed_ban_file_is_one_line_error(tmp_path: Path) -> None:
    (tmp_path / PEERS_FILE).write_text("{oops")
    result = CliRunner().invoke(app, ["peers", "list", "--run-dir", str(tmp_path)])
    assert result.exit_code == 2 and "not valid JSON" in result.output


def test_list_without_bans(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["peers", "list", "--run-dir", str(tmp_path)])
    assert result.exit_code == 0 and "no banned peers" in result.output
