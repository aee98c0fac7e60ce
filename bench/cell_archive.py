"""Finished cells of a simulation sweep, kept in the repository: a sweep that spans sessions on fresh machines
loses at most the cells in progress.

    python -m bench.cell_archive save RUN_DIR ARCHIVE     each finished cell's result.json and metrics.csv, gzipped
    python -m bench.cell_archive restore ARCHIVE RUN_DIR  put them back (a cell the run dir holds is left alone)

A finished cell is a directory `<cell>/seed<k>` holding the runner's result.json (simulations/results.py); its
metrics.csv comes with it, since the sweep's summary reads both. The archive keeps them gzipped (a result.json
holds every node's per-question outcomes by question text: 1.5 MB, 0.1 MB gzipped). Snapshots of cells in progress (node
checkpoints) are not copied: megabytes each, and a cell redone from round 0 costs less than a repository that
grows every session. The runner reuses a restored cell only under the same fingerprint (scenario, variant,
default model, code): restore into a worktree at the commit the cells ran on.
"""

from __future__ import annotations

import argparse
import gzip
from pathlib import Path

from simulations.results import METRICS_CSV, RESULT_FILE

KEPT = (RESULT_FILE, METRICS_CSV)
GZ = ".gz"


def finished_cells(root: Path, result_name: str = RESULT_FILE) -> list[Path]:
    """Cell directories under `root` (relative to it) that hold a `result_name`, sorted."""
    return sorted(p.parent.relative_to(root) for p in root.rglob(result_name))


def save(runs: Path, archive: Path) -> list[Path]:
    """Each finished cell of `runs` gzipped to the same place under `archive` (replacing what was there). A file
    whose archived copy holds the same bytes is left as it is, and the gzip carries no time or name, so archiving
    again changes nothing that git would commit."""
    for cell in (cells := finished_cells(runs)):
        (archive / cell).mkdir(parents=True, exist_ok=True)
        for name in KEPT:
            if not (source := runs / cell / name).exists():
                continue
            data, kept = source.read_bytes(), archive / cell / (name + GZ)
            if kept.exists() and gzip.decompress(kept.read_bytes()) == data:
                continue
            kept.write_bytes(gzip.compress(data, mtime=0))
    return cells


def restore(archive: Path, runs: Path) -> list[Path]:
    """Each archived cell that `runs` does not hold finished, unzipped into it; returns the cells restored."""
    restored = []
    for cell in finished_cells(archive, RESULT_FILE + GZ):
        if (runs / cell / RESULT_FILE).exists():
            continue
        (runs / cell).mkdir(parents=True, exist_ok=True)
        for name in reversed(KEPT):  # result.json last: a cell is finished once it is there
            if (kept := archive / cell / (name + GZ)).exists():
                (runs / cell / name).write_bytes(gzip.decompress(kept.read_bytes()))
        restored.append(cell)
    return restored


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("action", choices=["save", "restore"])
    ap.add_argument("source", type=Path)
    ap.add_argument("dest", type=Path)
    args = ap.parse_args(argv)
    if not args.source.is_dir():
        raise SystemExit(f"{args.source} is not a directory")
    copied = (save if args.action == "save" else restore)(args.source, args.dest)
    print(f"{args.action}: {len(copied)} finished cells {args.source} -> {args.dest}"
          + "".join(f"\n  {c}" for c in copied))


if __name__ == "__main__":
    main()
