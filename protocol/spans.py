"""A completion's version spans on the wire: the `spans` blob of schema 5 (protocol/WIRE.md).

Contract: a span is (first token index, policy version); a completion's spans are a blob of little-endian uint32
pairs, 8 bytes a span, empty for a completion one policy sampled at the group's version. `spans_blob(spans)` encodes
them (WireError "unencodable" for a pair that is not two uint32 ints); `check_spans_size(blob, max_spans, where)`
and then `decode_spans(blob, n_tokens, where)` check a received blob (REJECT "bad_spans": a length not a multiple of
8 or over max_spans, before anything else of the completion is decoded; then a first start other than 0, starts or
versions not strictly ascending, a start past the completion's tokens). That no span is newer than its group's
version is the group decoder's check (protocol/bodies.py).
"""

from __future__ import annotations

import numpy as np

from protocol.errors import reject

_SPAN_DTYPE = np.dtype("<u4")  # a span is two of these: (first token index, policy version)
SPAN_BYTES = 2 * _SPAN_DTYPE.itemsize
_UINT32_MAX = 2**32 - 1


def spans_blob(spans: tuple[tuple[int, int], ...]) -> bytes:
    # Checked here rather than left to numpy: a pair of another length would pack into a blob of another stride,
    # and numpy's handling of out-of-range ints differs across versions.
    for span in spans:
        if len(span) != 2 or any(type(x) is not int or not 0 <= x <= _UINT32_MAX for x in span):
            raise reject("unencodable", f"spans: {span!r} is not a (start, version) pair of uint32")
    return np.asarray(spans, dtype=_SPAN_DTYPE).tobytes() if spans else b""


def check_spans_size(blob: bytes, max_spans: int, where: str) -> bytes:
    """The blob, if its length is a whole number of spans, at most max_spans; else REJECT "bad_spans"."""
    if len(blob) % SPAN_BYTES:
        raise reject("bad_spans", f"{where}.spans: {len(blob)} bytes is not a multiple of {SPAN_BYTES}")
    if len(blob) // SPAN_BYTES > max_spans:
        raise reject("bad_spans", f"{where}.spans: {len(blob) // SPAN_BYTES} spans > {max_spans}")
    return blob


def decode_spans(blob: bytes, n_tokens: int, where: str) -> tuple[tuple[int, int], ...]:
    """The (start, version) pairs of a blob `check_spans_size` passed; REJECT "bad_spans" unless they start at
    token 0, starts and versions strictly ascend and every start is a token of the completion."""
    pairs = np.frombuffer(blob, dtype=_SPAN_DTYPE).reshape(-1, 2).astype(np.int64)  # int64: diffs do not wrap
    if not pairs.size:
        return ()
    starts, versions = pairs[:, 0], pairs[:, 1]
    if starts[0] != 0:
        raise reject("bad_spans", f"{where}.spans: the first span starts at token {int(starts[0])}, not 0")
    if (np.diff(starts) <= 0).any():
        raise reject("bad_spans", f"{where}.spans: starts {starts.tolist()} are not strictly ascending")
    if starts[-1] >= n_tokens:  # the largest start, as they ascend
        raise reject("bad_spans", f"{where}.spans: a span starts at token {int(starts[-1])} of {n_tokens}")
    if (np.diff(versions) <= 0).any():
        raise reject("bad_spans", f"{where}.spans: versions {versions.tolist()} are not strictly ascending")
    return tuple((int(s), int(v)) for s, v in pairs.tolist())
