"""Where a node computes: the torch device of the trainer, the reference model, LoRA and the transformers sampler,
and the precision the trainer computes in.

Contract:
- `Found.probe()` says what this machine has (CUDA cards by name, whether a card does bf16, MPS, the CPU's
  flags); everything else
  here is a pure function of a `Found`, so tests fake machines by building one.
- `resolve_device(spec, found)`: spec is "auto" | "cpu" | "cuda" | "cuda:N" | "mps" (the kinds in
  `variants.DEVICES`, registry `DEVICES`). Returns a `DeviceChoice`: the torch device string and one line saying
  what was picked and why. A device that is not there is a `UserError` of one line naming what was found.
- `PRECISIONS[name](choice, found)`: the trainer's autocast dtype, or None for plain fp32. "auto": bf16 on a
  CUDA card that supports it, else fp32; "fp32": None; "bf16": bf16 where torch autocasts to it (CUDA with bf16,
  CPU), else a UserError. Weights and optimizer state stay fp32 either way (master weights).
- `sampler_dtype(model_dtype, choice, found)`: the dtype a sampler (vLLM or transformers) runs in: the model's
  own half precision where the device computes in it (bf16: a CUDA card with bf16, or a CPU with AVX-512 BF16 or
  AMX, `CPU_BF16_FLAGS`; fp16: a CUDA card), else float32; with one line saying which and why.
- `place(model, device)` moves a model (and any LoRA adapters on it) to the device; `host_copy(tensors)` is the
  device-independent form of a state (owned CPU tensors) that checkpoints and payloads are written from.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from swarm_node import variants
from swarm_node.errors import UserError


@dataclass(frozen=True)
class Found:
    """What the machine has: CUDA card names (index order), whether card 0.. does bf16, MPS, the CPU's flags."""

    cuda: tuple[str, ...] = ()
    cuda_bf16: tuple[bool, ...] = ()
    mps: bool = False
    cpu_flags: frozenset[str] = frozenset()

    @classmethod
    def probe(cls) -> Found:
        names: tuple[str, ...] = ()
        bf16: tuple[bool, ...] = ()
        if torch.cuda.is_available():
            count = torch.cuda.device_count()
            names = tuple(torch.cuda.get_device_name(i) for i in range(count))
            # Ampere (compute capability 8) and later compute in bf16 natively.
            bf16 = tuple(torch.cuda.get_device_capability(i)[0] >= 8 for i in range(count))
        mps = bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available())
        return cls(names, bf16, mps, cpu_flags())

    def describe(self) -> str:
        """What was found, for error lines: "CPU only", "CPU and 2 CUDA devices (...)"."""
        parts = []
        if self.cuda:
            parts.append(f"{len(self.cuda)} CUDA device{'s' if len(self.cuda) > 1 else ''} "
                         f"({', '.join(f'cuda:{i} {n}' for i, n in enumerate(self.cuda))})")
        if self.mps:
            parts.append("MPS")
        return "CPU and " + " and ".join(parts) if parts else "CPU only (no CUDA, no MPS)"


@dataclass(frozen=True)
class DeviceChoice:
    device: str  # a torch device string: "cpu", "cuda:0", "mps"
    line: str  # one line: what was picked and why

    @property
    def kind(self) -> str:
        return self.device.partition(":")[0]


Resolver = Callable[[int | None, Found], DeviceChoice]
DEVICES: variants.Registry[Resolver] = variants.Registry("device", variants.DEVICES)


def resolve_device(spec: str, found: Found) -> DeviceChoice:
    kind, sep, index = spec.partition(":")
    if kind not in DEVICES or (sep and (kind != "cuda" or not index.isdigit())):
        raise UserError(f"--device {spec!r} unknown; choose one of auto, cpu, cuda, cuda:N, mps")
    return DEVICES[kind](int(index) if sep else None, found)


@DEVICES.register("cpu")
def _cpu(index: int | None, found: Found) -> DeviceChoice:
    return DeviceChoice("cpu", "device: cpu (asked for)")


@DEVICES.register("cuda")
def _cuda(index: int | None, found: Found) -> DeviceChoice:
    i = index or 0
    if not found.cuda:
        raise UserError(f"--device {'cuda' if index is None else f'cuda:{index}'}: no CUDA device here; found "
                        f"{found.describe()}")
    if i >= len(found.cuda):
        raise UserError(f"--device cuda:{i}: no such card; found {found.describe()}")
    return DeviceChoice(f"cuda:{i}", f"device: cuda:{i} ({found.cuda[i]}, asked for)")


