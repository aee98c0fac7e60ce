"""Primitive field checks shared by the message codec (`codec`, `bodies`) and the chunk-stream frames (`chunks`).

Contract: each `expect_*(value, where, ...)` returns the value when it has exactly the expected msgpack type and
lies in range, else raises `WireError` (REJECT) whose detail starts with `where`: "bad_schema" for a wrong type
or key set, and the given or documented reason for a value out of range. bool never passes as an int, and a
float field accepts an int (some encoders write 1.0 as 1). Nothing here allocates beyond the value handed in.
"""

from __future__ import annotations

import math
import re
from typing import Any

from protocol.errors import reject
from protocol.limits import MAX_INT, MAX_TIMESTAMP, Limits

POLICY_ID = re.compile(r"[A-Za-z0-9]+(/[A-Za-z0-9._-]+)?", re.ASCII)
PEER_ID = re.compile(r"[A-Za-z0-9]+", re.ASCII)


def expect_map(obj: Any, keys: tuple[str, ...], where: str) -> dict[str, Any]:
    """A map holding exactly `keys`."""
    if type(obj) is not dict:
        raise reject("bad_schema", f"{where}: expected a map, got {type(obj).__name__}")
    if obj.keys() != set(keys):
        raise reject("bad_schema", f"{where}: keys {sorted(map(repr, obj))} != {sorted(keys)}")
    return obj


def expect_int(value: Any, where: str, low: int = 0, high: int = MAX_INT) -> int:
    if type(value) is not int:  # bool is an int subclass; a msgpack true is not a number here
        raise reject("bad_schema", f"{where}: expected an int, got {type(value).__name__}")
    if not low <= value <= high:
        raise reject("out_of_range", f"{where}: {value} not in [{low}, {high}]")
    return value


def expect_float(value: Any, where: str) -> float:
    # ints are accepted for interop (some msgpack encoders write 1.0 as 1); encode always writes float64.
    if type(value) is not float and type(value) is not int:
        raise reject("bad_schema", f"{where}: expected a float, got {type(value).__name__}")
    out = float(value)
    if not math.isfinite(out):
        raise reject("non_finite", f"{where}: {out}")
    return out


def expect_str(value: Any, where: str, max_chars: int, reason: str = "name_too_long") -> str:
    if type(value) is not str:
        raise reject("bad_schema", f"{where}: expected a string, got {type(value).__name__}")
    if len(value) > max_chars:
        raise reject(reason, f"{where}: {len(value)} chars > {max_chars}")
    return value


def expect_bin(value: Any, where: str) -> bytes:
    if type(value) is not bytes:
        raise reject("bad_schema", f"{where}: expected bytes, got {type(value).__name__}")
    return value


def expect_list(value: Any, where: str, max_len: int, reason: str, min_len: int = 1) -> list[Any]:
    if type(value) is not list:
        raise reject("bad_schema", f"{where}: expected an array, got {type(value).__name__}")
    if len(value) > max_len:
        raise reject(reason, f"{where}: {len(value)} > {max_len}")
    if len(value) < min_len:
        raise reject("bad_schema", f"{where}: fewer than {min_len} entries")
    return value


def expect_peer_id(value: Any, where: str, limits: Limits) -> str:
    text = expect_str(value, where, limits.max_name_chars)
    if not PEER_ID.fullmatch(text):
        raise reject("bad_peer_id", f"{where}: {text[:80]!r} is not a peer id")
    return text


def expect_policy_id(value: Any, where: str, limits: Limits) -> str:
    text = expect_str(value, where, limits.max_name_chars)
    if not POLICY_ID.fullmatch(text):
        raise reject("bad_policy_id", f"{where}: {text[:80]!r} is not '<peer id>' or '<peer id>/<name>'")
    return text


def expect_timestamp(value: Any, where: str) -> float:
    """A created-at in [0, MAX_TIMESTAMP] (REJECT "bad_timestamp" outside; freshness is the codec's, IGNORE)."""
    if type(value) is not float and type(value) is not int:
        raise reject("bad_schema", f"{where}: expected a float, got {type(value).__name__}")
    out = float(value)
    if not 0.0 <= out <= MAX_TIMESTAMP:  # also false for NaN
        raise reject("bad_timestamp", f"{where}: {out}")
    return out
