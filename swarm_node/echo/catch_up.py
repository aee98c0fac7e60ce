"""A worker's catch-up choice, as a pure function: which of the learner's held updates to fetch next.

Contract: `plan_catch_up(held, version, state_sha256, refused)` looks at what the learner holds (its announces:
version, base_version, state_sha256) and at the policy we follow (our version, the hash of our state) and says
- `reset`: the learner restarted its lineage (everything it holds is older than ours, or it holds a snapshot at our
  version with another state): forget ours and follow it from a snapshot (our version is then -1, no state);
- `fetch`: the (version, base_version) to fetch: the delta from our version if held, else the newest snapshot
  newer than ours, else None (nothing newer: we are caught up). Updates in `refused` ((version, base_version) we
  refused before, e.g. over `echo.max_delta_norm`: fetching them again would not change them) are never picked,
  so a refused delta does not hold the worker: it waits for the next snapshot it may apply.
The caller fetches, applies and asks again until `fetch` is None. No I/O, no clock.
`stranded(held, version)` is the learner's side of the same rule: a follower at `version` for which catch-up finds
nothing although newer versions are held (the deltas from its version were evicted past `echo.keep_versions`, and no
snapshot newer than it is held). Only a new snapshot frees it, e.g. a worker restarted at version 0 (it keeps no
policy on disk) after the learner published more than `keep_versions` updates since its last snapshot.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Protocol


class Held(Protocol):
    """What an announce says about one held update (`protocol.messages.PolicyAnnounce` is one)."""

    @property
    def version(self) -> int: ...

    @property
    def base_version(self) -> int: ...

    @property
    def state_sha256(self) -> str: ...


@dataclass(frozen=True)
class CatchUp:
    reset: bool
    fetch: tuple[int, int] | None  # (version, base_version)


def lineage_restarted(held: Sequence[Held], version: int, state_sha256: str) -> bool:
    if not held:
        return False
    return max(a.version for a in held) < version or any(
        a.version == a.base_version == version and a.state_sha256 != state_sha256 for a in held)


def plan_catch_up(held: Sequence[Held], version: int, state_sha256: str,
                  refused: Collection[tuple[int, int]] = ()) -> CatchUp:
    reset = lineage_restarted(held, version, state_sha256)
    if reset:
        version = -1  # a reset follower holds no state: only a snapshot applies
    pick = next_update([a for a in held if (a.version, a.base_version) not in refused], version)
    return CatchUp(reset, (pick.version, pick.base_version) if pick is not None else None)


def next_update(held: Sequence[Held], version: int) -> Held | None:
    """The delta from `version` if held, else the newest snapshot newer than it, else None."""
    delta = next((a for a in held if a.base_version == version < a.version), None)
    snaps = [a for a in held if a.base_version == a.version > version]
    return delta or (max(snaps, key=lambda a: a.version) if snaps else None)


def stranded(held: Sequence[Held], version: int) -> bool:
    return any(a.version > version for a in held) and next_update(held, version) is None
