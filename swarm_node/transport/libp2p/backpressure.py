"""Publish back-pressure in the network host: which peers' outbound queues a publish waits for (pure).

Contract: a publish waits while some peer's outbound queue holds at least `high_water` RPCs, but never for
- a peer already found slow (it read nothing for `slow_peer_wait_s`): we publish without waiting for it until its
  queue has drained below half of `high_water` (`still_slow`);
- a peer whose connection has closed (`closed(peer)`): nothing will ever drain its queue, so waiting for it only
  silences everyone else (the host drops such a peer at once instead).
`peers_to_wait_for(queues, high_water, slow, closed)` returns the peers to wait for, in the queues' order.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sized
from typing import TypeVar

Peer = TypeVar("Peer", bound=Hashable)


def still_slow(slow: set[Peer], queues: Mapping[Peer, Sized], high_water: int) -> set[Peer]:
    """The slow peers still connected whose queue holds at least half of `high_water`."""
    return {p for p in slow if p in queues and len(queues[p]) >= high_water // 2}


def peers_to_wait_for(queues: Mapping[Peer, Sized], high_water: int, slow: set[Peer],
                      closed: Callable[[Peer], bool]) -> list[Peer]:
    """Peers with a full queue that a publish waits for: neither known slow nor with a closed connection."""
    return [p for p, q in queues.items() if len(q) >= high_water and p not in slow and not closed(p)]


def closed_with_full_queue(queues: Mapping[Peer, Sized], high_water: int, closed: Callable[[Peer], bool]) -> list[Peer]:
    """Peers with a full queue whose connection has closed: the host drops them instead of waiting."""
    return [p for p, q in queues.items() if len(q) >= high_water and closed(p)]
