"""Signed peer records on pubsub RPCs (guards.install_record_caches).

py-libp2p 0.8.1 drops a whole pubsub RPC, messages and all, when its sender record is older than the one the
receiver holds ("Received an invalid-signed-record, ignoring the incoming msg"). The NAT swarm test lost groups to
it after the relay went away: the homes' addresses changed, identify and the DHT sent the new record, and pubsub
went on sending its cached older one. Here: our cached record is never older than the peerstore's local record,
a late but authentic older record keeps its RPC (not its addresses), and anything else still costs the RPC.
The record functions read a host's id, key, addresses and peerstore only: a stand-in host with a real PeerStore.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from libp2p.crypto.secp256k1 import create_new_key_pair
from libp2p.peer import peerstore as peerstore_module
from libp2p.peer.envelope import consume_envelope, seal_record
from libp2p.peer.id import ID
from libp2p.peer.peer_record import PEER_RECORD_ENVELOPE_DOMAIN, PeerRecord
from libp2p.peer.peerstore import PeerStore
from libp2p.pubsub import gossipsub as gossipsub_module
from libp2p.pubsub import pubsub as pubsub_module
from libp2p.pubsub.pb import rpc_pb2
from multiaddr import Multiaddr

from swarm_node.transport.libp2p.guards import install_record_caches

HOME = Multiaddr("/ip4/10.0.0.2/tcp/4001")
CIRCUIT = Multiaddr("/ip4/11.0.0.10/tcp/4001/p2p/12D3KooWDvq6W2E6m4g4uM21fvC6mZ9QFt4zsDzcEh2wmYZtNGYf/p2p-circuit")


class StandInHost:
    def __init__(self, *addrs: Multiaddr) -> None:
        self.key_pair = create_new_key_pair()
        self.peer_id = ID.from_pubkey(self.key_pair.public_key)
        self.addrs = list(addrs)
        self.peerstore = PeerStore()

    def get_id(self) -> ID:
        return self.peer_id

    def get_private_key(self):  # type: ignore[no-untyped-def]
        return self.key_pair.private_key

    def get_addrs(self) -> list[Multiaddr]:
        return list(self.addrs)

    def get_peerstore(self) -> PeerStore:
        return self.peerstore


def signed(signer: StandInHost, peer_id: ID, addrs: list[Multiaddr], seq: int) -> bytes:
    return seal_record(PeerRecord(peer_id, addrs, seq), signer.get_private_key()).marshal_envelope()


def receive(record: bytes, host: StandInHost, sender: ID) -> bool:
    """What pubsub asks before it reads an RPC's messages: True keeps them."""
    return bool(pubsub_module.maybe_consume_signed_record(rpc_pb2.RPC(senderRecord=record), host, sender))


def held_addrs(host: StandInHost, peer_id: ID) -> list[Multiaddr]:
    envelope = host.peerstore.get_peer_record(peer_id)
    assert envelope is not None
    return list(envelope.record().addrs)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Callable[[float], None]:
    """Installs the caches for this test only, on a clock the test advances."""
    for module in (pubsub_module, gossipsub_module):
        monkeypatch.setattr(module, "env_to_send_in_RPC", module.env_to_send_in_RPC)
        monkeypatch.setattr(module, "maybe_consume_signed_record", module.maybe_consume_signed_record)
    now = [100.0]
    install_record_caches(ttl_s=10.0, clock=lambda: now[0])

    def advance(seconds: float) -> None:
        now[0] += seconds
    return advance


def test_pubsub_sends_the_record_identify_issued_after_ours_not_the_cached_one(clock: Callable[[float], None]) -> None:
    home, peer = StandInHost(HOME, CIRCUIT), StandInHost()
    cached, issued = pubsub_module.env_to_send_in_RPC(home)
    assert issued and receive(cached, peer, home.peer_id)
    clock(1.0)
    assert pubsub_module.env_to_send_in_RPC(home) == (cached, False)  # the cache at work: nothing rebuilt
    home.addrs.remove(CIRCUIT)  # the relay went away; identify (the library's own function) issues a new record
    newer, issued = peerstore_module.env_to_send_in_RPC(home)
    assert issued and newer != cached
    assert peer.peerstore.consume_peer_record(consume_envelope(newer, PEER_RECORD_ENVELOPE_DOMAIN)[0], 7200)
    clock(1.0)  # well within the cache's 10 s
    assert pubsub_module.env_to_send_in_RPC(home) == (newer, False)
    assert receive(newer, peer, home.peer_id)
    assert held_addrs(peer, home.peer_id) == [HOME]


def test_an_older_record_of_the_sender_keeps_its_rpc_but_not_its_addresses(clock: Callable[[float], None]) -> None:
    home, peer = StandInHost(), StandInHost()
    assert receive(signed(home, home.peer_id, [HOME], seq=2), peer, home.peer_id)
    assert receive(signed(home, home.peer_id, [HOME, CIRCUIT], seq=1), peer, home.peer_id)
    assert held_addrs(peer, home.peer_id) == [HOME]


def test_a_record_the_sender_did_not_sign_for_itself_still_costs_the_rpc(clock: Callable[[float], None]) -> None:
    home, peer, other = StandInHost(), StandInHost(), StandInHost()
    assert receive(signed(home, home.peer_id, [HOME], seq=2), peer, home.peer_id)
    assert not receive(signed(other, home.peer_id, [CIRCUIT], seq=1), peer, home.peer_id)  # forged for home
    assert not receive(signed(other, other.peer_id, [CIRCUIT], seq=1), peer, home.peer_id)  # someone else's
    assert not receive(b"not an envelope", peer, home.peer_id)
    assert held_addrs(peer, home.peer_id) == [HOME]
