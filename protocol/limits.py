"""Receiver-side limits for decoding wire messages.

Contract: a `Limits` value is plain data chosen by the *receiving* node (its vocabulary size, its clock window);
the decoder enforces every bound here before building anything larger than the bytes it was handed. Bounds on
construction are checked so that a bad configuration fails at start-up, not on the first message.
"""

from __future__ import annotations

from dataclasses import dataclass

# py-libp2p drops gossip messages above 1 MiB silently; half of that leaves room for the pubsub frame and
# keeps per-peer outbound queues (1 MiB hard-coded) from overflowing on a single message.
DEFAULT_MAX_MESSAGE_BYTES = 512 * 1024
# Largest integer a field may carry: msgpack's signed 64-bit range, non-negative half.
MAX_INT = 2**63 - 1
# No honest clock reads after the year 5000; a larger created-at is malformed, not merely "in the future".
MAX_TIMESTAMP = 1e11


@dataclass(frozen=True)
class Limits:
    """Bounds a receiver enforces on every decoded message.

    vocab_size is the receiver's tokenizer vocabulary: the token ids of a group of the receiver's tokenizer
    (`tokenizer_hash`; every group when it is empty) must be below it. A group of another tokenizer is re-tokenised
    from its text by the receiver, its ids only bounded by `max_foreign_vocab` (the largest vocabularies in use:
    Gemma 3's 262,144). Time bounds: a message is
    fresh when `now - max_age_s <= created_at <= now + max_clock_skew_s`.
    """

    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    max_groups_per_message: int = 16
    max_completions_per_group: int = 64
    max_tokens_per_completion: int = 4096
    max_spans_per_completion: int = 64  # policy-version spans of one completion (APRIL: max_lag + 1 at most)
    max_text_chars: int = 32768
    vocab_size: int = 262_144
    tokenizer_hash: str = ""  # the receiver's; "" checks every group's ids against vocab_size
    max_foreign_vocab: int = 262_144
    max_name_chars: int = 128  # policy ids, dataset names, tokenizer hashes, model families, capabilities
    max_config_chars: int = 2048  # canonical JSON of a task's options
    max_capabilities: int = 32
    max_policy_bytes: int = 2**40  # announced size of a policy delta or snapshot
    max_chunks: int = 2**20
    max_chunk_bytes: int = 16 << 20  # one chunk of an announce that lists chunk hashes (what a relay buffers)
    max_receivers: int = 1024  # peers one announce's relay plan covers
    max_digests_per_message: int = 64  # digests in one digest batch (one sender's groups of one round)
    max_pulls_per_request: int = 16  # group ids one pull request names (and groups one response carries)
    max_digest_addrs: int = 4  # dialable addresses of its sender one digest batch carries (`protocol.addrs`)
    max_addr_chars: int = 64  # one such address ("/ip6/" + 39 + "/tcp/65535" is 54)
    max_clock_skew_s: float = 30.0
    max_age_s: float = 600.0

    def __post_init__(self) -> None:
        for name in ("max_message_bytes", "max_groups_per_message", "max_completions_per_group",
                     "max_tokens_per_completion", "max_spans_per_completion", "max_text_chars", "vocab_size",
                     "max_foreign_vocab", "max_name_chars", "max_config_chars", "max_capabilities", "max_policy_bytes",
                     "max_chunks", "max_chunk_bytes", "max_receivers", "max_digests_per_message",
                     "max_pulls_per_request", "max_digest_addrs", "max_addr_chars"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ValueError(f"Limits.{name} must be a positive int, got {value!r}")
        if max(self.vocab_size, self.max_foreign_vocab) > 2**32:
            raise ValueError("Limits.vocab_size and max_foreign_vocab must fit the uint32 token blob (<= 2**32)")
        for name in ("max_clock_skew_s", "max_age_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
                raise ValueError(f"Limits.{name} must be a finite non-negative number, got {value!r}")
