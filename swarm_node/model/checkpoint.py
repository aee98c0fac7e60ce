"""Atomic, verifiable checkpoints: model, optimizer, RNG states, step, policy version and config.

Layout: RUN_DIR/checkpoints/step-00000025/{model,optimizer,rng}.safetensors + state.json + MANIFEST.json.
A checkpoint is written into a temporary directory, every file fsynced, MANIFEST.json (sha256 of every file)
written last, then the directory is renamed into place and its parent fsynced. A kill at any moment leaves
either the previous checkpoints alone or a complete new one; pruning renames a checkpoint away before deleting
it, so a kill mid-prune leaves a hidden leftover (removed by the next save), never a half-deleted step.
Loading verifies the manifest and skips (with a warning) anything partial or corrupt.
Safetensors and JSON only: nothing here unpickles.
Device-independent: every tensor is written from an owned CPU copy (`device.host_copy`) and read onto the CPU,
then copied into the model's and the optimizer's own device (torch moves optimizer state to its parameter's
device), so a checkpoint written on a GPU resumes on a CPU and the other way round.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, load_model, save_file
from transformers import PreTrainedModel

from swarm_node.model.device import host_copy

CHECKPOINT_DIR = "checkpoints"
STEP_DIR = re.compile(r"^step-(\d{8})$")
MANIFEST = "MANIFEST.json"


class CheckpointError(Exception):
    """A checkpoint could not be written (e.g. disk full); earlier checkpoints are untouched."""


@dataclass
class Checkpoint:
    path: Path
    step: int
    state: dict[str, Any]


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _flatten_optimizer(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    sd = optimizer.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, Any] = {}
    for idx, entry in sd["state"].items():
        for key, value in entry.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{idx}.{key}"] = value
            else:
                scalars[f"{idx}.{key}"] = value
    return host_copy(tensors), {"param_groups": sd["param_groups"], "scalars": scalars}


def model_tensors(model: torch.nn.Module) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The model's state as CPU copies, each storage once (a tied pair under its first name), and the metadata
    naming each dropped twin's kept name (as safetensors' save_model writes it)."""
    kept: dict[str, torch.Tensor] = {}
    first: dict[tuple[torch.device, int, int], str] = {}
    twins: dict[str, str] = {}
    for name, t in model.state_dict().items():
        key = (t.device, t.untyped_storage().data_ptr(), t.storage_offset())
        if key in first and t.shape == kept[first[key]].shape:
            twins[name] = first[key]
            continue
        first.setdefault(key, name)
        kept[name] = t
    return host_copy(kept), twins


def _unflatten_optimizer(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> dict[str, Any]:
    state: dict[int, dict[str, Any]] = {}
    for name, value in list(tensors.items()) + list(meta["scalars"].items()):
        idx, key = name.split(".", 1)
        state.setdefault(int(idx), {})[key] = value
    return {"state": state, "param_groups": meta["param_groups"]}


def rng_state() -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    return {"torch_cpu": torch.random.get_rng_state()}, {"python": state_to_json(random.getstate())}


def state_to_json(value: Any) -> Any:
    return [state_to_json(v) for v in value] if isinstance(value, tuple | list) else value


def state_from_json(value: Any) -> Any:
    return tuple(state_from_json(v) for v in value) if isinstance(value, list) else value


def save_checkpoint(run_dir: Path, step: int, model: PreTrainedModel, optimizer: torch.optim.Optimizer,
                    state: dict[str, Any], keep: int = 3) -> Path:
    """Write checkpoint `step` atomically; keep the newest `keep`. Raises CheckpointError, losing nothing."""
    root = run_dir / CHECKPOINT_DIR
    final = root / f"step-{step:08d}"
    tmp = root / f".tmp-step-{step:08d}-{os.getpid()}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        weights, twins = model_tensors(model)
        save_file(weights, str(tmp / "model.safetensors"), metadata=twins or None)
        opt_tensors, opt_meta = _flatten_optimizer(optimizer)
        save_file(opt_tensors, str(tmp / "optimizer.safetensors"))
        rng_tensors, rng_meta = rng_state()
        save_file(rng_tensors, str(tmp / "rng.safetensors"))
        (tmp / "state.json").write_text(json.dumps(
            {**state, "step": step, "optimizer": opt_meta, "rng": rng_meta}, indent=1))
        files = sorted(p.name for p in tmp.iterdir())
        for name in files:
            _fsync_file(tmp / name)
        manifest = {"step": step, "files": {name: _sha256(tmp / name) for name in files}}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1))
        _fsync_file(tmp / MANIFEST)
        _fsync_dir(tmp)
        if final.exists():  # a checkpoint of the same step from an earlier attempt: replace it whole
            shutil.rmtree(final)
        os.rename(tmp, final)
        _fsync_dir(root)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointError(f"checkpoint at step {step} not written ({exc.strerror or exc}); "
                              "earlier checkpoints are intact") from exc
    _prune(root, keep)
    return final


