"""What memory a device has, and what this process has peaked at on it: the measurements memory sizing runs on.

Contract:
- `device_memory_bytes(device)`: RAM for "cpu" (MemTotal, or the cgroup's memory.max when lower), the card's total
  for "cuda:N", the recommended working set for "mps" (RAM when torch does not say).
- `default_budget_bytes(device)`: the budget a node takes when none is given: `BUDGET_FRACTION` of that.
- `PeakMeter.for_device(device)`: `peak()` is the highest memory use since the last `reset()` (or start), in bytes:
  on a CPU the process's peak resident set (VmHWM in /proc/self/status) since start: `reset()` does nothing there,
  because lowering the kernel's high-water mark (/proc/self/clear_refs) would also lower what the kernel reports
  to whoever measures the process from outside (ru_maxrss, `time -v`, bench/memory.py); on CUDA
  torch.cuda.max_memory_allocated (reset_peak_memory_stats), on MPS the driver's current allocation (torch keeps
  no peak there). `current()` is the use right now.
- `return_freed_memory()` (glibc only; a no-op elsewhere) fixes malloc's mmap threshold at `MMAP_THRESHOLD`:
  glibc otherwise raises it after large frees, keeps later large tensors on its heap and never hands them back, so
  RSS climbs step after step although the live memory does not (measured: docs/MEASUREMENTS.md).
- `status_kib(text, key)` reads one "Key: N kB" line of a /proc status file (pure, for tests).
Reads only /proc, /sys/fs/cgroup and torch's allocator counters: no psutil.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

MIB = 1 << 20
# Of the device's memory, what a node takes by default: the rest is for the OS, other processes and the allocator's
# slack (RSS counts freed memory the allocator keeps; a CUDA context takes some hundreds of MiB outside torch).
BUDGET_FRACTION = {"cpu": 0.75, "cuda": 0.9, "mps": 0.7}
MMAP_THRESHOLD = 1 << 20  # bytes: allocations from this size on are mmapped, and unmapped when freed
M_MMAP_THRESHOLD = -3  # mallopt's parameter number (malloc.h)
PROC_STATUS = Path("/proc/self/status")
CGROUP_MAX = Path("/sys/fs/cgroup/memory.max")


def status_kib(text: str, key: str) -> int | None:
    """The value of a "Key:   N kB" line, in KiB (None when absent)."""
    for line in text.splitlines():
        name, sep, rest = line.partition(":")
        if sep and name == key:
            fields = rest.split()
            return int(fields[0]) if fields and fields[0].isdigit() else None
    return None


def return_freed_memory() -> bool:
    """Fix glibc's mmap threshold (see the module contract); False where there is no glibc mallopt."""
    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        libc = ctypes.CDLL(name)
        return bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD))
    except (OSError, AttributeError):
        return False


def machine_memory_bytes() -> int:
    """RAM: MemTotal, or this cgroup's limit when it is lower."""
    total = status_kib(Path("/proc/meminfo").read_text(), "MemTotal")
    ram = (total or 0) * 1024
    try:
        limit = CGROUP_MAX.read_text().strip()
    except OSError:
        limit = "max"
    if limit.isdigit() and (not ram or int(limit) < ram):
        return int(limit)
    return ram


def device_memory_bytes(device: str) -> int:
    kind = device.partition(":")[0]
    if kind == "cuda":
        return int(torch.cuda.get_device_properties(torch.device(device)).total_memory)
    if kind == "mps" and hasattr(torch.mps, "recommended_max_memory"):
        return int(torch.mps.recommended_max_memory())
    return machine_memory_bytes()


def default_budget_bytes(device: str) -> int:
    return int(device_memory_bytes(device) * BUDGET_FRACTION[device.partition(":")[0]])


@dataclass
class PeakMeter:
    """Peak and current memory use on one device (see the module contract)."""

    peak_fn: Callable[[], int]
    current_fn: Callable[[], int]
    reset_fn: Callable[[], None]

    def peak(self) -> int:
        return self.peak_fn()

    def current(self) -> int:
        return self.current_fn()

    def reset(self) -> None:
        self.reset_fn()

    @classmethod
    def for_device(cls, device: str) -> PeakMeter:
        return METERS[device.partition(":")[0]](device)


def _rss(key: str) -> int:
    return (status_kib(PROC_STATUS.read_text(), key) or 0) * 1024


def _cpu_meter(device: str) -> PeakMeter:
    return PeakMeter(lambda: _rss("VmHWM"), lambda: _rss("VmRSS"), lambda: None)


def _cuda_meter(device: str) -> PeakMeter:
    dev = torch.device(device)
    return PeakMeter(lambda: int(torch.cuda.max_memory_allocated(dev)), lambda: int(torch.cuda.memory_allocated(dev)),
                     lambda: torch.cuda.reset_peak_memory_stats(dev))


def _mps_meter(device: str) -> PeakMeter:
    def now() -> int:
        return int(torch.mps.driver_allocated_memory())
    return PeakMeter(now, now, lambda: None)


METERS: dict[str, Callable[[str], PeakMeter]] = {"cpu": _cpu_meter, "cuda": _cuda_meter, "mps": _mps_meter}