@DEVICES.register("mps")
def _mps(index: int | None, found: Found) -> DeviceChoice:
    if not found.mps:
        raise UserError(f"--device mps: no MPS device here; found {found.describe()}")
    return DeviceChoice("mps", "device: mps (asked for)")


@DEVICES.register("auto")
def _auto(index: int | None, found: Found) -> DeviceChoice:
    if found.cuda:
        more = f" of {len(found.cuda)} CUDA devices" if len(found.cuda) > 1 else ""
        return DeviceChoice("cuda:0", f"device: auto picked cuda:0 ({found.cuda[0]}{more}; --device cpu to "
                                      "stay on the CPU)")
    if found.mps:
        return DeviceChoice("mps", "device: auto picked mps (no CUDA device; --device cpu to stay on the CPU)")
    return DeviceChoice("cpu", "device: auto picked cpu (no CUDA or MPS device found)")


Precision = Callable[[DeviceChoice, Found], "torch.dtype | None"]
PRECISIONS: variants.Registry[Precision] = variants.Registry("precision", variants.PRECISIONS)


def _card_bf16(choice: DeviceChoice, found: Found) -> bool:
    if choice.kind != "cuda":
        return False
    i = int(choice.device.partition(":")[2] or 0)
    return i < len(found.cuda_bf16) and found.cuda_bf16[i]


@PRECISIONS.register("auto")
def _auto_precision(choice: DeviceChoice, found: Found) -> torch.dtype | None:
    # On a CPU bf16 is slower than fp32 on most cores and changes every number: fp32 unless asked for.
    return torch.bfloat16 if _card_bf16(choice, found) else None


@PRECISIONS.register("fp32")
def _fp32(choice: DeviceChoice, found: Found) -> torch.dtype | None:
    return None


@PRECISIONS.register("bf16")
def _bf16(choice: DeviceChoice, found: Found) -> torch.dtype | None:
    if choice.kind == "cpu" or _card_bf16(choice, found):
        return torch.bfloat16
    raise UserError(f"train.precision bf16: {choice.device} does not compute in bf16; use precision fp32 or auto")


CPU_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})  # /proc/cpuinfo flags of CPUs that compute in bf16
CPUINFO = Path("/proc/cpuinfo")


def cpu_flags(cpuinfo: Path = CPUINFO) -> frozenset[str]:
    """The CPU's feature flags (Linux /proc/cpuinfo; empty elsewhere)."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


@dataclass(frozen=True)
class SamplerDtype:
    name: str  # a torch dtype name: "float32", "bfloat16", "float16"
    line: str | None  # what was picked and why; None for a float32 model


def _bf16_sampling(choice: DeviceChoice, found: Found) -> str | None:
    """None when the device samples in bf16, else why not."""
    if choice.kind == "cpu":
        return None if found.cpu_flags & CPU_BF16_FLAGS else "this CPU has neither avx512_bf16 nor amx_bf16"
    return None if _card_bf16(choice, found) else f"{choice.device} does not compute in bf16"


def _fp16_sampling(choice: DeviceChoice, found: Found) -> str | None:
    return None if choice.kind == "cuda" else f"float16 sampling runs on CUDA only, not {choice.device}"


# Half-precision model dtypes, each with why a device would not sample in it (None: it does).
HALF_SAMPLING: dict[str, Callable[[DeviceChoice, Found], str | None]] = {
    "bfloat16": _bf16_sampling, "float16": _fp16_sampling}


def sampler_dtype(model_dtype: str, choice: DeviceChoice, found: Found) -> SamplerDtype:
    """See the module contract; `model_dtype` is the checkpoint's (config.json `dtype` / `torch_dtype`)."""
    why_not = HALF_SAMPLING.get(model_dtype)
    if why_not is None:
        return SamplerDtype("float32", None)
    reason = why_not(choice, found)
    if reason is None:
        return SamplerDtype(model_dtype, f"sampler dtype: {model_dtype}, the model's ({choice.device} computes in it)")
    return SamplerDtype("float32", f"sampler dtype: float32, not the model's {model_dtype}: {reason}")


def precision_line(dtype: torch.dtype | None) -> str:
    return "precision: bf16 autocast, fp32 master weights" if dtype is not None else "precision: fp32"


def place(model: torch.nn.Module, device: str) -> torch.nn.Module:
    """Move the model (weights, buffers, LoRA adapters) to `device`, in place; returns it."""
    return model.to(torch.device(device))


def model_device(model: torch.nn.Module) -> torch.device:
    """The device of the model's first parameter (a model lives on one device here)."""
    return next(model.parameters()).device


def host_copy(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Owned, contiguous CPU copies: what is written to disk or the wire, whatever device computed them."""
    return {name: t.detach().to("cpu", copy=True).contiguous() for name, t in tensors.items()}
