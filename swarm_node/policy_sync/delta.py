"""Policy updates between a learner and its followers: versioned, hash-checked safetensors deltas.

Contract. The learner's `PolicyPublisher` holds W_pub (the published policy) and makes version v+1 as
    W_pub(v+1) = W_pub(v) + decode(encode(W_train - W_pub(v)))
where decode runs on the publisher's OWN payload bytes with exactly the code a follower runs, so every follower
that applies the same chain reconstructs W_pub bit for bit (checked: each update carries `state_sha256`, the
`state_hash` of W_pub(v+1)). Whatever the encoding drops stays in W_train - W_pub and goes out with a later delta
(error feedback); W_train itself is never touched. A `PolicyFollower` applies updates after checking, in order:
the size guard, the payload sha256, the version chain (`VersionGap` when it lacks the base), the encoding, the
payload metadata, tensor names, dtypes and shapes (from the safetensors header, before decoding), finite values,
the hash of the result, and finally (when `max_delta_norm` > 0) the size of the step: `DeltaTooLarge` when the L2
norm of the new state minus the current one exceeds the bound (a delta is one published step; a snapshot may stand
for several, so its bound is `max_delta_norm * (snapshot version - our version)`, the triangle inequality over the
steps it skips; a follower with no state yet, e.g. after a lineage reset, has nothing to measure a snapshot
against and takes it unmeasured: it is still the learner's own payload, checked by its hashes). Any failure raises
a `DeltaError` and leaves the follower as it was.
Publisher and follower keep their last K updates and serve a chain to late joiners (`updates_from`); a joiner
whose base is too old gets a `snapshot()` (encoding "full", base_version == version) and continues with deltas.

Numbers. Every state here is a dict name -> CPU fp32 contiguous tensor, whatever dtype the model has: the
constructor and `publish` convert (bf16/fp16 -> fp32 is exact), so hashes are over fp32 W_pub, taken before any
sampler casts or repacks the weights. Cast to the model's dtype when loading into a sampler. Tensors handed out
(`published_state`) are never mutated in place by this module; don't mutate them either. Not thread-safe: call
from one thread. Payloads are safetensors (never pickle) and are parsed as untrusted input.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
from safetensors import SafetensorError
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors

from swarm_node.policy_sync.codecs import (
    CODECS,
    Codec,
    DeltaError,
    DeltaTooLarge,
    FullCodec,
    IntegrityError,
    NonFiniteError,
    PayloadError,
    PayloadTooLarge,
    Shape,
    StaleUpdate,
    State,
    TensorSpec,
    UnknownEncoding,
    VersionGap,
    make_codec,
    read_header,
)

__all__ = [
    "CODECS", "DeltaError", "DeltaTooLarge", "IntegrityError", "NonFiniteError", "PayloadError", "PayloadTooLarge",
    "PolicyFollower",
    "PolicyPublisher", "PolicyUpdate", "Shape", "StaleUpdate", "State", "UnknownEncoding", "VersionGap",
    "decode_update", "default_max_payload", "fp32_state", "model_state", "state_hash", "step_norm",
]

PAYLOAD_FORMAT = "swarm-node-policy/1"
HASH_DOMAIN = b"swarm-node-state/1\n"
# A follower with neither a state nor a shape template cannot bound a snapshot by the model's size.
MAX_PAYLOAD_WITHOUT_SHAPES = 4 << 30


def state_hash(state: Mapping[str, torch.Tensor]) -> str:
    """sha256 hex over the sorted names, each tensor's dtype and shape, and its raw contiguous CPU bytes."""
    h = hashlib.sha256(HASH_DOMAIN)
    for name in sorted(state):
        t = state[name].detach().cpu().contiguous()
        h.update(json.dumps([name, str(t.dtype), list(t.shape), t.numel() * t.element_size()]).encode() + b"\n")
        h.update(t.reshape(-1).view(torch.uint8).numpy())
    return h.hexdigest()


def step_norm(new: Mapping[str, torch.Tensor], old: Mapping[str, torch.Tensor]) -> float:
    """The L2 norm of new - old over every tensor of `new` (accumulated in float64; the same names in both)."""
    total = 0.0
    for name, t in new.items():
        total += float(torch.linalg.vector_norm(t - old[name], dtype=torch.float64)) ** 2
    return total ** 0.5


