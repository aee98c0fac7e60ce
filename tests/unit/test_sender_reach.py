"""SenderReach over an in-memory network whose nodes have IP addresses: which senders it dials, and what a failed
dial leaves (the sender reported, its IP backed off), without libp2p (the line over libp2p: integration)."""

from __future__ import annotations

from swarm_node.sharing.fanin import FanInParams
from swarm_node.sharing.sender_reach import SenderReach
from swarm_node.transport.base import TransportError
from swarm_node.transport.memory import MemoryHub, MemoryTransport, peer_id_of_addr

ADDRS = {"a": "/ip4/127.0.0.1/tcp/4001", "b": "/ip4/127.0.0.2/tcp/4001", "c": "/ip4/127.0.0.3/tcp/4001"}


class AddressedMemory(MemoryTransport):
    """A memory node listening on a loopback IP; `connect` reaches a peer only at its own address."""

    dialled: list[str]

    def listen_addrs(self) -> list[str]:
        return [f"{ADDRS[self.peer_id]}/p2p/{self.peer_id}"]

    async def connect(self, multiaddr: str) -> str:
        self.dialled.append(multiaddr)
        peer = peer_id_of_addr(multiaddr)
        if peer not in self.hub.nodes or not multiaddr.startswith(ADDRS[peer] + "/"):
            raise TransportError(f"no answer at {multiaddr}")
        return await super().connect(multiaddr)


async def test_reach_dials_unconnected_senders_once_and_backs_off_a_failed_ip() -> None:
    hub = MemoryHub()
    nodes = {name: AddressedMemory(hub, name) for name in "abc"}
    for node in nodes.values():
        node.dialled = []
        await node.start()
    await nodes["a"].connect(f"{ADDRS['b']}/p2p/b")
    nodes["a"].dialled = []
    reach = SenderReach(nodes["a"], FanInParams(), max_addrs=4)
    assert reach.own_addrs() == (ADDRS["a"],)
    reach.heard("b", (ADDRS["b"],))
    reach.heard("c", (ADDRS["c"],))
    reach.heard("d", ("/ip4/127.0.0.4/tcp/4001", "/ip4/8.8.8.8/tcp/1"))  # nobody there
    # b is connected: not dialled. c is reached. d's first address fails (IP backed off); one dial per sender.
    assert await reach.reach(["b", "c", "d", "e"]) == {"d"}
    assert nodes["a"].dialled == [f"{ADDRS['c']}/p2p/c", "/ip4/127.0.0.4/tcp/4001/p2p/d"]
    assert (reach.dials, reach.dials_failed) == (2, 1)
    assert sorted(p.peer_id for p in await nodes["a"].peers()) == ["b", "c"]
    # The next round d is tried at its other address: 127.0.0.4 is backed off.
    reach.new_round()
    reach.heard("d", ("/ip4/127.0.0.4/tcp/4001", "/ip4/8.8.8.8/tcp/1"))
    assert await reach.reach(["c", "d"]) == {"d"}
    assert nodes["a"].dialled[2:] == ["/ip4/8.8.8.8/tcp/1/p2p/d"]
    # Addresses are forgotten with the round: no digest of d this round, no dial.
    reach.new_round()
    assert await reach.reach(["d"]) == set()
    assert (reach.dials, reach.dials_failed) == (3, 2)
    # ... but those of a sender whose digests stay candidates (heard during the last pull) are kept.
    reach.heard("e", ("/ip4/127.0.0.5/tcp/4001",))
    reach.heard("f", ("/ip4/127.0.0.6/tcp/4001",))
    reach.new_round(keep={"e", "x"})
    assert await reach.reach(["e", "f"]) == {"e"}  # e's address is kept and dialled (nobody there), f's forgotten
    assert nodes["a"].dialled[3:] == ["/ip4/127.0.0.5/tcp/4001/p2p/e"]
