"""bench.fanin_real over real libp2p, small: 3 stand-in processes x 2 rounds on loopback, compared with the simulator.

Every stand-in records both rounds (the second measured), reads gossipsub RPCs and bytes from its connections,
and is gone when the bench returns.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import pytest

from bench.fanin_real import bench

pytestmark = [pytest.mark.libp2p, pytest.mark.timeout(240)]


def test_three_stand_ins_two_rounds_against_the_simulator(tmp_path: Path) -> None:
    args = argparse.Namespace(nodes=3, round_s=4.0, publish_spread_s=2.0, warmup=1, rounds=1, connect=2,
                              settle_s=4.0, sim_seeds=1, seed=0, logs=tmp_path, from_rounds=None)
    result = bench(args)
    saved = json.loads((tmp_path / "rounds.json").read_text())
    assert [len(rounds) for rounds in saved["rounds"]] == [2, 2, 2]
    assert all(r["round"] == i for rounds in saved["rounds"] for i, r in enumerate(rounds))
    assert result["real"]["rpcs_per_round"] > 0 and result["real"]["inbound_kb_per_round"] > 0
    assert result["inbound_msgs_ratio"] > 0 and result["inbound_kb_ratio"] > 0
    assert result["setup"]["nodes"] == 3 and result["rss_mb_total"] > 0
    assert sorted(log.name for log in tmp_path.glob("standin-*.log")) == [f"standin-{i}.log" for i in range(3)]
    # The children are ended: no process of ours still runs bench.fanin_standin.
    running = []
    for proc in (p for p in Path("/proc").iterdir() if p.name.isdigit()):
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ")
            parent = int((proc / "stat").read_text().split(") ")[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if b"bench.fanin_standin" in cmdline and parent == os.getpid():
            running.append(proc.name)
    assert running == []
