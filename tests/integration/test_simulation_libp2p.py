"""`[simulation] transport = "libp2p"`: simulated nodes over real libp2p hosts on 127.0.0.1, in lockstep rounds."""

from __future__ import annotations

import csv
import json
import urllib.request
from pathlib import Path

import pytest

from simulations.runner import run_cell
from simulations.scenario import parse_scenario
from swarm_node.identity import IDENTITY_FILENAME, load
from tests.unit.test_simulation import TINY, free_port_pair

pytestmark = [pytest.mark.libp2p, pytest.mark.timeout(120)]


def test_two_libp2p_nodes_receive_each_others_groups_every_round(tiny_model_dir: Path, tmp_path: Path) -> None:
    port = free_port_pair()
    scn = parse_scenario({"simulation": {"nodes": 2, "rounds": 2, "eval_problems": 0, "seeds": [0],
                                         "transport": "libp2p", "status_port": port},
                          "network": {"round_s": 30.0}, "config": TINY,
                          "variants": [{"name": "p2p", "config": {"share": {"local_groups": 2, "external_groups": 2}}}],
                          "node": [{"index": i, "model": str(tiny_model_dir)} for i in range(2)]}, "p2p")
    status: dict[int, dict] = {}

    def on_round(_v: str, _s: int, rnd: int, _total: int, _reward: float | None) -> None:
        if rnd == 2:  # once, at the end: the server caches a snapshot for 0.5 s
            for i in (0, 1):
                with urllib.request.urlopen(f"http://127.0.0.1:{port + i}/status", timeout=10) as resp:
                    status[i] = json.load(resp)

    logs: list[str] = []
    result = run_cell(scn, scn.variants[0], 0, tmp_path, on_round, logs.append)
    cell = tmp_path / "p2p" / "seed0"
    rows = list(csv.DictReader(open(cell / "metrics.csv")))
    assert [(r["node"], r["round"], r["received"]) for r in rows] == [
        ("0", "1", "2"), ("1", "1", "2"), ("0", "2", "2"), ("1", "2", "2")]  # the other's 2 groups, every round
    assert json.loads((cell / "result.json").read_text()) == result
    assert result["nodes"] == 2
    assert set(result["external_drops"]) <= {"zero_advantage"}  # nothing refused by validation (e.g. attribution)
    peer_ids = [load(cell / f"node{i}" / IDENTITY_FILENAME).peer_id for i in (0, 1)]
    assert peer_ids[0] != peer_ids[1] and all(p.startswith("12D3KooW") for p in peer_ids)
    assert [(status[i]["peer_id"], status[i]["step"], status[i]["groups"]["received"]) for i in (0, 1)] == [
        (peer_ids[0], 2, 4), (peer_ids[1], 2, 4)]
    assert logs == [f"status node{i}: http://127.0.0.1:{port + i}/" for i in (0, 1)]  # no round ran out of time
