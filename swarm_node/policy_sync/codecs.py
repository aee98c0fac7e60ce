"""Policy-update encodings (codecs) and the safetensors payload format, sans I/O.

A payload is safetensors bytes (never pickle): tensors + string metadata. A codec turns the publisher's residual
into payload tensors (`encode`), and, on the receiving side, validates the tensors it got against the base state
(`check`, on the header alone, before any tensor is materialised) and applies them (`apply`). Codecs are registered
by name in `CODECS` (name -> factory taking the codec's options); followers decode with the default instance, so a
payload must describe itself (decoding never depends on the encoder's options).

States are dicts name -> CPU fp32 contiguous tensor. `apply` never mutates its inputs: it returns new tensors, so a
caller can commit the result or drop it. All arithmetic is elementwise fp32 (one cast from bf16/fp16, which is
exact, and one IEEE add per element), hence bit-identical in any process on any machine that does not flush
denormals (`torch.set_flush_denormal(True)` would break agreement: leave it off).

Registered:
  full        the whole state as fp32 (a snapshot: base_version == version; replaces, does not add).
  dense-bf16  the residual cast to bf16: half the bytes of fp32, the rounding error is carried to the next delta.
  topk        per tensor, the ceil(fraction * numel) largest |residual| entries (all entries of tensors under
              `whole_below` entries) as bf16 values with their flat indices, sorted ascending and split as
              (index mod 65536) in uint16 plus a per-65536-block count in int32, i.e. ~4 bytes per kept entry.
              Everything not sent is carried to the next delta (error feedback).
"""

from __future__ import annotations

import json
import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import torch

from swarm_node import variants

State = dict[str, torch.Tensor]
Shape = tuple[int, ...]

MAX_HEADER_BYTES = 16 * 1024 * 1024  # a safetensors header beyond this is hostile, not a policy update
DTYPES: dict[str, torch.dtype] = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16,
                                  "U16": torch.uint16, "I32": torch.int32}


class DeltaError(Exception):
    """A policy update was rejected; the receiver's state is unchanged."""


class UnknownEncoding(DeltaError):
    """The update names an encoding this node does not have."""


class IntegrityError(DeltaError):
    """Payload sha256, payload metadata or the resulting state's hash does not match the update."""


class PayloadTooLarge(DeltaError):
    """The payload exceeds the receiver's size guard (checked before hashing or decoding)."""


class PayloadError(DeltaError):
    """The payload is not a valid safetensors update for this state (format, names, shapes, dtypes, values)."""


class NonFiniteError(PayloadError):
    """The payload carries NaN/inf, or applying it would produce them."""


class DeltaTooLarge(DeltaError):
    """The update moves the policy further (L2 norm of new - current state) than the follower's bound allows."""

    def __init__(self, message: str, norm: float, bound: float) -> None:
        super().__init__(message)
        self.norm = norm
        self.bound = bound


class VersionGap(DeltaError):
    """The update's base is newer than the receiver's version (or the receiver has no base): it needs the
    missing deltas or a snapshot."""

    def __init__(self, message: str, have: int, need: int) -> None:
        super().__init__(message)
        self.have = have
        self.need = need


class StaleUpdate(DeltaError):
    """The update is for a version the receiver already has (or an older one)."""


@dataclass(frozen=True)
class TensorSpec:
    dtype: torch.dtype
    shape: Shape


def read_header(payload: bytes) -> tuple[dict[str, TensorSpec], dict[str, str]]:
    """Tensor specs and metadata from a safetensors header, validated as untrusted input; raises PayloadError."""
    if len(payload) < 8:
        raise PayloadError(f"payload of {len(payload)} bytes is too short for a safetensors header")
    size = int.from_bytes(payload[:8], "little")
    if size > min(len(payload) - 8, MAX_HEADER_BYTES):
        raise PayloadError(f"safetensors header length {size} does not fit a payload of {len(payload)} bytes "
                           "(not a safetensors payload)")
    try:
        header = json.loads(payload[8:8 + size])
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PayloadError(f"safetensors header is not JSON: {exc}") from exc
    if not isinstance(header, dict):
        raise PayloadError("safetensors header is not a JSON object")
    metadata = header.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise PayloadError("safetensors metadata is not a string map")
    specs: dict[str, TensorSpec] = {}
    for name, entry in header.items():
        if not isinstance(entry, dict) or entry.get("dtype") not in DTYPES:
            raise PayloadError(f"tensor {name!r}: unsupported entry or dtype {str(entry)[:80]!r}")
        shape = entry.get("shape")
        if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                                  for d in shape):
            raise PayloadError(f"tensor {name!r}: bad shape {shape!r}")
        specs[name] = TensorSpec(DTYPES[entry["dtype"]], tuple(shape))
    return specs, metadata


