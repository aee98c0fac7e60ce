"""Concurrency caps for the streams a node serves (bounded fan-in's pull and push protocols).

Contract (pure bookkeeping, no I/O): `StreamGate(total, per_peer, over_reason)`; `enter(peer)` admits one more
incoming stream and returns "" (the caller must `leave(peer)` when the stream is done), or refuses it with the
kind to report: BUSY when `total` streams are already being served (our own cap: not the peer's fault), or
`over_reason` when this peer already holds `per_peer` of them (an honest peer holds one pull stream at a time). A
refused stream is reset at once, unread, so a peer opening streams in a loop costs one reset each, and what the
served ones hold is bounded by `total` times one frame (`limits.max_message_bytes`) for one deadline each.
"""

from __future__ import annotations

from collections import Counter

from swarm_node.sharing.fanin_ledger import BUSY


class StreamGate:
    def __init__(self, total: int, per_peer: int, over_reason: str) -> None:
        if total < 1 or per_peer < 1:
            raise ValueError(f"StreamGate needs total >= 1 and per_peer >= 1, got {total}, {per_peer}")
        self.total, self.per_peer, self.over_reason = total, per_peer, over_reason
        self.open: Counter[str] = Counter()  # peer -> streams being served

    @property
    def in_flight(self) -> int:
        return self.open.total()

    def enter(self, peer: str) -> str:
        if self.open[peer] >= self.per_peer:
            return self.over_reason
        if self.in_flight >= self.total:
            return BUSY
        self.open[peer] += 1
        return ""

    def leave(self, peer: str) -> None:
        self.open[peer] -= 1
        if self.open[peer] <= 0:
            del self.open[peer]
