"""The bounded design's wire sizes in the scale simulator, measured by encoding the real messages (issue 32).

Contract (pure): `WireSizes.of(setup)` encodes, with `protocol.codec.encode`, messages of the shape the node sends
in `setup`'s setting and adds what carries them:
- `digest_msg`: one DigestBatch of `groups_per_node` digests (16-byte ids, a "dataset:index" task label, 32-byte
  hashes; the shard count of N nodes announced; one public IPv4 address of its sender) plus `GOSSIP_OVERHEAD`
  (gossipsub's message fields and the RPC's signed sender record);
- `pull_request`, `pull_response`, `push`: a pull/push stream's frame (4-byte length + envelope) of a PullRequest
  for one group, a PullResponse serving one group of `group_bytes`, a push of one such group, each plus
  `STREAM_OVERHEAD` (a stream's opening: yamux frames, multistream-select of the protocol id, the close);
- `refusal`: a PullResponse refusing one group, framed, plus `STREAM_OVERHEAD`.
Sizes are what the node's codec gives today, so a change of the wire shows in the simulator's figures.
"""

from __future__ import annotations

from dataclasses import dataclass

from protocol.codec import encode
from protocol.messages import (
    DigestBatch,
    DigestWire,
    PulledGroup,
    PullRefusal,
    PullRequest,
    PullResponse,
)
from simulations.scale_model import GOSSIP_OVERHEAD, STREAM_OVERHEAD, ScaleSetup
from swarm_node.sharing.fanin import FanInParams, shard_count
from swarm_node.sharing.fanin_ledger import OVER_PULL
from swarm_node.sharing.pull_stream import frame

GROUP_ID = bytes(range(16))
CONTENT_HASH = bytes(32)
WHEN = 1.8e9  # a unix time of 2027: the float's encoding does not depend on its value
SENDER_ADDR = "/ip4/100.100.100.100/tcp/40001"  # one public IPv4 address, the longest spelling (30 characters)


@dataclass(frozen=True)
class WireSizes:
    digest_msg: int
    pull_request: int
    pull_response: int
    push: int
    refusal: int

    @classmethod
    def of(cls, setup: ScaleSetup) -> WireSizes:
        digests = tuple(DigestWire(bytes([i]) * 16, f"{'t' * 12}:{i}", 0.1875, True, CONTENT_HASH)
                        for i in range(setup.groups_per_node))
        batch = encode(DigestBatch(0, 1, digests, WHEN, shard_count(setup.n, FanInParams()), (SENDER_ADDR,)))
        served = PullResponse((PulledGroup(GROUP_ID, bytes(setup.group_bytes)),), (), WHEN)
        refused = PullResponse((), (PullRefusal(GROUP_ID, OVER_PULL),), WHEN)
        return cls(digest_msg=GOSSIP_OVERHEAD + len(batch),
                   pull_request=STREAM_OVERHEAD + len(frame(encode(PullRequest(1, (GROUP_ID,), WHEN)))),
                   pull_response=STREAM_OVERHEAD + len(frame(encode(served))),
                   push=STREAM_OVERHEAD + len(frame(encode(served))),
                   refusal=STREAM_OVERHEAD + len(frame(encode(refused))))
