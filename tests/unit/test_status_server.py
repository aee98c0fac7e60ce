"""Status server: every endpoint through aiohttp's test client (JSON, 401, 404, 405, headers, cache), and the
threaded StatusServer on real sockets (start/stop, busy port, generated token, slowloris, connection cap, no
torch import)."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from swarm_node.errors import UserError
from swarm_node.sharing.exchange import RoundStats
from swarm_node.status.server import DEFAULT_STATUS_PORT, StatusServer, build_app, is_loopback
from swarm_node.status.stats import NodeStats

TOKEN = "s3cret-token-for-tests"
Make = Callable[..., Awaitable[TestClient]]


def sample_stats() -> NodeStats:
    stats = NodeStats()
    stats.update(peer_id="12D3KooWSelf", role="peer", listen_addrs=["/ip4/127.0.0.1/tcp/4001"], total_steps=10,
                 pool_size=5, broadcast={"version": 3, "chunks_done": 2, "chunks_total": 8},
                 exchange=RoundStats(round=4, inbound_messages=6, inbound_bytes=1896, pulls_sent=3, pulls_served=3,
                                     pushes_sent=1, by_reason={"hash_mismatch": 1}).as_status(),
                 last_checkpoint={"step": 3, "path": "run/ckpt/step-3"})
    stats.set_phase("training")
    for step, reward, acc in ((1, 0.25, 0.0), (2, 0.5, 0.25), (3, 0.75, 0.5)):
        stats.record_step({"step": step, "policy_version": step, "reward_mean": reward, "accuracy": acc,
                           "tokens_per_s": 1000.0 * step, "loss": 0.5 / step})
    stats.count("groups", "produced", 12)
    stats.count("groups", "received", 7)
    stats.count("groups", "used", 15)
    stats.count("dropped", "stale", 2)
    stats.count("dropped", "duplicate")
    stats.count("errors", "transport")
    stats.count("staleness", 0, 10)
    stats.count("staleness", 2, 5)
    stats.upsert_peer("peer-b", latency_ms=40.0, score=0.5)
    stats.upsert_peer("peer-a", latency_ms=12.5, score=1.0)
    stats.count_peer_message("peer-a", accepted=True, n=9)
    stats.count_peer_message("peer-a", accepted=False)
    return stats


@pytest.fixture
async def make_client() -> AsyncIterator[Make]:
    clients: list[TestClient] = []

    async def make(stats: NodeStats | None = None, token: str | None = None, cache_ttl_s: float = 0.0,
                   handler_timeout_s: float = 5.0) -> TestClient:
        app = build_app(stats or sample_stats(), token, cache_ttl_s=cache_ttl_s,
                        handler_timeout_s=handler_timeout_s)
        client = TestClient(TestServer(app))
        await client.start_server()
        clients.append(client)
        return client

    yield make
    for client in clients:
        await client.close()


async def test_status_json_reports_the_snapshot(make_client: Make) -> None:
    client = await make_client()
    response = await client.get("/status")
    assert response.status == 200
    assert response.content_type == "application/json"
    body = await response.json()
    assert body["phase"] == "training"
    assert (body["peer_id"], body["role"], body["listen_addrs"]) == ("12D3KooWSelf", "peer",
                                                                     ["/ip4/127.0.0.1/tcp/4001"])
    assert (body["step"], body["total_steps"], body["policy_version"]) == (3, 10, 3)
    assert body["reward"] == {"recent": 0.75, "moving_avg": 0.5}  # (0.25 + 0.5 + 0.75) / 3
    assert body["accuracy"] == {"recent": 0.5, "moving_avg": 0.25}
    assert body["tokens_per_s"] == 3000.0
    assert body["groups"] == {"produced": 12, "received": 7, "used": 15}
    assert body["dropped"] == {"stale": 2, "duplicate": 1}
    assert body["errors"] == {"transport": 1}
    assert body["staleness"] == {"0": 10, "2": 5}
    assert body["pool_size"] == 5
    assert body["broadcast"] == {"version": 3, "chunks_done": 2, "chunks_total": 8}
    assert body["exchange"] == {"round": 4, "inbound_messages": 6, "inbound_bytes": 1896, "pulls_sent": 3,
                                "pulls_served": 3, "pushes_sent": 1, "by_reason": {"hash_mismatch": 1}}
    assert body["last_checkpoint"] == {"step": 3, "path": "run/ckpt/step-3"}
    assert body["peers"] == [  # sorted by id
        {"peer_id": "peer-a", "latency_ms": 12.5, "accepted": 9, "rejected": 1, "score": 1.0, "state": "ok"},
        {"peer_id": "peer-b", "latency_ms": 40.0, "accepted": 0, "rejected": 0, "score": 0.5, "state": "ok"},
    ]
    assert body["peers_total"] == 2
    assert [h["step"] for h in body["history"]] == [1, 2, 3]
    assert body["history"][1] == {"step": 2, "policy_version": 2, "reward_mean": 0.5, "accuracy": 0.25,
                                  "tokens_per_s": 2000.0, "loss": 0.25}


async def test_status_json_is_strict_json_when_values_are_not_finite(make_client: Make) -> None:
    stats = NodeStats()
    stats.record_step({"step": 1, "reward_mean": float("nan"), "loss": float("inf")})
    client = await make_client(stats)
    text = await (await client.get("/status")).text()
    assert "NaN" not in text and "Infinity" not in text
    body = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))
    assert body["history"] == [{"step": 1, "reward_mean": None, "loss": None}]
    assert body["reward"]["recent"] is None


async def test_metrics_endpoint_serves_prometheus_text(make_client: Make) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from swarm_node.status.metrics import TEXT_FAMILY_NAMES

    client = await make_client()
    response = await client.get("/metrics")
    assert response.status == 200
    assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    families = {f.name: f for f in text_string_to_metric_families(await response.text())}
    assert set(TEXT_FAMILY_NAMES) <= set(families)
    assert [s.value for s in families["swarm_node_step"].samples] == [3.0]
    groups = {s.labels["kind"]: s.value for s in families["swarm_node_rollout_groups"].samples}
    assert groups == {"produced": 12.0, "received": 7.0, "used": 15.0}


async def test_metrics_speaks_openmetrics_when_the_scraper_asks(make_client: Make) -> None:
    from prometheus_client.openmetrics.parser import text_string_to_metric_families

    client = await make_client()
    response = await client.get("/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    assert response.headers["Content-Type"].startswith("application/openmetrics-text; version=1.0.0")
    text = await response.text()
    assert text.endswith("# EOF\n")
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert [s.value for s in families["swarm_node_policy_version"].samples] == [3.0]


async def test_dashboard_page_is_self_contained_and_pinned_by_csp(make_client: Make) -> None:
    client = await make_client()
    response = await client.get("/")
    assert response.status == 200
    assert response.content_type == "text/html"
    page = await response.text()
    for element in ('id="reward-chart"', 'id="throughput-chart"', 'id="peers"', 'id="drops-chart"',
                    'id="staleness-chart"'):
        assert element in page
    # Offline: nothing is loaded from anywhere (no src/href attributes, no URLs at all).
    assert re.findall(r"\b(?:src|href)\s*=", page) == []
    assert re.findall(r"https?://", page.replace('"http://www.w3.org/2000/svg"', "")) == []  # XML namespace
    script = re.search(r"<script>(.*?)</script>", page, flags=re.DOTALL).group(1)
    digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
    csp = response.headers["Content-Security-Policy"]
    assert f"script-src 'sha256-{digest}';" in csp
    assert "default-src 'none'" in csp and "connect-src 'self'" in csp


async def test_unknown_path_is_json_404(make_client: Make) -> None:
    client = await make_client()
    response = await client.get("/admin/shutdown")
    assert response.status == 404
    assert response.content_type == "application/json"
    assert await response.json() == {"error": "not found", "status": 404}


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH"])
@pytest.mark.parametrize("path", ["/", "/status", "/metrics"])
async def test_read_only_every_write_method_is_json_405(make_client: Make, method: str, path: str) -> None:
    client = await make_client()
    response = await client.request(method, path, data=b"x")
    assert response.status == 405
    assert await response.json() == {"error": "method not allowed", "status": 405}
    assert "GET" in response.headers["Allow"]


async def test_responses_carry_safety_headers(make_client: Make) -> None:
    client = await make_client()
    for path in ("/", "/status", "/metrics", "/nope"):
        response = await client.get(path)
        assert response.headers["Cache-Control"] == "no-store"
        assert response.headers["X-Content-Type-Options"] == "nosniff"
        assert response.headers["Referrer-Policy"] == "no-referrer"


@pytest.mark.parametrize("path", ["/", "/status", "/metrics", "/nope"])
async def test_token_required_on_every_path(make_client: Make, path: str) -> None:
    client = await make_client(token=TOKEN)
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"},
                    {"Authorization": f"Bearer {TOKEN}x"}, {"Authorization": "Bearer"}):
        response = await client.get(path, headers=headers)
        assert response.status == 401, headers
        assert await response.json() == {"error": "unauthorized", "status": 401}
        assert response.headers["WWW-Authenticate"].startswith("Bearer")
    response = await client.get(path, headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status == (404 if path == "/nope" else 200)


async def test_query_token_opens_the_page_only(make_client: Make) -> None:
    client = await make_client(token=TOKEN)
    assert (await client.get("/", params={"token": TOKEN})).status == 200
    assert (await client.get("/", params={"token": "wrong"})).status == 401
    assert (await client.get("/status", params={"token": TOKEN})).status == 401
    assert (await client.get("/metrics", params={"token": TOKEN})).status == 401


async def test_rendering_is_cached_for_the_ttl(make_client: Make) -> None:
    stats = sample_stats()
    client = await make_client(stats, cache_ttl_s=3600.0)
    first = await (await client.get("/status")).read()
    stats.record_step({"step": 4, "reward_mean": 1.0})
    assert await (await client.get("/status")).read() == first  # a polling loop costs one snapshot per ttl
    fresh = await make_client(stats, cache_ttl_s=0.0)
    assert (await (await fresh.get("/status")).json())["step"] == 4


async def test_oversized_request_headers_are_rejected(make_client: Make) -> None:
    client = await make_client()
    response = await client.get("/status", headers={"X-Junk": "a" * 10_000})
    assert response.status in (400, 431)
    assert (await client.get("/status")).status == 200


async def test_slow_handler_hits_the_deadline() -> None:
    # The deadline middleware around a handler that never finishes: 503 JSON, not a hung request.
    import asyncio

    async def never(request: web.Request) -> web.Response:
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")

    app = build_app(sample_stats(), None, handler_timeout_s=0.05)
    app.router.add_get("/slow", never)
    async with TestClient(TestServer(app)) as client:
        response = await client.get("/slow")
        assert response.status == 503
        assert (await response.json())["status"] == 503


# ---- the threaded server on real sockets -------------------------------------------------------------------


def _get(url: str, token: str | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_start_serves_and_stop_closes() -> None:
    server = StatusServer(sample_stats(), port=0)
    url = server.start()
    try:
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/", url)
        assert server.port == int(url.rsplit(":", 1)[1].rstrip("/")) != 0
        assert server.token is None and server.dashboard_url == url
        status, body = _get(url + "status")
        assert status == 200 and json.loads(body)["step"] == 3
        assert _get(url + "metrics")[0] == 200
    finally:
        server.stop()
    server.stop()  # idempotent
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", server.port), timeout=2).close()


def test_busy_port_is_one_clear_line() -> None:
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", 0))
    blocker.listen()
    port = blocker.getsockname()[1]
    try:
        with pytest.raises(UserError) as info:
            StatusServer(NodeStats(), port=port).start()
        assert str(info.value) == (f"status port {port} on 127.0.0.1 is already in use: pick another with "
                                   "--status-port (0 = any free port)")
    finally:
        blocker.close()


def test_non_loopback_bind_generates_and_requires_a_token() -> None:
    server = StatusServer(sample_stats(), host="0.0.0.0", port=0)
    assert server.token is not None and len(server.token) >= 32
    url = server.start()
    try:
        local = f"http://127.0.0.1:{server.port}/"
        assert _get(local + "status")[0] == 401
        assert _get(local + "status", token=server.token)[0] == 200
        assert _get(local + "nope", token=server.token)[0] == 404
        assert server.dashboard_url == f"{url}?token={server.token}"
        assert _get(f"{local}?token={server.token}")[0] == 200
    finally:
        server.stop()


def test_given_token_is_used_even_on_loopback() -> None:
    with StatusServer(sample_stats(), port=0, token=TOKEN) as server:
        assert server.token == TOKEN
        assert _get(server.url + "status")[0] == 401
        assert _get(server.url + "status", token=TOKEN)[0] == 200


@pytest.mark.parametrize("token", ["", "   "])
def test_empty_token_is_refused(token: str) -> None:
    with pytest.raises(UserError, match="--status-token must not be empty"):
        StatusServer(NodeStats(), host="0.0.0.0", token=token)


def test_bad_port_and_host_are_user_errors() -> None:
    with pytest.raises(UserError, match="--status-port must be 0..65535"):
        StatusServer(NodeStats(), port=70000)
    with pytest.raises(UserError, match="does not resolve"):
        StatusServer(NodeStats(), host="no-such-host.invalid")


@pytest.mark.parametrize(("host", "loopback"), [("127.0.0.1", True), ("127.3.4.5", True), ("::1", True),
                                                ("localhost", True), ("0.0.0.0", False), ("::", False),
                                                ("10.1.2.3", False), ("192.168.1.20", False)])
def test_is_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_a_client_stuck_mid_request_is_disconnected() -> None:
    with StatusServer(sample_stats(), port=0, idle_timeout_s=0.3) as server:
        client = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        try:
            client.sendall(b"GET /status HTTP/1.1\r\nHost: x\r\n")  # headers never finished (slowloris)
            assert client.recv(1024) == b""  # closed by the server, well before the 10 s socket timeout
        finally:
            client.close()
        assert _get(server.url + "status")[0] == 200


def test_connections_past_the_cap_get_503() -> None:
    with StatusServer(sample_stats(), port=0, max_connections=2) as server:
        held = []
        for _ in range(2):  # two keep-alive clients that have been served, so the server holds both
            conn = socket.create_connection(("127.0.0.1", server.port), timeout=10)
            conn.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            assert conn.recv(12) == b"HTTP/1.1 200"
            held.append(conn)
        extra = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        try:
            assert extra.recv(1024).startswith(b"HTTP/1.1 503 Service Unavailable\r\n")
        finally:
            extra.close()
            for conn in held:
                conn.close()


def test_default_port_constant() -> None:
    from cli.status_cmd import DEFAULT_STATUS_URL

    assert DEFAULT_STATUS_URL == f"http://127.0.0.1:{DEFAULT_STATUS_PORT}/"


def test_starting_the_server_imports_no_torch() -> None:
    code = ("import sys\nfrom swarm_node.status.stats import NodeStats\nfrom swarm_node.status import StatusServer\n"
            "s = StatusServer(NodeStats(), port=0); s.start(); s.stop()\n"
            "assert 'torch' not in sys.modules, 'torch imported'\nprint('ok')")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
