"""`share.fanin` picks the rollout exchange by name (sharing/exchanges.py): bounded is the default (issue 32 item 5)."""

from __future__ import annotations

import pytest

from protocol.limits import Limits
from protocol.validation import AcceptPolicy
from swarm_node.config import load_config
from swarm_node.errors import ConfigError
from swarm_node.sharing.exchange import TransportExchange
from swarm_node.sharing.exchanges import EXCHANGES
from swarm_node.sharing.fanin_exchange import FaninExchange
from swarm_node.transport.memory import MemoryHub, MemoryTransport


def test_bounded_is_the_default_and_flood_is_chosen_by_name() -> None:
    cfg = load_config()
    assert cfg.share.fanin == "bounded"
    assert cfg.with_values({"share.fanin": "flood"}).share.fanin == "flood"
    with pytest.raises(ConfigError, match="^share.fanin 'pull' unknown; choose one of flood, bounded$"):
        cfg.with_values({"share.fanin": "pull"})
    transport = MemoryTransport(MemoryHub(), "peerA")
    policy = AcceptPolicy(tasks=frozenset(), max_index=1)
    assert type(EXCHANGES["flood"](transport, Limits(), policy)) is TransportExchange
    bounded = EXCHANGES["bounded"](transport, Limits(), policy)
    assert type(bounded) is FaninExchange
    assert len(bounded.seed) == 32 and bounded.seed != EXCHANGES["bounded"](transport, Limits(), policy).seed
