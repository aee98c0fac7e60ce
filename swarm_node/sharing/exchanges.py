"""The rollout exchanges a node can run, by name (`[share] fanin`, `variants.EXCHANGES`).

Contract: `EXCHANGES[name](transport, limits, policy)` builds a not-yet-started exchange over `transport` with
`start()`, `publish(groups)`, `await flush()`, `drain()` and `ignore_signer` (`sharing.exchange.Exchange` and the
parts `join` drives):
- "flood": `TransportExchange`, every group gossiped to every peer on the rollout topic.
- "bounded": `FaninExchange` (issue 32) with `FanInParams()` and a fresh secret shard seed per start. It starts on
  one shard (digests reach every peer; pulls are bounded), learning: in a running swarm it takes the shard count
  its first digest senders announce, and from its first epoch change on it sets each next epoch's shard count from
  the swarm it saw in the last one (`sharing/swarm_size.py`).
"""

from __future__ import annotations

import os
from collections.abc import Callable

from protocol.limits import Limits
from protocol.validation import AcceptPolicy
from swarm_node import variants
from swarm_node.sharing.exchange import TransportExchange
from swarm_node.sharing.fanin import FanInParams
from swarm_node.sharing.fanin_exchange import FaninExchange
from swarm_node.transport.base import Transport

SHARD_SEED_BYTES = 32

NetworkExchange = TransportExchange | FaninExchange
ExchangeFactory = Callable[[Transport, Limits, AcceptPolicy], NetworkExchange]
EXCHANGES: variants.Registry[ExchangeFactory] = variants.Registry("share.fanin", variants.EXCHANGES)
EXCHANGES.add("flood", TransportExchange)


@EXCHANGES.register("bounded")
def bounded(transport: Transport, limits: Limits, policy: AcceptPolicy) -> FaninExchange:
    params = FanInParams()
    # One shard to start with (shard_count(n) is 1 for n <= shard_size), learning the swarm's M from its peers.
    return FaninExchange(transport, limits, policy, params, os.urandom(SHARD_SEED_BYTES), n_peers=params.shard_size)
