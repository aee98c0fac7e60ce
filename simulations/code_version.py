"""Fingerprints of source files: what a measurement or a simulation cell ran on.

`files_fingerprint(root, paths, extra)` hashes the named files (repository-relative, sorted, a missing one named
as missing) and extra strings; `code_version()` is that over every module of swarm_node/, protocol/ and
simulations/ plus constraints.txt, computed once per process: a cell's identity includes it, so cells run on
different code are never pooled (long sweeps run from a git worktree pinned at one commit, bench/README.md).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CODE_PACKAGES = ("swarm_node", "protocol", "simulations")
CONSTRAINTS = "constraints.txt"


def files_fingerprint(root: Path, paths: Iterable[str], extra: Iterable[str] = ()) -> str:
    """sha256 over each file's path and content hash, then the extra strings, in a fixed order."""
    digest = hashlib.sha256()
    for rel in sorted(set(paths)):
        path = root / rel
        content = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "missing"
        digest.update(f"{rel}\0{content}\n".encode())
    for item in extra:
        digest.update(f"extra\0{item}\n".encode())
    return digest.hexdigest()


def package_sources(root: Path, packages: Iterable[str] = CODE_PACKAGES) -> list[str]:
    """Every .py file of the packages, repository-relative."""
    return sorted(str(p.relative_to(root)) for pkg in packages for p in (root / pkg).rglob("*.py"))


@functools.lru_cache(maxsize=1)
def code_version() -> str:
    """The code a simulation cell runs on (16 hex digits)."""
    return files_fingerprint(REPO, [*package_sources(REPO), CONSTRAINTS])[:16]