def _require_names(got: set[str], want: set[str]) -> None:
    if got != want:
        missing, extra = sorted(want - got), sorted(got - want)
        raise PayloadError(f"payload tensors do not match the state: missing {missing[:3]}, unexpected {extra[:3]}"
                           f"{' ...' if len(missing) > 3 or len(extra) > 3 else ''}")


def _require_spec(name: str, spec: TensorSpec, dtypes: tuple[torch.dtype, ...], shape: Shape) -> None:
    if spec.dtype not in dtypes:
        raise PayloadError(f"tensor {name!r}: dtype {spec.dtype} where {' or '.join(map(str, dtypes))} is expected")
    if spec.shape != shape:
        raise PayloadError(f"tensor {name!r}: shape {list(spec.shape)} where {list(shape)} is expected")


def _require_finite(name: str, t: torch.Tensor, what: str) -> None:
    if not bool(torch.isfinite(t).all()):
        raise NonFiniteError(f"tensor {name!r}: non-finite {what}")


class Codec(ABC):
    """One encoding. `snapshot` codecs carry the whole state (base_version == version) and need no base."""

    name: ClassVar[str]
    snapshot: ClassVar[bool] = False

    @abstractmethod
    def encode(self, base: State, target: State) -> dict[str, torch.Tensor]:
        """Payload tensors that move `base` towards `target` (same names and shapes, fp32)."""

    @abstractmethod
    def check(self, shapes: dict[str, Shape] | None, specs: dict[str, TensorSpec]) -> None:
        """Raise PayloadError unless `specs` (from the header) is a valid payload for a state of `shapes`.
        `shapes` is None only for a snapshot codec received by a node with no state and no template."""

    @abstractmethod
    def apply(self, base: State | None, tensors: dict[str, torch.Tensor]) -> State:
        """The new state; `tensors` already passed `check`. Raises NonFiniteError/PayloadError on bad values."""

    def options(self) -> dict[str, str]:
        """Encoder options, recorded in the payload metadata (informational only)."""
        return {}


class FullCodec(Codec):
    name = "full"
    snapshot = True

    def encode(self, base: State, target: State) -> dict[str, torch.Tensor]:
        return {n: t for n, t in target.items()}

    def check(self, shapes: dict[str, Shape] | None, specs: dict[str, TensorSpec]) -> None:
        if not specs:
            raise PayloadError("snapshot has no tensors")
        if shapes is not None:
            _require_names(set(specs), set(shapes))
        for name, spec in specs.items():
            _require_spec(name, spec, (torch.float32,), shapes[name] if shapes is not None else spec.shape)

    def apply(self, base: State | None, tensors: dict[str, torch.Tensor]) -> State:
        for name, t in tensors.items():
            _require_finite(name, t, "values")
        return {n: t.contiguous() for n, t in tensors.items()}


class DenseBF16Codec(Codec):
    name = "dense-bf16"

    def encode(self, base: State, target: State) -> dict[str, torch.Tensor]:
        return {n: (target[n] - b).to(torch.bfloat16) for n, b in base.items()}

    def check(self, shapes: dict[str, Shape] | None, specs: dict[str, TensorSpec]) -> None:
        assert shapes is not None  # a delta always has a base
        _require_names(set(specs), set(shapes))
        for name, spec in specs.items():
            _require_spec(name, spec, (torch.bfloat16,), shapes[name])

    def apply(self, base: State | None, tensors: dict[str, torch.Tensor]) -> State:
        assert base is not None
        out: State = {}
        for name, b in base.items():
            d = tensors[name]
            _require_finite(name, d, "delta values")
            new = b + d.to(torch.float32)  # bf16 -> fp32 is exact; one IEEE add per element
            _require_finite(name, new, "result")
            out[name] = new
        return out


TOPK_BLOCK = 1 << 16  # indices are sent as (index mod 2^16) in uint16 plus a count per block of 2^16 elements
TOPK_VALUE_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
TOPK_PARTS = (":values", ":index", ":blocks")