def _prune(root: Path, keep: int) -> None:
    complete = [p for p in _step_dirs(root) if (p / MANIFEST).exists()]
    for old in complete[keep:]:
        # Renamed away first: a kill mid-delete then leaves a `.old-` leftover, never a step dir with half its
        # files (which, lacking a manifest, would no longer count as complete and never be pruned).
        doomed = root / f".old-{old.name}"
        shutil.rmtree(doomed, ignore_errors=True)
        os.rename(old, doomed)
        shutil.rmtree(doomed, ignore_errors=True)
    for stale in root.glob(".old-step-*"):  # leftovers of killed prunes
        shutil.rmtree(stale, ignore_errors=True)
    for stale in root.glob(".tmp-step-*"):  # leftovers of killed writers
        if not stale.name.endswith(f"-{os.getpid()}"):
            shutil.rmtree(stale, ignore_errors=True)


def _step_dirs(root: Path) -> list[Path]:
    """Checkpoint directories, newest first."""
    if not root.is_dir():
        return []
    return sorted((p for p in root.iterdir() if STEP_DIR.match(p.name)), key=lambda p: p.name, reverse=True)


def verify(path: Path) -> dict[str, Any]:
    """The checkpoint's state.json if every file matches the manifest; raises ValueError naming the problem."""
    manifest_path = path / MANIFEST
    if not manifest_path.exists():
        raise ValueError("no manifest (partial write)")
    try:
        manifest = json.loads(manifest_path.read_text())
        files = manifest["files"]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ValueError(f"unreadable manifest: {exc}") from exc
    for name in ("model.safetensors", "optimizer.safetensors", "rng.safetensors", "state.json"):
        if name not in files:
            raise ValueError(f"manifest lacks {name}")
    for name, digest in files.items():
        if not (path / name).exists():
            raise ValueError(f"{name} missing")
        if _sha256(path / name) != digest:
            raise ValueError(f"{name} does not match its sha256")
    return json.loads((path / "state.json").read_text())


def latest_checkpoint(run_dir: Path, warn: Callable[[str], None] = print) -> Checkpoint | None:
    """The newest checkpoint that verifies; broken ones are reported and skipped."""
    for path in _step_dirs(run_dir / CHECKPOINT_DIR):
        try:
            state = verify(path)
        except (ValueError, OSError) as exc:
            warn(f"warning: skipping checkpoint {path.name}: {exc}")
            continue
        return Checkpoint(path, int(state["step"]), state)
    return None


def restore(ckpt: Checkpoint, model: PreTrainedModel, optimizer: torch.optim.Optimizer) -> None:
    """Load model, optimizer and RNG states from a verified checkpoint, whatever device wrote it: tensors are read
    onto the CPU and copied into the model's and the optimizer's device."""
    missing, unexpected = load_model(model, str(ckpt.path / "model.safetensors"), strict=False, device="cpu")
    if unexpected or [m for m in missing if "lm_head" not in m]:  # lm_head may be tied to the embedding
        raise ValueError(f"checkpoint {ckpt.path.name} does not match the model: missing {missing}, "
                         f"unexpected {unexpected}")
    optimizer.load_state_dict(_unflatten_optimizer(load_file(str(ckpt.path / "optimizer.safetensors"), device="cpu"),
                                                   ckpt.state["optimizer"]))
    torch.random.set_rng_state(load_file(str(ckpt.path / "rng.safetensors"), device="cpu")["torch_cpu"])
    random.setstate(state_from_json(ckpt.state["rng"]["python"]))
