"""`swarm-node status`: URL handling, one-line errors, and the rich tables against a live StatusServer."""

from __future__ import annotations

import pytest
from rich.console import Console

from cli.status_cmd import print_status, sparkline, status_endpoint, status_tables
from swarm_node.errors import UserError
from swarm_node.status.server import StatusServer
from swarm_node.status.stats import NodeStats


@pytest.mark.parametrize(("url", "endpoint", "token"), [
    ("127.0.0.1:8470", "http://127.0.0.1:8470/status", None),
    ("http://127.0.0.1:8470/", "http://127.0.0.1:8470/status", None),
    ("http://node.example:9000/status", "http://node.example:9000/status", None),
    ("http://10.0.0.2:8470/?token=abc", "http://10.0.0.2:8470/status", "abc"),
    ("https://host/prefix/", "https://host/prefix/status", None),
])
def test_status_endpoint(url: str, endpoint: str, token: str | None) -> None:
    assert status_endpoint(url) == (endpoint, token)


def test_status_endpoint_rejects_other_schemes() -> None:
    with pytest.raises(UserError, match="not a status URL"):
        status_endpoint("ftp://host/")


def test_sparkline_scales_between_min_and_max() -> None:
    assert sparkline([0.0, 0.5, 1.0, None, "x"]) == "▁▅█"
    assert sparkline([1.0]) == ""
    assert sparkline([2.0, 2.0]) == "▁▁"


def _stats() -> NodeStats:
    stats = NodeStats()
    stats.update(peer_id="12D3KooWSelfNode", role="peer", total_steps=50, pool_size=9)
    stats.set_phase("training")
    for step, reward in ((1, 0.25), (2, 0.75)):
        stats.record_step({"step": step, "policy_version": step, "reward_mean": reward, "accuracy": reward / 2,
                           "tokens_per_s": 1234.0})
    stats.count("groups", "received", 5)
    stats.count("dropped", "[bold]stale[/bold]", 4)  # markup in a network-supplied string stays literal
    stats.count("staleness", 1, 6)
    stats.count("errors", "decode", 2)
    stats.upsert_peer("12D3KooWPeerOne", latency_ms=31.5, score=0.9)
    stats.count_peer_message("12D3KooWPeerOne", accepted=True, n=8)
    return stats


def _printed(url: str, token: str | None) -> str:
    console = Console(record=True, width=140, color_system=None)
    print_status(url, token, console=console)
    return console.export_text()


def test_print_status_shows_the_node() -> None:
    with StatusServer(_stats(), port=0, cache_ttl_s=0.0) as server:
        text = _printed(server.url, None)
    assert "training" in text
    assert "12D3KooWSelfNode" in text
    assert "2 of 50" in text
    assert "0.750 (avg 0.500)" in text
    assert "0.375 (avg 0.250)" in text
    assert "1,234" in text
    lines = {line.strip() for line in text.splitlines()}
    assert any("12D3KooWPeerOne" in line and "31.5" in line and "0.90" in line for line in lines)
    assert any("dropped: [bold]stale[/bold]" in line and line.rstrip("│ ").endswith("4") for line in lines)
    assert any("decode" in line and line.rstrip("│ ").endswith("2") for line in lines)


def test_print_status_with_token() -> None:
    with StatusServer(_stats(), port=0, token="tok-123") as server:
        with pytest.raises(UserError, match="needs its token: pass --token"):
            print_status(server.url, None, console=Console(record=True))
        with pytest.raises(UserError, match="needs its token"):
            print_status(server.url, "wrong", console=Console(record=True))
        assert "12D3KooWSelfNode" in _printed(server.url, "tok-123")
        assert "12D3KooWSelfNode" in _printed(server.url + "?token=tok-123", None)


def test_unreachable_node_is_one_line() -> None:
    with StatusServer(NodeStats(), port=0) as server:
        url = server.url
    with pytest.raises(UserError) as info:  # the server is stopped: nothing listens there now
        print_status(url, None, console=Console(record=True))
    assert str(info.value).startswith(f"cannot reach a node's status server at {url}status: ")
    assert "\n" not in str(info.value)


def test_status_tables_for_an_idle_node() -> None:
    console = Console(record=True, width=100, color_system=None)
    for table in status_tables(NodeStats().snapshot() | {"peers_total": 0}):
        console.print(table)
    text = console.export_text()
    assert "starting" in text and "no peers connected" in text and "none yet" in text
