"""An adversarial libp2p peer for the tests: plain py-libp2p (trio), no guards, JSON-line commands on stdin.

Events: {"event": "ready", "peer_id"}; answers carry the command's "rid".
Commands: connect {addr}; capture {topic} (keep every message received, with its signature); captured;
replay {target, signer} (re-send, byte-identical, the first captured message signed by `signer`, on a fresh
/meshsub/1.1.0 stream); raw {target, kind, topic, honest}; publish {topic, data_hex} (validly signed by us); quit.
raw kinds: undecodable_frame (crash a), malformed_key (crash b), oversized_frame (> 1 MiB), unsigned,
forged_signature (from = `honest`, signed with our key).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import multiaddr
import trio
from libp2p import new_host
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.crypto.x25519 import create_new_key_pair as x25519_key_pair
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import info_from_p2p_addr
from libp2p.pubsub.gossipsub import PROTOCOL_ID_V11, PROTOCOL_ID_V12, GossipSub
from libp2p.pubsub.pb import rpc_pb2
from libp2p.pubsub.pubsub import Pubsub
from libp2p.pubsub.validators import PUBSUB_SIGNING_PREFIX
from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_ID
from libp2p.security.noise.transport import Transport as NoiseTransport
from libp2p.tools.anyio_service import background_trio_service
from libp2p.utils import encode_varint_prefixed

from bench.child import emit


class Attacker:
    def __init__(self) -> None:
        self.key_pair = create_new_key_pair()
        security = {NOISE_ID: NoiseTransport(self.key_pair, noise_privkey=x25519_key_pair().private_key)}
        self.host = new_host(key_pair=self.key_pair, sec_opt=security)
        self.gossipsub = GossipSub(protocols=[PROTOCOL_ID_V12, PROTOCOL_ID_V11], degree=6, degree_low=4,
                                   degree_high=12, heartbeat_interval=1, spam_protection_enabled=False)
        self.pubsub = Pubsub(self.host, self.gossipsub)
        self.captured: list[rpc_pb2.Message] = []

    async def capture(self, topic: str) -> None:
        sub = await self.pubsub.subscribe(topic)
        while True:
            self.captured.append(await sub.get())

    def message(self, topic: str, data: bytes, from_id: bytes, sign: bool) -> rpc_pb2.Message:
        msg = rpc_pb2.Message(data=data, topicIDs=[topic], from_id=from_id, seqno=os.urandom(8))
        if sign:
            msg.signature = self.key_pair.private_key.sign(PUBSUB_SIGNING_PREFIX.encode() + msg.SerializeToString())
            msg.key = self.key_pair.public_key.serialize()
        return msg

    def raw_frame(self, kind: str, topic: str, honest: str) -> bytes:
        if kind == "undecodable_frame":
            return encode_varint_prefixed(b"\xff\xff\xff\xff\xff\xff")
        if kind == "oversized_frame":
            return encode_varint_prefixed(b"\x0a" * (3 << 19))  # 1.5 MiB > the 1 MiB inbound limit
        if kind == "malformed_key":
            # from = a sha2-256 multihash (no key inside), so the validator parses msg.key, which is junk.
            msg = rpc_pb2.Message(data=b"x", topicIDs=[topic], from_id=b"\x12\x20" + os.urandom(32),
                                  seqno=os.urandom(8), signature=b"\x01" * 64, key=b"\xff\xfe\xfd")
        elif kind == "unsigned":
            msg = self.message(topic, b"unsigned", self.host.get_id().to_bytes(), sign=False)
        elif kind == "forged_signature":
            msg = self.message(topic, b"forged", ID.from_base58(honest).to_bytes(), sign=True)
        else:
            raise ValueError(f"unknown kind {kind}")
        return encode_varint_prefixed(rpc_pb2.RPC(publish=[msg]).SerializeToString())

    async def send_raw(self, target: str, frame: bytes) -> str:
        """Write `frame` on a fresh pubsub stream; the target may reset it midway (that is its defence)."""
        stream = await self.host.new_stream(ID.from_base58(target), [PROTOCOL_ID_V11])
        try:
            await stream.write(frame)
            await trio.sleep(0.3)
            outcome = "written"
        except Exception as exc:  # the target reset the stream: report it, keep attacking
            outcome = f"target reset the stream ({type(exc).__name__})"
        await stream.reset()
        return outcome

    async def handle(self, cmd: dict[str, Any], nursery: trio.Nursery) -> None:
        rid = cmd.get("rid")
        kind = cmd["cmd"]
        if kind == "connect":
            info = info_from_p2p_addr(multiaddr.Multiaddr(cmd["addr"]))
            await self.host.connect(info)
            await self.pubsub.wait_for_peer(info.peer_id, timeout=10)
            emit(event="connected", rid=rid)
        elif kind == "capture":
            nursery.start_soon(self.capture, cmd["topic"])
            emit(event="capturing", rid=rid)
        elif kind == "captured":
            emit(event="captured", rid=rid, signers=[ID(m.from_id).to_base58() for m in self.captured])
        elif kind == "replay":
            msg = next(m for m in self.captured if ID(m.from_id).to_base58() == cmd["signer"])
            frame = encode_varint_prefixed(rpc_pb2.RPC(publish=[msg]).SerializeToString())
            emit(event="sent", rid=rid, outcome=await self.send_raw(cmd["target"], frame))
        elif kind == "raw":
            frame = self.raw_frame(cmd["kind"], cmd["topic"], cmd.get("honest", ""))
            emit(event="sent", rid=rid, outcome=await self.send_raw(cmd["target"], frame))
        elif kind == "publish":
            await self.pubsub.publish(cmd["topic"], bytes.fromhex(cmd["data_hex"]))
            emit(event="sent", rid=rid)
        else:
            raise ValueError(f"unknown command {kind}")

    async def run(self) -> None:
        async with self.host.run([multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")]), \
                background_trio_service(self.pubsub), background_trio_service(self.gossipsub):
            await self.pubsub.wait_until_ready()
            emit(event="ready", peer_id=self.host.get_id().to_base58())
            async with trio.open_nursery() as nursery:
                while line := await trio.to_thread.run_sync(sys.stdin.readline):
                    cmd = json.loads(line)
                    if cmd["cmd"] == "quit":
                        break
                    await self.handle(cmd, nursery)
                nursery.cancel_scope.cancel()


if __name__ == "__main__":
    trio.run(Attacker().run)
