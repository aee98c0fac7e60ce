"""Finished cells of a simulation sweep, kept in the repository: a sweep that spans sessions on fresh machines
loses at most the cells in progress.

    python -m bench.cell_archive save RUN_DIR DEST       copy each finished cell's result.json and metrics.csv
    python -m bench.cell_archive restore DEST RUN_DIR    put them back (a cell the run dir holds is left alone)

A finished cell is a directory `<cell>/seed<k>` holding the runner's result.json (simulations/results.py); its
metrics.csv comes with it, since the sweep's summary reads both. Snapshots of cells in progress (node
checkpoints) are not copied: megabytes each, and a cell redone from round 0 costs less than a repository that
grows every session. The runner reuses a restored cell only under the same fingerprint (scenario, variant,
default model, code): restore into a worktree at the commit the cells ran on.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from simulations.results import METRICS_CSV, RESULT_FILE

KEPT = (RESULT_FILE, METRICS_CSV)


def finished_cells(root: Path) -> list[Path]:
    """Cell directories under `root` (relative to it) that hold a result.json, sorted."""
    return sorted(p.parent.relative_to(root) for p in root.rglob(RESULT_FILE))


def copy_cells(source: Path, dest: Path, overwrite: bool) -> list[Path]:
    """Copy each finished cell of `source` to the same place under `dest`; returns the cells copied."""
    copied = []
    for cell in finished_cells(source):
        target = dest / cell
        if (target / RESULT_FILE).exists() and not overwrite:
            continue
        target.mkdir(parents=True, exist_ok=True)
        for name in KEPT:
            if (source / cell / name).exists():
                shutil.copyfile(source / cell / name, target / name)
        copied.append(cell)
    return copied


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("action", choices=["save", "restore"])
    ap.add_argument("source", type=Path)
    ap.add_argument("dest", type=Path)
    args = ap.parse_args(argv)
    if not args.source.is_dir():
        raise SystemExit(f"{args.source} is not a directory")
    copied = copy_cells(args.source, args.dest, overwrite=args.action == "save")
    print(f"{args.action}: {len(copied)} finished cells {args.source} -> {args.dest}"
          + "".join(f"\n  {c}" for c in copied))


if __name__ == "__main__":
    main()
