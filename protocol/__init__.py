"""The swarm-node wire protocol, sans-I/O: message types, their msgpack codec, receiver limits, gossip validation,
and the pipelined broadcast of policy payloads (relay plans, chunk streams). WIRE.md is the byte-level spec.

Contract: imports nothing from `swarm_node` (a peer on another stack needs only this package and WIRE.md); no I/O,
no clocks (time is always an argument); decoding and validation raise `WireError` and nothing else for any input
bytes. `__all__` is the public API; the submodules stay importable for their remaining names (e.g.
`chunks.PROTOCOL_ID`).

Files:
  messages.py    every wire message type, topics, type tags, policy ids (`policy_owner`)
  limits.py      `Limits`: the bounds a receiver enforces
  errors.py      `WireError`, `Verdict` (REJECT / IGNORE / ACCEPT) and the `reject` / `ignore` builders
  codec.py       `encode` / `decode`: the envelope, bounded msgpack, freshness, replay keys
  bodies.py      per-message body maps and their exact schema checks (used by codec)
  fields.py      primitive field checks `expect_*` (used by bodies and chunks)
  validation.py  `validate_gossip`: decode + topic + attribution + freshness + task/tokenizer policy + replay
  relay.py       chunk layout, relay schedules (`make_plan`), the per-receiver state machine `Receiver`
  chunks.py      frames of the `/swarm-node/chunks/1` stream protocol
"""

from protocol.chunks import (
    AnnounceFrame,
    AnnounceRequest,
    ChunkHeader,
    ChunkRequest,
    ErrorFrame,
    decode_request,
    decode_response,
    encode_frame,
    frame_length,
    frame_limit,
)
from protocol.codec import (
    check_fresh,
    decode,
    decode_pulled,
    encode,
    encode_group,
    group_content_hash,
    replay_keys,
)
from protocol.errors import Verdict, WireError, ignore, reject
from protocol.limits import DEFAULT_MAX_MESSAGE_BYTES, MAX_INT, MAX_TIMESTAMP, Limits
from protocol.messages import (
    GROUP_ID_BYTES,
    MAX_SHARD,
    PULL_PROTOCOL,
    PULL_REFUSALS,
    PUSH_PROTOCOL,
    ROLES,
    SCHEMA_VERSION,
    SHA256_BYTES,
    TAG_TYPES,
    TOPIC_CONTROL,
    TOPIC_DIGESTS_PREFIX,
    TOPIC_POLICY,
    TOPIC_ROLLOUTS,
    TOPIC_STATUS,
    TOPIC_TYPES,
    TYPE_TAGS,
    WORKER_ACTIONS,
    CompletionWire,
    DigestBatch,
    DigestWire,
    Message,
    PolicyAnnounce,
    PulledGroup,
    PullRefusal,
    PullRequest,
    PullResponse,
    RolloutBatch,
    RolloutGroup,
    Status,
    TaskRefWire,
    WorkerControl,
    created_at_values,
    digest_topic,
    policy_owner,
    topic_type,
)
from protocol.relay import (
    DEFAULT_SCHEDULE,
    MAX_FANOUT,
    SCHEDULES,
    Action,
    Cancel,
    Complete,
    Failed,
    Plan,
    Receiver,
    ReceiverStats,
    Request,
    ScheduleError,
    Stored,
    chunk_count_for,
    chunk_digests,
    chunk_span,
    make_plan,
    parse_schedule,
    split,
)
from protocol.validation import (
    AcceptPolicy,
    ReplayGuard,
    Validated,
    check_attribution,
    check_message,
    check_task_ref,
    check_topic,
    validate_gossip,
)

__all__ = [
    # messages
    "SCHEMA_VERSION", "TOPIC_ROLLOUTS", "TOPIC_POLICY", "TOPIC_STATUS", "TOPIC_CONTROL", "ROLES", "WORKER_ACTIONS",
    "GROUP_ID_BYTES", "SHA256_BYTES", "TaskRefWire", "CompletionWire", "RolloutGroup", "RolloutBatch",
    "PolicyAnnounce", "Status", "WorkerControl", "Message", "TYPE_TAGS", "TAG_TYPES", "TOPIC_TYPES", "policy_owner",
    "created_at_values", "TOPIC_DIGESTS_PREFIX", "PULL_PROTOCOL", "PUSH_PROTOCOL", "PULL_REFUSALS", "MAX_SHARD",
    "DigestWire", "DigestBatch", "PullRequest", "PulledGroup", "PullRefusal", "PullResponse", "digest_topic",
    "topic_type",
    # encode / decode
    "encode", "decode", "replay_keys", "check_fresh", "encode_group", "group_content_hash", "decode_pulled",
    # limits
    "Limits", "DEFAULT_MAX_MESSAGE_BYTES", "MAX_INT", "MAX_TIMESTAMP",
    # validation
    "AcceptPolicy", "ReplayGuard", "Validated", "validate_gossip", "check_message", "check_topic",
    "check_attribution", "check_task_ref",
    # errors
    "WireError", "Verdict", "reject", "ignore",
    # relay
    "DEFAULT_SCHEDULE", "MAX_FANOUT", "SCHEDULES", "ScheduleError", "parse_schedule", "make_plan", "Plan",
    "Receiver", "ReceiverStats", "Action", "Request", "Cancel", "Stored", "Complete", "Failed", "chunk_count_for",
    "chunk_span", "split", "chunk_digests",
    # chunks
    "ChunkRequest", "AnnounceRequest", "ChunkHeader", "AnnounceFrame", "ErrorFrame", "encode_frame",
    "frame_length", "frame_limit", "decode_request", "decode_response",
]
