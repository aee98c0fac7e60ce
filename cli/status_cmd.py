"""`swarm-node status [URL]`: fetch a node's GET /status and print it as rich tables.

Contract: `print_status(url, token)` reads `<url>/status` (URL defaults to the local node's status server; a bare
`host:port` gets `http://`; a `?token=` in the URL is used when no token is given) with a short timeout and a
bounded read, and prints an overview, the peers, rollout groups, drop reasons, staleness and errors. Problems
the user can fix (node not running, token missing or wrong, not a status server) raise `UserError` with one
line. `status_tables(status)` is the pure part: JSON dict in, rich renderables out.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import parse_qs, urlsplit, urlunsplit

from rich.console import Console, RenderableType
from rich.table import Table
from rich.text import Text

from swarm_node.errors import UserError

DEFAULT_STATUS_URL = "http://127.0.0.1:8470/"  # swarm_node.status.DEFAULT_STATUS_PORT, without importing aiohttp
TIMEOUT_S = 5.0
MAX_BYTES = 8 * 1024 * 1024
SPARK = "▁▂▃▄▅▆▇█"


def status_endpoint(url: str) -> tuple[str, str | None]:
    """(the /status URL, a token found in the URL's query) for what the user typed."""
    if "://" not in url:
        url = "http://" + url
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise UserError(f"not a status URL: {url!r} (expected e.g. {DEFAULT_STATUS_URL})")
    token = (parse_qs(parts.query).get("token") or [None])[0]
    path = parts.path if parts.path.endswith("/status") else parts.path.rstrip("/") + "/status"
    return urlunsplit((parts.scheme, parts.netloc, path, "", "")), token


def fetch_status(url: str, token: str | None) -> dict[str, Any]:
    endpoint, url_token = status_endpoint(url)
    token = token or url_token
    request = urllib.request.Request(endpoint, headers={"Accept": "application/json"})
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            body = response.read(MAX_BYTES + 1)
    except urllib.error.HTTPError as exc:
        if exc.code == 401:
            raise UserError(f"the status server at {endpoint} needs its token: pass --token "
                            "(the node prints it at start)") from exc
        raise UserError(f"the status server at {endpoint} answered HTTP {exc.code}") from exc
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise UserError(f"cannot reach a node's status server at {endpoint}: {reason}") from exc
    if len(body) > MAX_BYTES:
        raise UserError(f"the answer from {endpoint} is larger than {MAX_BYTES} bytes; not a status server?")
    try:
        status = json.loads(body)
    except ValueError as exc:
        raise UserError(f"the answer from {endpoint} is not JSON; not a swarm-node status server?") from exc
    if not isinstance(status, dict) or "phase" not in status:
        raise UserError(f"the answer from {endpoint} is not a swarm-node status")
    return status


def print_status(url: str, token: str | None, console: Console | None = None) -> None:
    """Fetch a node's status and print it."""
    status = fetch_status(url or DEFAULT_STATUS_URL, token)
    console = console or Console()
    for renderable in status_tables(status):
        console.print(renderable)


def status_tables(status: dict[str, Any]) -> list[RenderableType]:
    """The overview table, then peers, groups and drops, staleness and errors."""
    reward, accuracy = status.get("reward") or {}, status.get("accuracy") or {}
    history = status.get("history") or []
    overview = Table(title="swarm-node status", show_header=False, title_justify="left")
    overview.add_column("field", style="bold")
    overview.add_column("value")
    total = status.get("total_steps")
    rows: list[tuple[str, str]] = [
        ("phase", str(status.get("phase"))),
        ("peer id", str(status.get("peer_id") or "-")),
        ("role", str(status.get("role") or "-")),
        ("listening on", "\n".join(status.get("listen_addrs") or []) or "- (no network)"),
        ("step", _num(status.get("step")) + (f" of {_num(total)}" if total is not None else "")),
        ("policy version", _num(status.get("policy_version"))),
        ("reward", f"{_num(reward.get('recent'), 3)} (avg {_num(reward.get('moving_avg'), 3)})  "
                   f"{sparkline([h.get('reward_mean') for h in history])}"),
        ("accuracy", f"{_num(accuracy.get('recent'), 3)} (avg {_num(accuracy.get('moving_avg'), 3)})"),
        ("tokens/s", _num(status.get("tokens_per_s"), 0)),
        ("experience pool", _num(status.get("pool_size"))),
        ("last checkpoint", _mapping(status.get("last_checkpoint")) or "none yet"),
        ("broadcast", _mapping(status.get("broadcast")) or "-"),
        ("uptime", _duration(status.get("uptime_s"))),
    ]
    for name, value in rows:
        overview.add_row(name, Text(value))  # Text, not markup: peer ids and reasons come from the network
    out: list[RenderableType] = [overview]

    known = status.get("peers_total", len(status.get("peers") or []))
    peers = Table(title=f"peers ({status.get('peers_connected', known)} connected now, {known} known)",
                  title_justify="left")
    for column in ("peer", "latency ms", "accepted", "rejected", "score", "state"):
        peers.add_column(column, justify="left" if column in ("peer", "state") else "right")
    for peer in status.get("peers") or []:
        peers.add_row(Text(str(peer.get("peer_id"))), _num(peer.get("latency_ms"), 1), _num(peer.get("accepted")),
                      _num(peer.get("rejected")), _num(peer.get("score"), 2), Text(str(peer.get("state") or "ok")))
    if not status.get("peers"):
        peers.add_row("no peers connected", "", "", "", "", "")
    out.append(peers)

    groups = Table(title="rollout groups", title_justify="left")
    groups.add_column("kind")
    groups.add_column("count", justify="right")
    for kind in ("produced", "received", "used"):
        groups.add_row(kind, _num((status.get("groups") or {}).get(kind, 0)))
    for reason, count in sorted((status.get("dropped") or {}).items(), key=lambda kv: -kv[1]):
        groups.add_row(Text(f"dropped: {reason}"), _num(count), style="red")
    out.append(groups)

    staleness = status.get("staleness") or {}
    if staleness:
        table = Table(title="staleness of used rollouts", title_justify="left")
        table.add_column("versions behind", justify="right")
        table.add_column("rollouts", justify="right")
        for lag, count in sorted(staleness.items(), key=lambda kv: int(kv[0])):
            table.add_row(Text(str(lag)), _num(count))
        out.append(table)
    errors = status.get("errors") or {}
    if errors:
        table = Table(title="errors", title_justify="left")
        table.add_column("kind")
        table.add_column("count", justify="right")
        for kind, count in sorted(errors.items()):
            table.add_row(Text(kind), _num(count), style="red")
        out.append(table)
    return out


def sparkline(values: list[Any], width: int = 40) -> str:
    """The last `width` numeric values as block characters scaled between their min and max."""
    numbers = [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)][-width:]
    if len(numbers) < 2:
        return ""
    lo, hi = min(numbers), max(numbers)
    span = hi - lo or 1.0
    return "".join(SPARK[min(len(SPARK) - 1, int((v - lo) / span * len(SPARK)))] for v in numbers)


def _num(value: Any, digits: int | None = None) -> str:
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return "-"
    if digits is None:
        return f"{value:,}" if isinstance(value, int) else f"{value:,.2f}"
    return f"{value:,.{digits}f}"


def _mapping(value: Any) -> str:
    if not isinstance(value, dict):
        return ""
    return ", ".join(f"{k}={v}" for k, v in value.items())


def _duration(seconds: Any) -> str:
    if not isinstance(seconds, (int, float)):
        return "-"
    s = int(seconds)
    return f"{s // 3600}h {s % 3600 // 60:02d}m {s % 60:02d}s" if s >= 3600 else f"{s // 60}m {s % 60:02d}s"
