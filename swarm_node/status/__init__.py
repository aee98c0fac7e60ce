"""Node status: a read-only HTTP server over a `NodeStats` (GET /status JSON, /metrics Prometheus, / dashboard).

`StatusServer` (server.py) is what the node starts first; `view.py` bounds the JSON, `metrics.py` builds the
Prometheus exposition, `dashboard.html` is the self-contained page. Importing this package never imports torch.
"""

from swarm_node.status.server import DEFAULT_STATUS_HOST, DEFAULT_STATUS_PORT, StatusServer

__all__ = ["DEFAULT_STATUS_HOST", "DEFAULT_STATUS_PORT", "StatusServer"]