def fp32_state(state: Mapping[str, torch.Tensor]) -> State:
    """Owned CPU fp32 contiguous copies of a state's tensors (floating point only: a policy has no others)."""
    out: State = {}
    for name, t in state.items():
        if not t.is_floating_point():
            raise ValueError(f"tensor {name!r} has dtype {t.dtype}: a policy state holds floating-point tensors only")
        out[name] = t.detach().to(device="cpu", dtype=torch.float32, copy=True).contiguous()
    return out


def model_state(model: torch.nn.Module) -> State:
    """The policy state of a model: fp32 copies of its floating state_dict entries, each storage once.

    Tied weights (e.g. lm_head.weight = embed_tokens.weight) appear once, under the first name state_dict gives, so
    deltas don't pay for them twice; loading with `load_state_dict(strict=False)` restores both through the tie.
    """
    seen: set[tuple[int, int]] = set()
    kept: dict[str, torch.Tensor] = {}
    for name, t in model.state_dict().items():
        key = (t.untyped_storage().data_ptr(), t.storage_offset())
        if not t.is_floating_point() or key in seen:
            continue
        seen.add(key)
        kept[name] = t
    return fp32_state(kept)


def default_max_payload(shapes: Mapping[str, Shape]) -> int:
    """The largest payload any registered encoding makes for a state of these shapes (fp32 snapshot or top-k at
    fraction 1: 4 bytes per entry), plus block counts and header room."""
    numel = sum(_numel(s) for s in shapes.values())
    return 4 * numel + numel // 8192 + 1024 * (3 * len(shapes) + 4)


