"""Read-only HTTP status server of one node: GET /status (JSON), GET /metrics (Prometheus), GET / (dashboard).

Contract:
- `StatusServer(stats, host, port, token).start()` binds the socket in the caller's thread, so a busy port or a
  bad host is a one-line `UserError` at once, then serves from a daemon thread with its own asyncio loop and
  returns the URL. It imports neither torch nor the node: the node starts it before anything slow, and the
  `phase` it reports shows where a slow start is. `stop()` closes it; it is also a context manager.
- Reads only `stats.snapshot()`. Only GET (and HEAD) are routed; nothing on the server changes the node.
- Auth: a loopback bind is open unless a token is given. Any other bind requires `Authorization: Bearer <token>`
  on every path, unknown ones included (401 before 404, so paths are not probed without a token); the token is
  generated with `secrets.token_urlsafe` when none is given and exposed as `.token`. `GET /` also accepts
  `?token=` so a browser can open the dashboard; the page sends the header on its own fetches.
- Hostile clients: request line, headers and bodies are capped; a connection idle or stuck mid-request is closed
  after `idle_timeout_s`; at most `max_connections` are open at once (the node's file descriptors are not the
  client's to exhaust); handlers have a deadline; response bodies are bounded (`view.py`); a snapshot is
  rendered at most once per `cache_ttl_s` per endpoint, so polling in a loop costs the node almost nothing.
- Errors are JSON `{"error": ..., "status": code}`: 401 wrong/missing token, 404 unknown path, 405 method.
"""

from __future__ import annotations

import asyncio
import base64
import errno
import hashlib
import hmac
import ipaddress
import json
import re
import secrets
import socket
import threading
from collections.abc import Awaitable, Callable
from importlib import resources

from aiohttp import web
from prometheus_client.exposition import choose_encoder

from swarm_node.errors import UserError
from swarm_node.status.metrics import render_metrics
from swarm_node.status.stats import NodeStats
from swarm_node.status.view import status_view