@dataclass(frozen=True)
class TopKCodec(Codec):
    """Per tensor, the k = ceil(topk_fraction * numel) entries of largest |residual| (k = numel below whole_below).

    Payload per state tensor NAME (numel n, k kept, nb = ceil(n / 65536) blocks):
      NAME:values  [k] bf16 (or fp16)  residual at the kept entries, in ascending index order
      NAME:index   [k] uint16          kept flat index mod 65536
      NAME:blocks  [nb] int32          how many kept entries fall in each block of 65536 flat indices
    The receiver rebuilds idx = block * 65536 + index and requires it strictly increasing and < n (so no entry
    is written twice and none falls outside the tensor).
    """

    name: ClassVar[str] = "topk"
    topk_fraction: float = 0.1  # picked by bench/delta_bytes.py (see bench/results/delta_bytes.json)
    value_dtype: str = "bf16"
    # Tensors this small (norm scales, biases) go whole: Adam moves every one of their entries every step, so a
    # fraction of them would lag far behind (docs/MEASUREMENTS.md), and they cost little (4 bytes an entry).
    whole_below: int = 4096

    def __post_init__(self) -> None:
        if not 0 < self.topk_fraction <= 1:
            raise ValueError(f"topk_fraction must be in (0, 1], got {self.topk_fraction}")
        if self.value_dtype not in TOPK_VALUE_DTYPES:
            raise ValueError(f"value_dtype must be one of {sorted(TOPK_VALUE_DTYPES)}, got {self.value_dtype!r}")
        if self.whole_below < 0:
            raise ValueError(f"whole_below must be >= 0, got {self.whole_below}")

    def k_for(self, numel: int) -> int:
        if numel < self.whole_below:
            return numel
        return min(numel, max(1, math.ceil(self.topk_fraction * numel)))

    def options(self) -> dict[str, str]:
        return {"topk_fraction": repr(self.topk_fraction), "value_dtype": self.value_dtype,
                "whole_below": str(self.whole_below)}

    def encode(self, base: State, target: State) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        for name, b in base.items():
            residual = (target[name] - b).reshape(-1)  # [n]
            n = residual.numel()
            idx = torch.topk(residual.abs(), self.k_for(n), sorted=False).indices.sort().values if n else \
                torch.zeros(0, dtype=torch.int64)
            out[name + ":values"] = residual[idx].to(TOPK_VALUE_DTYPES[self.value_dtype])
            out[name + ":index"] = (idx % TOPK_BLOCK).to(torch.uint16)
            out[name + ":blocks"] = torch.bincount(idx // TOPK_BLOCK, minlength=_blocks(n)).to(torch.int32)
        return out

    def check(self, shapes: dict[str, Shape] | None, specs: dict[str, TensorSpec]) -> None:
        assert shapes is not None
        _require_names(set(specs), {n + part for n in shapes for part in TOPK_PARTS})
        for name, shape in shapes.items():
            n = math.prod(shape)
            values, index = specs[name + ":values"], specs[name + ":index"]
            if len(values.shape) != 1 or values.shape[0] > n:
                raise PayloadError(f"tensor {name!r}: {list(values.shape)} values for {n} entries")
            _require_spec(name + ":values", values, tuple(TOPK_VALUE_DTYPES.values()), values.shape)
            _require_spec(name + ":index", index, (torch.uint16,), values.shape)
            _require_spec(name + ":blocks", specs[name + ":blocks"], (torch.int32,), (_blocks(n),))

    def apply(self, base: State | None, tensors: dict[str, torch.Tensor]) -> State:
        assert base is not None
        out: State = {}
        for name, b in base.items():
            values, index, blocks = (tensors[name + part] for part in TOPK_PARTS)
            counts = blocks.to(torch.int64)
            if bool((counts < 0).any()) or int(counts.sum()) != values.numel():
                raise PayloadError(f"tensor {name!r}: block counts do not add up to {values.numel()} entries")
            starts = torch.arange(counts.numel(), dtype=torch.int64) * TOPK_BLOCK
            idx = torch.repeat_interleave(starts, counts) + index.to(torch.int64)
            if idx.numel() and (int(idx[-1]) >= b.numel() or not bool((idx[1:] > idx[:-1]).all())):
                raise PayloadError(f"tensor {name!r}: indices not strictly increasing within the tensor")
            _require_finite(name, values, "delta values")
            flat = b.reshape(-1).clone()
            new = flat[idx] + values.to(torch.float32)  # exact cast, one IEEE add per kept entry
            _require_finite(name, new, "result")
            flat[idx] = new  # indices are unique: a plain scatter, no accumulation order to worry about
            out[name] = flat.view(b.shape)
        return out


def _blocks(n: int) -> int:
    return (n + TOPK_BLOCK - 1) // TOPK_BLOCK


CODECS: variants.Registry[Callable[..., Codec]] = variants.Registry("echo.encoding", variants.CODECS)
for _codec in (FullCodec, DenseBF16Codec, TopKCodec):
    CODECS.add(_codec.name, _codec)


def make_codec(encoding: str, **options: object) -> Codec:
    """The registered codec `encoding` built with `options`; UnknownEncoding if there is none."""
    try:
        factory = CODECS[encoding]
    except KeyError:
        raise UnknownEncoding(f"unknown policy encoding {encoding!r}; known: {', '.join(sorted(CODECS))}") from None
    return factory(**options)
