"""bench.cell_archive: finished cells (result.json + metrics.csv) go to the archive and back; cells in progress and
node checkpoints never do; restore leaves a cell the run dir already holds alone."""

from __future__ import annotations

import gzip
from pathlib import Path

from bench.cell_archive import main


def _cell(root: Path, name: str, result: str | None) -> Path:
    cell = root / name
    (cell / "node0" / "checkpoints" / "step-10").mkdir(parents=True)
    (cell / "node0" / "checkpoints" / "step-10" / "model.safetensors").write_bytes(b"\0" * 64)
    (cell / "metrics.csv").write_text(f"round,node\n0,{name}\n")
    if result is None:
        (cell / "progress.json").write_text("{}")
    else:
        (cell / "result.json").write_text(result)
    return cell


def test_save_keeps_finished_cells_only_and_restore_does_not_overwrite(tmp_path: Path, capsys) -> None:
    runs, archive = tmp_path / "runs", tmp_path / "archive"
    _cell(runs, "8-0/seed0", '{"fingerprint": "a"}')
    _cell(runs, "4-4/seed1", '{"fingerprint": "b"}')
    _cell(runs, "2-6/seed0", None)
    main(["save", str(runs), str(archive)])
    assert capsys.readouterr().out.splitlines() == [f"save: 2 finished cells {runs} -> {archive}",
                                                    "  4-4/seed1", "  8-0/seed0"]
    assert sorted(str(p.relative_to(archive)) for p in archive.rglob("*") if p.is_file()) == [
        "4-4/seed1/metrics.csv.gz", "4-4/seed1/result.json.gz", "8-0/seed0/metrics.csv.gz",
        "8-0/seed0/result.json.gz"]
    assert gzip.decompress((archive / "8-0/seed0/metrics.csv.gz").read_bytes()) == b"round,node\n0,8-0/seed0\n"

    fresh = tmp_path / "fresh"
    _cell(fresh, "8-0/seed0", '{"fingerprint": "newer"}')
    main(["restore", str(archive), str(fresh)])
    assert capsys.readouterr().out.splitlines() == [f"restore: 1 finished cells {archive} -> {fresh}",
                                                    "  4-4/seed1"]
    assert (fresh / "8-0/seed0/result.json").read_text() == '{"fingerprint": "newer"}'
    assert (fresh / "4-4/seed1/result.json").read_text() == '{"fingerprint": "b"}'
    assert (fresh / "4-4/seed1/metrics.csv").read_text() == "round,node\n0,4-4/seed1\n"


def test_save_again_changes_no_archived_bytes_and_replaces_changed_ones(tmp_path: Path) -> None:
    runs, archive = tmp_path / "runs", tmp_path / "archive"
    _cell(runs, "8-0/seed0", '{"fingerprint": "a"}')
    main(["save", str(runs), str(archive)])
    kept = archive / "8-0/seed0/result.json.gz"
    first = kept.read_bytes()
    assert first[4:8] == b"\0\0\0\0"  # no modification time in the gzip header: the same cell, the same bytes
    kept.touch()
    main(["save", str(runs), str(archive)])
    assert kept.read_bytes() == first
    (runs / "8-0/seed0/result.json").write_text('{"fingerprint": "b"}')
    main(["save", str(runs), str(archive)])
    assert gzip.decompress(kept.read_bytes()) == b'{"fingerprint": "b"}'
