"""Checkpoints: exact round trip, corrupt and partial ones skipped, a full disk loses nothing."""

from __future__ import annotations

import errno
import random
from pathlib import Path

import pytest
import torch

from swarm_node.model import checkpoint
from swarm_node.model.default_model import load_model


def _trained_pair(model_dir: Path) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model, _ = load_model(model_dir)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(input_ids=torch.tensor([[3, 4, 5]]), labels=torch.tensor([[3, 4, 5]])).loss.backward()
    opt.step()
    return model, opt


def test_round_trip_is_exact(tiny_model_dir: Path, tmp_path: Path) -> None:
    model, opt = _trained_pair(tiny_model_dir)
    random.seed(11)
    torch.manual_seed(12)
    checkpoint.save_checkpoint(tmp_path, 7, model, opt, {"policy_version": 4})
    expected_py, expected_torch = random.random(), torch.rand(3)

    fresh, _ = load_model(tiny_model_dir)
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=1e-3)
    ckpt = checkpoint.latest_checkpoint(tmp_path)
    assert ckpt is not None and ckpt.step == 7 and ckpt.state["policy_version"] == 4
    checkpoint.restore(ckpt, fresh, fresh_opt)
    for (k, a), b in zip(model.state_dict().items(), fresh.state_dict().values(), strict=True):
        assert torch.equal(a, b), k
    for a, b in zip(model.parameters(), fresh.parameters(), strict=True):
        pa, pb = opt.state[a], fresh_opt.state[b]
        assert torch.equal(pa["exp_avg"], pb["exp_avg"]) and torch.equal(pa["exp_avg_sq"], pb["exp_avg_sq"])
        assert float(pa["step"]) == float(pb["step"]) == 1.0
    assert random.random() == expected_py
    assert torch.equal(torch.rand(3), expected_torch)


def test_corrupt_and_partial_checkpoints_are_skipped(tiny_model_dir: Path, tmp_path: Path) -> None:
    model, opt = _trained_pair(tiny_model_dir)
    for step in (1, 2, 3):
        checkpoint.save_checkpoint(tmp_path, step, model, opt, {"policy_version": step}, keep=5)
    root = tmp_path / checkpoint.CHECKPOINT_DIR
    (root / "step-00000003" / checkpoint.MANIFEST).unlink()  # killed before the manifest: partial
    blob = root / "step-00000002" / "model.safetensors"
    data = bytearray(blob.read_bytes())
    data[-1] ^= 0xFF
    blob.write_bytes(bytes(data))  # bit rot
    warnings: list[str] = []
    ckpt = checkpoint.latest_checkpoint(tmp_path, warn=warnings.append)
    assert ckpt is not None and ckpt.step == 1
    assert warnings == ["warning: skipping checkpoint step-00000003: no manifest (partial write)",
                        "warning: skipping checkpoint step-00000002: model.safetensors does not match its sha256"]


def test_keeps_newest_k(tiny_model_dir: Path, tmp_path: Path) -> None:
    model, opt = _trained_pair(tiny_model_dir)
    for step in range(1, 6):
        checkpoint.save_checkpoint(tmp_path, step, model, opt, {"policy_version": step}, keep=2)
    names = sorted(p.name for p in (tmp_path / checkpoint.CHECKPOINT_DIR).iterdir())
    assert names == ["step-00000004", "step-00000005"]


def test_a_prune_killed_midway_leaves_no_half_deleted_step(tiny_model_dir: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    model, opt = _trained_pair(tiny_model_dir)
    for step in (1, 2):
        checkpoint.save_checkpoint(tmp_path, step, model, opt, {"policy_version": step}, keep=1)
    root = tmp_path / checkpoint.CHECKPOINT_DIR
    real_rmtree = checkpoint.shutil.rmtree

    def killed_after_the_manifest(path: Path, ignore_errors: bool = False) -> None:
        if Path(path).name.startswith(".old-step") and Path(path).exists():  # killed: manifest gone, weights stay
            (Path(path) / checkpoint.MANIFEST).unlink(missing_ok=True)
            raise SystemExit("killed")
        real_rmtree(path, ignore_errors=ignore_errors)

    monkeypatch.setattr(checkpoint.shutil, "rmtree", killed_after_the_manifest)
    with pytest.raises(SystemExit):
        checkpoint.save_checkpoint(tmp_path, 3, model, opt, {"policy_version": 3}, keep=1)
    assert sorted(p.name for p in root.iterdir()) == [".old-step-00000002", "step-00000003"]
    monkeypatch.setattr(checkpoint.shutil, "rmtree", real_rmtree)
    checkpoint.save_checkpoint(tmp_path, 4, model, opt, {"policy_version": 4}, keep=1)
    assert sorted(p.name for p in root.iterdir()) == ["step-00000004"]


def test_full_disk_loses_nothing(tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model, opt = _trained_pair(tiny_model_dir)
    checkpoint.save_checkpoint(tmp_path, 1, model, opt, {"policy_version": 1})

    def disk_full(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint, "save_file", disk_full)
    with pytest.raises(checkpoint.CheckpointError, match="step 2 not written \\(No space left on device\\)"):
        checkpoint.save_checkpoint(tmp_path, 2, model, opt, {"policy_version": 2})
    names = sorted(p.name for p in (tmp_path / checkpoint.CHECKPOINT_DIR).iterdir())
    assert names == ["step-00000001"]  # no temp dir left, the old checkpoint intact
    assert checkpoint.latest_checkpoint(tmp_path).step == 1
