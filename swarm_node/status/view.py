"""Bounded, JSON-safe view of a `NodeStats.snapshot()` for the status API: pure functions, no I/O.

Contract: `status_view(snapshot)` returns a new dict with the same keys as the snapshot, where every value
is JSON-encodable with `allow_nan=False` (non-finite floats become None, because browsers' JSON.parse rejects
NaN) and the size is bounded whatever the node put in: at most `MAX_HISTORY` history points of at most
`MAX_POINT_KEYS` scalar fields each, `MAX_PEERS` peers (graylisted, banned and denied ones first, then by id,
so the ones an operator must see are never cut), `MAX_KEYS` entries per mapping,
`MAX_LIST` items per list, strings clipped to `MAX_STR` characters, nesting cut at `MAX_DEPTH`. Peer ids and
drop reasons can originate from the network, so nothing here trusts their length or count.
"""

from __future__ import annotations

import math
from typing import Any

MAX_HISTORY = 500
MAX_POINT_KEYS = 32
MAX_PEERS = 64
MAX_KEYS = 64
MAX_LIST = 64
MAX_STR = 256
MAX_DEPTH = 4

_SCALARS = (bool, int, float, str, type(None))
FLAGGED_STATES = ("graylisted", "banned", "denied")  # sharing/reputation.py BLOCKED (status imports no sharing)


def clean(value: Any, depth: int = 0) -> Any:
    """A JSON-safe, size-bounded copy of `value` (unknown types become their clipped str())."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, str):
        return value[:MAX_STR]
    if depth >= MAX_DEPTH:
        return None
    if isinstance(value, dict):
        items = list(value.items())[:MAX_KEYS]
        return {str(k)[:MAX_STR]: clean(v, depth + 1) for k, v in items}
    if isinstance(value, (list, tuple)):
        return [clean(v, depth + 1) for v in list(value)[:MAX_LIST]]
    # numpy / torch scalars and anything else the node may have stored: a number if it converts to one
    try:
        return clean(float(value), depth)
    except (TypeError, ValueError):
        return str(value)[:MAX_STR]


def clean_point(point: dict[str, Any]) -> dict[str, Any]:
    """One history point: scalar fields only (curves need numbers), at most MAX_POINT_KEYS of them."""
    out: dict[str, Any] = {}
    for key, value in point.items():
        if len(out) >= MAX_POINT_KEYS:
            break
        if isinstance(value, _SCALARS):
            out[str(key)[:MAX_STR]] = clean(value)
    return out


def status_view(snapshot: dict[str, Any], max_history: int = MAX_HISTORY) -> dict[str, Any]:
    """The bounded JSON body of GET /status."""
    view = {key: clean(value) for key, value in snapshot.items() if key not in ("history", "peers")}
    history = list(snapshot.get("history") or [])[-max_history:] if max_history > 0 else []
    view["history"] = [clean_point(p) for p in history if isinstance(p, dict)]
    peers = sorted(snapshot.get("peers") or [],
                   key=lambda p: (p.get("state") not in FLAGGED_STATES, str(p.get("peer_id"))))
    view["peers"] = [clean(p) for p in peers[:MAX_PEERS]]
    view["peers_total"] = len(peers)
    return view