def _numel(shape: Shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


@dataclass(frozen=True)
class PolicyUpdate:
    """Version `version` of a learner's policy as a payload relative to `base_version` (== version: a snapshot)."""

    version: int
    base_version: int
    encoding: str
    payload: bytes = field(repr=False)
    sha256: bytes  # 32 raw bytes: sha256(payload)
    state_sha256: str  # state_hash of W_pub(version)

    @property
    def size(self) -> int:
        return len(self.payload)

    @property
    def is_snapshot(self) -> bool:
        return self.base_version == self.version


def _build_update(codec: Codec, tensors: dict[str, torch.Tensor], version: int, base_version: int,
                  state_sha256: str) -> PolicyUpdate:
    metadata = {"format": PAYLOAD_FORMAT, "encoding": codec.name, "version": str(version),
                "base_version": str(base_version), **{f"option.{k}": v for k, v in codec.options().items()}}
    payload = save_safetensors({n: t.contiguous() for n, t in tensors.items()}, metadata=metadata)
    return PolicyUpdate(version, base_version, codec.name, payload, hashlib.sha256(payload).digest(), state_sha256)


def decode_update(update: PolicyUpdate, base: State | None, base_version: int,
                  shapes: Mapping[str, Shape] | None, max_payload_bytes: int) -> State:
    """The state `update` yields on top of `base` (at `base_version`), after every check but the final state hash
    (the caller compares `state_hash` of the result with `update.state_sha256`); raises DeltaError.

    The one decoding path: followers run it on what they receive, the publisher on what it just encoded.
    """
    if update.size > max_payload_bytes:
        raise PayloadTooLarge(f"update v{update.version}: payload of {update.size} bytes exceeds the limit of "
                              f"{max_payload_bytes}")
    if hashlib.sha256(update.payload).digest() != update.sha256:
        raise IntegrityError(f"update v{update.version}: payload sha256 mismatch")
    try:
        codec = CODECS[update.encoding]()
    except KeyError:
        raise UnknownEncoding(f"update v{update.version}: unknown encoding {update.encoding!r}; known: "
                              f"{', '.join(sorted(CODECS))}") from None
    if codec.snapshot != update.is_snapshot:
        raise PayloadError(f"update v{update.version}: encoding {update.encoding!r} with base_version "
                           f"{update.base_version} (a snapshot has base_version == version, a delta does not)")
    if update.is_snapshot:
        if update.version <= base_version:
            raise StaleUpdate(f"snapshot v{update.version} is not newer than our v{base_version}")
    else:
        if update.version <= update.base_version:
            raise PayloadError(f"delta v{update.version} has base v{update.base_version}: not a forward step")
        if update.version <= base_version:
            raise StaleUpdate(f"delta v{update.base_version}->v{update.version}: we already have v{base_version}")
        if update.base_version != base_version or base is None:
            raise VersionGap(f"delta v{update.base_version}->v{update.version} needs base v{update.base_version}; "
                             f"we have {'none' if base is None else f'v{base_version}'}",
                             have=base_version, need=update.base_version)
    specs, metadata = read_header(update.payload)
    expected = {"format": PAYLOAD_FORMAT, "encoding": update.encoding, "version": str(update.version),
                "base_version": str(update.base_version)}
    wrong = sorted(k for k, v in expected.items() if metadata.get(k) != v)
    if wrong:
        raise IntegrityError(f"update v{update.version}: payload metadata disagrees with the update on {wrong}")
    codec.check(dict(shapes) if shapes is not None else None, specs)
    try:
        tensors = load_safetensors(update.payload)
    except (SafetensorError, ValueError, RuntimeError, OverflowError) as exc:
        raise PayloadError(f"update v{update.version}: not a valid safetensors payload: {exc}") from exc
    # The checks above read the header with Python's JSON parser; make sure the Rust one saw the same tensors.
    if {n: TensorSpec(t.dtype, tuple(t.shape)) for n, t in tensors.items()} != specs:
        raise PayloadError(f"update v{update.version}: decoded tensors differ from the safetensors header")
    return codec.apply(base, tensors)


class _VersionedPolicy:
    """A policy state at a version, plus the last `keep` updates that led to it (served to late joiners)."""

    def __init__(self, state: State | None, version: int, keep: int) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self._state = state
        self.version = version
        self.keep = keep
        self._kept: OrderedDict[int, PolicyUpdate] = OrderedDict()
        self._hash: tuple[int, str] | None = None
        self._snapshot: PolicyUpdate | None = None

    @property
    def state_sha256(self) -> str:
        """state_hash of the current state (cached per version)."""
        if self._state is None:
            raise DeltaError("no policy state yet: apply a snapshot first")
        if self._hash is None or self._hash[0] != self.version:
            self._hash = (self.version, state_hash(self._state))
        return self._hash[1]

    def published_state(self) -> State:
        """The current policy (fp32 CPU tensors; a new dict, shared tensors: don't mutate them)."""
        if self._state is None:
            raise DeltaError("no policy state yet: apply a snapshot first")
        return dict(self._state)

    def _commit(self, state: State, update: PolicyUpdate) -> None:
        self._state = state
        self.version = update.version
        self._hash = (update.version, update.state_sha256)
        self._kept[update.version] = update
        while len(self._kept) > self.keep:
            self._kept.popitem(last=False)

    def get(self, version: int) -> PolicyUpdate | None:
        """The kept update that produced `version`, if any."""
        return self._kept.get(version)

    def updates_from(self, base_version: int) -> list[PolicyUpdate] | None:
        """Kept updates taking a node from `base_version` (-1: nothing) to our version, oldest first; [] when it is
        current; None when the chain is not kept (send `snapshot()` instead)."""
        if base_version > self.version:
            return None
        chain: list[PolicyUpdate] = []
        v = self.version
        while v > base_version:
            update = self._kept.get(v)
            if update is None:
                return None
            chain.append(update)
            if update.is_snapshot:
                return chain[::-1]
            v = update.base_version
        return chain[::-1] if v == base_version else None

    def snapshot(self) -> PolicyUpdate:
        """The current state as a "full" update (base_version == version), built once per version."""
        if self._state is None:
            raise DeltaError("no policy state yet: nothing to snapshot")
        if self._snapshot is None or self._snapshot.version != self.version:
            self._snapshot = _build_update(FullCodec(), self._state, self.version, self.version, self.state_sha256)
        return self._snapshot


class PolicyPublisher(_VersionedPolicy):
    """The learner's side: W_pub at a version, and `publish` to make the next one from W_train.

    Version 0 is `initial_state` (followers that loaded the same base model have it: compare `state_sha256`).
    `options` go to the codec (e.g. topk_fraction=0.1). A W_train with NaN/inf raises NonFiniteError and
    publishes nothing.
    """

    def __init__(self, initial_state: Mapping[str, torch.Tensor], encoding: str = "topk", keep: int = 8,
                 **options: object) -> None:
        super().__init__(fp32_state(initial_state), 0, keep)
        self.codec = make_codec(encoding, **options)
        self.encoding = encoding
        self.shapes = {n: tuple(t.shape) for n, t in self.published_state().items()}
        self.max_payload_bytes = default_max_payload(self.shapes)

    def publish(self, train_state: Mapping[str, torch.Tensor]) -> PolicyUpdate:
        """Version+1 from the residual W_train - W_pub; W_pub becomes what followers will decode."""
        target = fp32_state({n: train_state[n] for n in train_state if n in self.shapes})
        got = {n: tuple(t.shape) for n, t in target.items()}
        if got != self.shapes:
            missing = sorted(set(self.shapes) - set(got))
            raise ValueError(f"train state does not match the published policy (missing {missing[:3]} or shapes "
                             "differ)")
        base = self.published_state()
        version = self.version + 1
        base_version = version if self.codec.snapshot else self.version
        # The new W_pub is decoded from the payload bytes by the followers' code path, so the hash covers what
        # followers will have, not what we meant to send; it is filled into the update after decoding.
        draft = _build_update(self.codec, self.codec.encode(base, target), version, base_version, "")
        new = decode_update(draft, base, self.version, self.shapes, self.max_payload_bytes)
        update = PolicyUpdate(version, base_version, draft.encoding, draft.payload, draft.sha256, state_hash(new))
        self._commit(new, update)
        return update


class PolicyFollower(_VersionedPolicy):
    """A follower's side: applies updates from a learner (untrusted bytes) and serves them on to late joiners.

    `state` is the base policy at `version` (default 0: the base model every node loads); with no state the
    version is -1 and the first update must be a snapshot, validated against `shapes` when given.
    `max_payload_bytes` defaults to the largest payload a valid update for this state can have. `max_delta_norm`
    (> 0) bounds the L2 norm of one published step (see the module contract); 0 disables the check.
    """

    def __init__(self, state: Mapping[str, torch.Tensor] | None = None, version: int | None = None, keep: int = 8,
                 max_payload_bytes: int | None = None, shapes: Mapping[str, Shape] | None = None,
                 max_delta_norm: float = 0.0) -> None:
        if not max_delta_norm >= 0:
            raise ValueError(f"max_delta_norm must be >= 0, got {max_delta_norm}")
        owned = fp32_state(state) if state is not None else None
        super().__init__(owned, (0 if owned is not None else -1) if version is None else version, keep)
        if owned is not None:
            shapes = {n: tuple(t.shape) for n, t in owned.items()}
        self.shapes: dict[str, Shape] | None = {n: tuple(s) for n, s in shapes.items()} if shapes is not None else None
        if max_payload_bytes is None:
            max_payload_bytes = default_max_payload(self.shapes) if self.shapes else MAX_PAYLOAD_WITHOUT_SHAPES
        self.max_payload_bytes = max_payload_bytes
        self.max_delta_norm = float(max_delta_norm)

    def apply(self, update: PolicyUpdate) -> State:
        """Verify and apply one update; the new state, or DeltaError with nothing changed."""
        new = decode_update(update, self._state, self.version, self.shapes, self.max_payload_bytes)
        if state_hash(new) != update.state_sha256:
            raise IntegrityError(f"update v{update.version}: resulting state hash differs from the publisher's")
        self._check_norm(update, new)
        self._commit(new, update)
        if self.shapes is None:
            self.shapes = {n: tuple(t.shape) for n, t in new.items()}
        return self.published_state()

    def _check_norm(self, update: PolicyUpdate, new: State) -> None:
        if self.max_delta_norm <= 0 or self._state is None:
            return  # disabled, or a first snapshot: nothing to measure it against (module contract)
        steps = update.version - self.version if update.is_snapshot else 1
        bound = self.max_delta_norm * steps
        norm = step_norm(new, self._state)
        if not norm <= bound:  # NaN-safe
            kind = f"snapshot v{update.version} ({steps} steps from our v{self.version})" if update.is_snapshot \
                else f"delta v{update.base_version}->v{update.version}"
            raise DeltaTooLarge(f"{kind} moves the policy by L2 norm {norm:.4g}, over the bound {bound:.4g} "
                                f"(echo.max_delta_norm = {self.max_delta_norm:g} per step)", norm, bound)