DEFAULT_STATUS_HOST = "127.0.0.1"
DEFAULT_STATUS_PORT = 8470
HANDLER_TIMEOUT_S = 5.0
IDLE_TIMEOUT_S = 10.0
MAX_CONNECTIONS = 32
CACHE_TTL_S = 0.5
CLIENT_MAX_SIZE = 4096  # bytes of request body; nothing here reads a body, so any body is refused early
PARSER_LIMITS = {"max_line_size": 4096, "max_field_size": 4096, "max_headers": 32}
START_TIMEOUT_S = 10.0

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def is_loopback(host: str) -> bool:
    """True if every address `host` resolves to is a loopback address (raises UserError if it does not resolve)."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise UserError(f"status host {host!r} does not resolve: {exc.strerror}") from exc
    return all(ipaddress.ip_address(info[4][0].split("%")[0]).is_loopback for info in infos)


def build_app(stats: NodeStats, token: str | None, cache_ttl_s: float = CACHE_TTL_S,
              handler_timeout_s: float = HANDLER_TIMEOUT_S) -> web.Application:
    """The aiohttp application (routes, auth, JSON errors, headers, cache); no socket is opened here."""
    page = _dashboard_page()
    csp = _content_security_policy(page)
    cache = _RenderCache(cache_ttl_s)

    async def status(request: web.Request) -> web.Response:
        body = cache.get("status", lambda: json.dumps(status_view(stats.snapshot()), allow_nan=False,
                                                      separators=(",", ":")).encode())
        return web.Response(body=body, content_type="application/json")

    async def metrics(request: web.Request) -> web.Response:
        accept = request.headers.get("Accept", "")
        # The content type depends on Accept (text or OpenMetrics); it comes from a small fixed set.
        _, content_type = choose_encoder(accept)
        body = cache.get("metrics:" + content_type, lambda: render_metrics(stats.snapshot(), accept)[0])
        return web.Response(body=body, headers={"Content-Type": content_type})

    async def dashboard(request: web.Request) -> web.Response:
        return web.Response(text=page, content_type="text/html", charset="utf-8",
                            headers={"Content-Security-Policy": csp})

    app = web.Application(
        client_max_size=CLIENT_MAX_SIZE,
        middlewares=[_json_errors, _common_headers, _auth(token), _deadline(handler_timeout_s)],
    )
    app.router.add_get("/", dashboard)
    app.router.add_get("/status", status)
    app.router.add_get("/metrics", metrics)
    return app


class StatusServer:
    """The node's status server, serving from its own thread and event loop."""

    def __init__(self, stats: NodeStats, host: str = DEFAULT_STATUS_HOST, port: int = DEFAULT_STATUS_PORT,
                 token: str | None = None, *, idle_timeout_s: float = IDLE_TIMEOUT_S,
                 max_connections: int = MAX_CONNECTIONS, cache_ttl_s: float = CACHE_TTL_S) -> None:
        if token is not None and not token.strip():
            raise UserError("--status-token must not be empty")
        if not 0 <= port <= 65535:
            raise UserError(f"--status-port must be 0..65535, got {port}")
        self.stats = stats
        self.host = host
        self.port = port
        self.loopback = is_loopback(host)
        # Off loopback the API is reachable by others: never serve it without a token.
        self.token = token if token is not None or self.loopback else secrets.token_urlsafe(24)
        self.idle_timeout_s = idle_timeout_s
        self.max_connections = max_connections
        self.cache_ttl_s = cache_ttl_s
        self.url: str | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopping: Callable[[], Awaitable[None]] | None = None

    @property
    def dashboard_url(self) -> str | None:
        """The URL to open in a browser (with `?token=` when a token is required)."""
        if self.url is None or self.token is None:
            return self.url
        return f"{self.url}?token={self.token}"

    def start(self) -> str:
        """Bind, start serving in a daemon thread, return the base URL `http://HOST:PORT/`."""
        if self._thread is not None:
            raise RuntimeError("status server already started")
        sock = _bind(self.host, self.port)
        port = sock.getsockname()[1]
        shown = f"[{self.host}]" if ":" in self.host else self.host
        ready = threading.Event()
        failure: list[BaseException] = []
        self._thread = threading.Thread(target=self._run, args=(sock, ready, failure), daemon=True,
                                        name=f"status-server:{port}")
        self._thread.start()
        if not ready.wait(START_TIMEOUT_S):
            raise RuntimeError("status server did not start")
        if failure:
            self._thread.join()
            self._thread = None
            raise failure[0]
        self.port = port
        self.url = f"http://{shown}:{port}/"
        return self.url

    def stop(self) -> None:
        """Close every connection and the listening socket, end the thread. Idempotent."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        if self._stopping is not None and loop.is_running():
            asyncio.run_coroutine_threadsafe(self._stopping(), loop).result(timeout=START_TIMEOUT_S)
            loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=START_TIMEOUT_S)
        self._loop = self._thread = self._stopping = None

    def __enter__(self) -> StatusServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self, sock: socket.socket, ready: threading.Event, failure: list[BaseException]) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        self._loop = loop
        try:
            try:
                self._stopping = loop.run_until_complete(self._serve(sock))
            except Exception as exc:  # reported to start()'s caller, which re-raises it
                failure.append(exc)
                sock.close()
                return
            finally:
                ready.set()
            loop.run_forever()
        finally:
            loop.close()

    async def _serve(self, sock: socket.socket) -> Callable[[], Awaitable[None]]:
        app = build_app(self.stats, self.token, self.cache_ttl_s)
        # aiohttp arms keepalive_timeout when a connection opens and does not re-arm it while a request trickles
        # in, so it also closes a connection stuck mid-request (slowloris); tests check that.
        runner = web.AppRunner(app, access_log=None, keepalive_timeout=self.idle_timeout_s,
                               handler_cancellation=True, **PARSER_LIMITS)
        await runner.setup()
        handlers = runner.server
        assert handlers is not None
        limit = self.max_connections

        def protocol() -> asyncio.BaseProtocol:
            # Past the cap a client gets a 503 and a closed socket instead of a handler.
            return handlers() if len(handlers.connections) < limit else _Refuse()

        tcp = await asyncio.get_running_loop().create_server(protocol, sock=sock)

        async def stopping() -> None:
            tcp.close()
            await runner.cleanup()
            await tcp.wait_closed()

        return stopping


def _bind(host: str, port: int) -> socket.socket:
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as exc:
        raise UserError(f"status host {host!r} does not resolve: {exc.strerror}") from exc
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # reuse TIME_WAIT, not a live listener
        sock.bind(address)
        sock.listen(128)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise UserError(f"status port {port} on {host} is already in use: pick another with --status-port "
                            "(0 = any free port)") from exc
        raise UserError(f"cannot bind the status server to {host}:{port}: {exc.strerror}") from exc
    sock.setblocking(False)
    return sock


class _Refuse(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.WriteTransport)
        transport.write(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        transport.close()


class _RenderCache:
    """Rendered bodies reused for ttl seconds; touched only from the server loop, so no lock."""

    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        self._entries: dict[str, tuple[float, bytes]] = {}

    def get(self, key: str, render: Callable[[], bytes]) -> bytes:
        now = asyncio.get_running_loop().time()
        entry = self._entries.get(key)
        if entry is not None and now - entry[0] < self.ttl_s:
            return entry[1]
        body = render()
        self._entries[key] = (now, body)
        return body


def _json_error(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"error": message, "status": status}, status=status, headers=headers)


@web.middleware
async def _json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        headers = {k: v for k, v in exc.headers.items() if k in ("Allow", "WWW-Authenticate")}
        message = {404: "not found", 405: "method not allowed"}.get(exc.status, exc.reason.lower())
        response = _json_error(exc.status, message, headers)
        _secure(response)
        return response


@web.middleware
async def _common_headers(request: web.Request, handler: Handler) -> web.StreamResponse:
    response = await handler(request)
    _secure(response)
    return response


def _secure(response: web.StreamResponse) -> None:
    response.headers.setdefault("Cache-Control", "no-store")
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    response.headers.setdefault("Referrer-Policy", "no-referrer")  # the page URL may carry ?token=
    response.headers.setdefault("X-Frame-Options", "DENY")


def _auth(token: str | None) -> Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]:
    expected = None if token is None else token.encode()

    @web.middleware
    async def auth(request: web.Request, handler: Handler) -> web.StreamResponse:
        if expected is None:
            return await handler(request)
        given = ""
        scheme, _, value = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() == "bearer":
            given = value.strip()
        elif request.path == "/":  # a browser cannot send headers when opening the page
            given = request.query.get("token", "")
        if not hmac.compare_digest(given.encode(), expected):
            raise web.HTTPUnauthorized(headers={"WWW-Authenticate": 'Bearer realm="swarm-node"'})
        return await handler(request)

    return auth


def _deadline(timeout_s: float) -> Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]:
    @web.middleware
    async def deadline(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await asyncio.wait_for(handler(request), timeout_s)
        except asyncio.TimeoutError as exc:
            raise web.HTTPServiceUnavailable() from exc

    return deadline


def _dashboard_page() -> str:
    return resources.files("swarm_node.status").joinpath("dashboard.html").read_text(encoding="utf-8")


def _content_security_policy(page: str) -> str:
    """Allow exactly the page's own inline script and style (by hash) and fetches to this origin, nothing else."""
    def hashes(tag: str) -> str:
        blocks = re.findall(rf"<{tag}>(.*?)</{tag}>", page, flags=re.DOTALL)
        return " ".join(f"'sha256-{base64.b64encode(hashlib.sha256(b.encode()).digest()).decode()}'"
                        for b in blocks)

    return (f"default-src 'none'; script-src {hashes('script')}; style-src {hashes('style')}; "
            "connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; "
            "frame-ancestors 'none'")

