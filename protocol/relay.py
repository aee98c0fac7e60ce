"""Pipelined broadcast of one policy payload, sans-I/O: chunk layout, relay schedules, receiver state machine.

Contract:
- Layout: chunk k of a payload of `size` bytes split into `count` chunks is payload[k*size//count :
  (k+1)*size//count], an even split (every chunk holds floor or ceil of size/count bytes; count <= size, so
  none is empty). `chunk_count_for(size, chunk_bytes)` picks the fewest chunks of at most chunk_bytes each.
- A schedule (registry `SCHEDULES`, spec "name" or "name:param", e.g. "stripe:2") turns the source and the ordered
  receivers into a `Plan`: for every stripe and receiver, the peer it pulls that stripe's chunks from (its parent).
  Chunk k belongs to stripe k % plan.stripes. A plan is a pure function of (spec, source, receivers), so every
  receiver of an announce derives the same one. Parents always come earlier in a stripe's tree than their
  children, so the ancestors of a node never include the node itself (no waiting cycles).
- `Receiver`, one per receiving node and payload (h11 style): events in (`start`, `on_chunk`, `on_peer_failed`),
  actions out: `Request(peer, chunks)` (pull these chunks from peer, in order; the peer sends each one as soon as it
  holds it, which is what pipelines the broadcast), `Cancel(peer)` (drop every stream with peer), `Stored(k)` (a
  verified chunk is held: send it to whoever waits for it), `Complete` (every chunk held and the whole payload's
  SHA-256 matches), `Failed(reason)`.
- Every chunk is checked against its SHA-256 before it is stored, so a relay forwards only verified bytes. A bad
  chunk or a failed peer moves every chunk still expected from that peer to the next live holder on the chunk's
  candidate list: for a plan, its ancestors in the chunk's stripe tree, ending at the source (which holds all).
  A peer that sent one bad chunk is dropped for the rest of this payload.
No I/O and no clocks: timeouts belong to the caller, which reports them as `on_peer_failed`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

MAX_FANOUT = 64


# ------------------------------------------------------------------------------------------------------ layout
def chunk_count_for(size: int, chunk_bytes: int) -> int:
    """The fewest chunks of at most `chunk_bytes` bytes that hold `size` bytes (at least 1)."""
    if size < 1 or chunk_bytes < 1:
        raise ValueError(f"size and chunk_bytes must be positive, got {size}, {chunk_bytes}")
    return -(-size // chunk_bytes)


def chunk_span(size: int, count: int, k: int) -> tuple[int, int]:
    """[start, stop) of chunk k in the even split of `size` bytes into `count` chunks."""
    if not 0 <= k < count <= size:
        raise ValueError(f"chunk {k} of {count} over {size} bytes")
    return k * size // count, (k + 1) * size // count


def split(payload: bytes, count: int) -> list[bytes]:
    """The chunks of `payload`, in order."""
    return [payload[slice(*chunk_span(len(payload), count, k))] for k in range(count)]


def chunk_digests(chunks: Iterable[bytes]) -> tuple[bytes, ...]:
    return tuple(hashlib.sha256(c).digest() for c in chunks)


# ---------------------------------------------------------------------------------------------------- schedules
class ScheduleError(ValueError):
    """A schedule spec that names no registered schedule or carries a bad parameter."""


@dataclass(frozen=True)
class Plan:
    """Who pulls which stripe from whom. parents[s][r] is receiver r's parent in stripe s (the source or an
    earlier receiver of that stripe's tree)."""

    source: str
    receivers: tuple[str, ...]
    parents: tuple[Mapping[str, str], ...]

    @property
    def stripes(self) -> int:
        return len(self.parents)

    def stripe(self, k: int) -> int:
        return k % self.stripes

    def parent(self, node: str, stripe: int) -> str:
        return self.parents[stripe][node]

    def ancestors(self, node: str, stripe: int) -> tuple[str, ...]:
        """Parent, grandparent, ..., the source: who holds (or will hold) this stripe before `node`."""
        out: list[str] = []
        while node != self.source:
            node = self.parents[stripe][node]
            out.append(node)
        return tuple(out)

    def children(self, node: str, stripe: int) -> tuple[str, ...]:
        """Receivers that pull this stripe from `node`, in receiver order."""
        return tuple(r for r in self.receivers if self.parents[stripe][r] == node)


