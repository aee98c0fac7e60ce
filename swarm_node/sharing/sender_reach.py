"""Reaching the digest senders a node is not connected to, over any `Transport` (issue 32).

A digest reaches a node relayed through its shard's mesh, so its sender is often not a peer the node is connected
to, and a pull then has no connection to open its stream on. Contract:
- `own_addrs()`: what our digest batches carry (`sender_dial.announced_addrs` of `transport.listen_addrs()`).
- `heard(sender, addrs)`: the addresses a digest batch of `sender` carried this round (the gossip signer's: StrictSign
  authenticates them as its claim; the Noise handshake of the dial authenticates the peer we reach).
- `await reach(senders)`: dials `<addr>/p2p/<sender>`, in the order given (best pulls first), for the senders
  `DialBook.plan` allows (not connected, an address we may dial, within the round's caps), all at once, each within
  `pull_timeout_s`; returns the senders whose dial failed (their IP is backed off). Senders not dialled are pulled
  as before: connected ones, or ones the transport can reach by itself.
- `new_round(keep)`: the caps' round turns over and the addresses heard are forgotten, but those of the senders in
  `keep` (whose digests are still candidates: heard while the last round's pull was under way). `dials`/
  `dials_failed` count.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection

from swarm_node.sharing.fanin import FanInParams
from swarm_node.sharing.sender_dial import DialBook, announced_addrs, own_scopes
from swarm_node.transport.base import Transport, TransportError


class SenderReach:
    def __init__(self, transport: Transport, params: FanInParams, max_addrs: int) -> None:
        self.transport, self.params, self.max_addrs = transport, params, max_addrs
        self.book = DialBook(params)
        self._addrs: dict[str, tuple[str, ...]] = {}
        self.dials = 0
        self.dials_failed = 0

    def own_addrs(self) -> tuple[str, ...]:
        return announced_addrs(self.transport.listen_addrs(), self.max_addrs)

    def heard(self, sender: str, addrs: tuple[str, ...]) -> None:
        self._addrs[sender] = addrs

    def new_round(self, keep: Collection[str] = ()) -> None:
        self.book.new_round()
        self._addrs = {sender: self._addrs[sender] for sender in keep if sender in self._addrs}

    async def reach(self, senders: Collection[str]) -> set[str]:
        if not any(s in self._addrs for s in senders):
            return set()
        try:
            connected = {p.peer_id for p in await self.transport.peers()}
        except TransportError:  # the network layer is restarting: the pulls fail on their own
            return set()
        plan = self.book.plan(list(senders), connected, self._addrs, own_scopes(self.transport.listen_addrs()))
        done = await asyncio.gather(*(self._dial(sender, addr) for sender, addr in plan.items()))
        return {sender for sender, ok in zip(plan, done, strict=True) if not ok}

    async def _dial(self, sender: str, addr: str) -> bool:
        self.dials += 1
        try:
            await asyncio.wait_for(self.transport.connect(f"{addr}/p2p/{sender}"), self.params.pull_timeout_s)
            return True
        except (TransportError, TimeoutError):
            self.dials_failed += 1
            self.book.failed(addr)
            return False
