"""bench/attack.py's reporting of a run in progress: --finished-only runs nothing and reports exactly the cells that
completed for this scenario; `complete` needs every part and every cell; --variants picks cells in the order named."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from bench.attack import SCENARIO, complete, run_cells, select
from simulations.attack_grid import FRACTIONS, grid
from simulations.cells import cell_dir
from simulations.results import RESULT_FILE, cell_fingerprint
from simulations.scenario import load_scenario


def test_finished_only_reports_the_completed_cells_of_this_scenario_and_runs_nothing(tmp_path: Path) -> None:
    scn = load_scenario(SCENARIO)
    cells = grid(scn, FRACTIONS, (0,))
    assert run_cells(cells, tmp_path, finished_only=True) == []
    assert list(tmp_path.iterdir()) == []  # nothing was started
    done, stale = cells[2], cells[3]
    for cell, fingerprint in ((done, cell_fingerprint(done.scenario, done.variant)), (stale, "another-scenario")):
        d = cell_dir(tmp_path, cell.variant.name, cell.seed)
        d.mkdir(parents=True)
        (d / RESULT_FILE).write_text(json.dumps({"variant": cell.variant.name, "seed": 0, "fingerprint": fingerprint}))
    assert run_cells(cells, tmp_path, finished_only=True) == [
        {"variant": done.variant.name, "seed": 0, "fingerprint": cell_fingerprint(done.scenario, done.variant)}]
    other = dataclasses.replace(scn, rounds=scn.rounds + 1)  # the same cell name, another scenario: not counted
    assert run_cells(grid(other, FRACTIONS, (0,)), tmp_path, finished_only=True) == []


def test_complete_needs_every_part_and_every_cell() -> None:
    whole = {"honest_eval_acc": {}, "junk_pair": {}, "max_rss_mib": {}, "kill_resume": {},
             "sim_cells_done": 21, "sim_cells": 21, "junk_cells_done": 9, "junk_cells": 9}
    assert complete(whole)
    assert not complete({**whole, "sim_cells_done": 20})
    assert not complete({**whole, "junk_cells_done": 8})
    for part in ("honest_eval_acc", "junk_pair", "max_rss_mib", "kill_resume"):
        assert not complete({k: v for k, v in whole.items() if k != part})


def test_select_keeps_the_named_variants_in_the_order_named() -> None:
    cells = grid(load_scenario(SCENARIO), FRACTIONS, (3, 4))
    picked = select(cells, ["f0.5", "solo"])
    assert [(c.variant.name, c.seed) for c in picked] == [("f0.5", 3), ("f0.5", 4), ("solo", 3), ("solo", 4)]
    assert select(cells, None) == cells