def _tree(source: str, order: Sequence[str], root_fanout: int, fanout: int) -> dict[str, str]:
    """A heap laid over `order`: the first `root_fanout` nodes hang off the source, node j after them off
    order[(j - root_fanout) // fanout]. Interior nodes are the earliest in `order`."""
    return {node: source if j < root_fanout else order[(j - root_fanout) // fanout] for j, node in enumerate(order)}


def chain(source: str, receivers: tuple[str, ...], param: int | None) -> Plan:
    """source -> r0 -> r1 -> ...: every node uploads each chunk once; depth N. About (M/B)(1 + (N-1)/K)."""
    return Plan(source, receivers, (_tree(source, receivers, 1, 1),))


def tree(source: str, receivers: tuple[str, ...], param: int | None) -> Plan:
    """A plain f-ary tree rooted at the source: every interior node (the source too) uploads f copies."""
    f = param if param is not None else 2
    return Plan(source, receivers, (_tree(source, receivers, f, f),))


def star(source: str, receivers: tuple[str, ...], param: int | None) -> Plan:
    """Everyone pulls from the source (the baseline): about N*M/B."""
    return Plan(source, receivers, (_tree(source, receivers, len(receivers), 1),))


def stripe(source: str, receivers: tuple[str, ...], param: int | None) -> Plan:
    """SplitStream-like: f stripes (chunk k in stripe k % f), each an f-ary tree under one source child.

    Receiver i is interior in stripe i % f only (that group comes first in the stripe's order), a leaf in the
    others, so each node uploads about M (f children x M/f) and the source uploads M once; the depth is about
    log_f(N). Time about M/B plus the pipeline fill, depth x f chunks at B/f."""
    f = param if param is not None else 2
    parents = []
    for s in range(f):
        group = [r for i, r in enumerate(receivers) if i % f == s]
        rest = [r for i, r in enumerate(receivers) if i % f != s]
        parents.append(_tree(source, group + rest, 1, f))
    return Plan(source, receivers, tuple(parents))


Schedule = Callable[[str, tuple[str, ...], "int | None"], Plan]
SCHEDULES: dict[str, Schedule] = {"chain": chain, "tree": tree, "star": star, "stripe": stripe}
TAKES_PARAM = frozenset({"tree", "stripe"})
DEFAULT_SCHEDULE = "stripe:2"


def parse_schedule(spec: str) -> tuple[str, int | None]:
    """"name" or "name:param" -> (name, param); ScheduleError unless the name is registered and the parameter
    (only for schedules that take one) is an int in [1, MAX_FANOUT]."""
    name, sep, raw = spec.partition(":")
    if name not in SCHEDULES:
        raise ScheduleError(f"unknown schedule {name[:40]!r} (known: {', '.join(sorted(SCHEDULES))})")
    if not sep:
        return name, None
    if name not in TAKES_PARAM:
        raise ScheduleError(f"schedule {name!r} takes no parameter")
    if not (raw.isascii() and raw.isdigit() and 1 <= int(raw) <= MAX_FANOUT):
        raise ScheduleError(f"schedule {name!r}: parameter {raw[:20]!r} is not an int in [1, {MAX_FANOUT}]")
    return name, int(raw)


def make_plan(spec: str, source: str, receivers: Sequence[str]) -> Plan:
    """The plan for `spec` over distinct `receivers` (the source not among them)."""
    name, param = parse_schedule(spec)
    receivers = tuple(receivers)
    if len(set(receivers)) != len(receivers) or source in receivers:
        raise ScheduleError("receivers must be distinct and must not include the source")
    if not receivers:
        raise ScheduleError("a plan needs at least one receiver")
    return SCHEDULES[name](source, receivers, param)


# ------------------------------------------------------------------------------------------ the receiver machine
@dataclass(frozen=True)
class Request:
    """Open a stream to `peer` and pull `chunks` (ascending) from it."""

    peer: str
    chunks: tuple[int, ...]


@dataclass(frozen=True)
class Cancel:
    """Close every stream with `peer` (it failed or sent a bad chunk); nothing more is expected from it."""

    peer: str


@dataclass(frozen=True)
class Stored:
    """Chunk `chunk` is verified and held: hand it to local waiters (children pulling it)."""

    chunk: int


@dataclass(frozen=True)
class Complete:
    """Every chunk is held and the payload matches its SHA-256."""


@dataclass(frozen=True)
class Failed:
    reason: str


Action = Request | Cancel | Stored | Complete | Failed
Candidates = Callable[[int], Sequence[str]]


@dataclass
class ReceiverStats:
    bad_chunks: int = 0  # chunks whose SHA-256 did not match (then fetched from another holder)
    failed_peers: int = 0  # peers dropped for failing or for a bad chunk
    reassigned: int = 0  # chunks moved to another holder
    duplicates: int = 0  # chunks that arrived when already held (after a reassignment)


class Receiver:
    """The per-receiver state machine; see the module docstring. `candidates(k)` lists who may serve chunk k,
    best first; the first one not yet dropped is asked."""

    def __init__(self, hashes: Sequence[bytes], digest: bytes, candidates: Candidates) -> None:
        if not hashes:
            raise ValueError("a payload has at least one chunk")
        self.hashes = tuple(hashes)
        self.digest = digest
        self.count = len(self.hashes)
        self.stats = ReceiverStats()
        self.dead: set[str] = set()
        self.state = "idle"  # idle -> running -> complete | failed
        self._candidates = candidates
        self._chunks: list[bytes | None] = [None] * self.count
        self._missing = self.count
        self._expect: dict[int, str] = {}  # missing chunk -> the peer it is pulled from now

    @classmethod
    def in_plan(cls, plan: Plan, me: str, hashes: Sequence[bytes], digest: bytes) -> Receiver:
        """A receiver of `plan`: chunk k comes from its parent in k's stripe, else the next ancestor up."""
        if me not in plan.receivers:
            raise ValueError(f"{me} is not a receiver of this plan")
        by_stripe = [plan.ancestors(me, s) for s in range(plan.stripes)]
        return cls(hashes, digest, lambda k: by_stripe[k % len(by_stripe)])

    @classmethod
    def from_holders(cls, holders: Sequence[str], hashes: Sequence[bytes], digest: bytes) -> Receiver:
        """A late joiner: chunks spread round-robin over `holders`, each falling back to the next one."""
        if not holders:
            raise ValueError("no holders to fetch from")
        order = tuple(holders)
        return cls(hashes, digest, lambda k: order[k % len(order):] + order[:k % len(order)])

    # -- queries ------------------------------------------------------------------------------------------------
    def has(self, k: int) -> bool:
        return 0 <= k < self.count and self._chunks[k] is not None

    def chunk(self, k: int) -> bytes | None:
        return self._chunks[k] if 0 <= k < self.count else None

    @property
    def missing(self) -> int:
        return self._missing

    def expected_from(self, peer: str) -> tuple[int, ...]:
        return tuple(sorted(k for k, p in self._expect.items() if p == peer))

    def payload(self) -> bytes:
        if self.state != "complete":
            raise RuntimeError(f"payload not complete ({self._missing} chunks missing, state {self.state})")
        return b"".join(c for c in self._chunks if c is not None)

    # -- events -------------------------------------------------------------------------------------------------
    def start(self) -> list[Action]:
        if self.state != "idle":
            raise RuntimeError(f"start() in state {self.state}")
        self.state = "running"
        return self._assign(range(self.count))

    def on_chunk(self, peer: str, k: int, data: bytes) -> list[Action]:
        """Chunk k's bytes arrived from peer (whatever it was asked for: a verified chunk is a good chunk)."""
        if self.state != "running" or not 0 <= k < self.count or self._chunks[k] is not None:
            self.stats.duplicates += 1
            return []
        if hashlib.sha256(data).digest() != self.hashes[k]:
            self.stats.bad_chunks += 1
            return self._drop(peer)
        self._chunks[k] = bytes(data)
        self._missing -= 1
        self._expect.pop(k, None)
        actions: list[Action] = [Stored(k)]
        if self._missing == 0:
            # Each chunk matched the announce, so a mismatch here means the announce itself is inconsistent.
            whole = hashlib.sha256()
            for c in self._chunks:
                whole.update(c)  # type: ignore[arg-type]
            if whole.digest() == self.digest:
                self.state = "complete"
                actions.append(Complete())
            else:
                self.state = "failed"
                actions.append(Failed("payload_sha256_mismatch"))
        return actions

    def on_peer_failed(self, peer: str) -> list[Action]:
        """A stream with `peer` broke, timed out or was refused: pull what it owed from the next holders."""
        if self.state != "running":
            return []
        return self._drop(peer)

    # -- internals ----------------------------------------------------------------------------------------------
    def _drop(self, peer: str) -> list[Action]:
        if peer in self.dead:
            return []
        self.dead.add(peer)
        self.stats.failed_peers += 1
        lost = self.expected_from(peer)
        self.stats.reassigned += len(lost)
        return [Cancel(peer), *self._assign(lost)]

    def _assign(self, chunks: Iterable[int]) -> list[Action]:
        by_peer: dict[str, list[int]] = {}
        for k in chunks:
            peer = next((p for p in self._candidates(k) if p not in self.dead), None)
            if peer is None:
                self.state = "failed"
                return [Failed(f"no live holder left for chunk {k}")]
            self._expect[k] = peer
            by_peer.setdefault(peer, []).append(k)
        return [Request(peer, tuple(ks)) for peer, ks in by_peer.items()]
