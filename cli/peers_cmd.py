"""`swarm-node peers ...`: the bans a node keeps in RUN_DIR/peers.json (sharing/reputation.py), seen and lifted.

Contract: `peers list --run-dir DIR` prints the unexpired bans; `peers unban PEER_ID --run-dir DIR` removes one
ban from the file (atomically) and tells how a running node picks it up: it re-reads the file whenever it changed
on disk, at its next ingest (each training step; a learner every ~50 ms), lifts the ban and starts the peer again at
score 0. A node that is not running loads the file at its next start. A peer the node merely graylists (no ban) is
not in the file: its score recovers as it decays (`[peers] half_life_s`), or put it on `[peers] allow`. Problems
the user can fix (no such ban, a malformed file) are one-line `UserError`s.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from cli.common import user_errors
from swarm_node.errors import UserError
from swarm_node.sharing.reputation import PEERS_FILE, read_bans, write_bans

peers_app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                        help="Banned peers of a node (RUN_DIR/peers.json): list, unban.")

RunDirArg = Annotated[Path, typer.Option("--run-dir", help="the node's run dir (holds peers.json)")]


def _bans(run_dir: Path, now: float) -> dict[str, float]:
    path = run_dir / PEERS_FILE
    try:
        return read_bans(path, now)
    except ValueError as exc:
        raise UserError(str(exc)) from exc


def unban(run_dir: Path, peer_id: str, now: float) -> None:
    """Remove `peer_id`'s ban from RUN_DIR/peers.json (UserError if it is not banned there)."""
    bans = _bans(run_dir, now)
    if peer_id not in bans:
        raise UserError(f"peer {peer_id} is not banned in {run_dir / PEERS_FILE}")
    del bans[peer_id]
    write_bans(run_dir / PEERS_FILE, bans)


@peers_app.command("list")
def list_bans(run_dir: RunDirArg) -> None:
    """Print the banned peers and how long each ban still runs."""
    with user_errors():
        now = time.time()
        bans = _bans(run_dir, now)
        if not bans:
            typer.echo(f"no banned peers in {run_dir / PEERS_FILE}")
        for peer, until in sorted(bans.items(), key=lambda item: item[1]):
            typer.echo(f"{peer}  banned for {until - now:.0f} s more")


@peers_app.command("unban")
def unban_cmd(peer_id: Annotated[str, typer.Argument(help="the peer id to unban")], run_dir: RunDirArg) -> None:
    """Lift a peer's ban: a running node picks it up at its next ingest, a stopped one at its next start."""
    with user_errors():
        unban(run_dir, peer_id, time.time())
        typer.echo(f"unbanned {peer_id}: a running node lifts the ban at its next ingest (it re-reads "
                   f"{run_dir / PEERS_FILE}); the peer starts again at score 0")
