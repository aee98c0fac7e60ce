"""The README's swarm-scale plot (bench/swarm_scale_plot.py, `python -m bench.swarm_scale --plot-only`)."""

from __future__ import annotations

import json
from pathlib import Path

from bench import swarm_scale
from bench.swarm_scale_plot import inbound_series, p99_target_kb, plot_inbound

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def figures(median: float | None, p99: float | None) -> dict[str, float | None]:
    return {"inbound_msgs_per_round": 1.0, "inbound_kb_per_round": median, "inbound_kb_per_round_p99": p99}


RESULT = {"designs": {
    "flood": {"100": figures(11449.7, 12321.8), "10": figures(1251.0, 1251.0), "1000": figures(111989.8, 111989.8)},
    "bounded": {"1000": figures(141.7, 157.4), "10": figures(88.2, None), "100": figures(138.9, 153.0)}},
    "setup": {"needed": 4, "group_kb": 5.0}}


def test_each_design_is_one_series_in_increasing_n() -> None:
    assert inbound_series(RESULT) == {
        "flood": ([10, 100, 1000], [1251.0, 11449.7, 111989.8], [1251.0, 12321.8, 111989.8]),
        "bounded": ([10, 100, 1000], [88.2, 138.9, 141.7], [None, 153.0, 157.4]),
    }


def test_the_p99_bound_is_ten_times_the_bytes_of_j_groups() -> None:
    assert p99_target_kb(RESULT) == 200.0
    assert p99_target_kb({"designs": {}}) is None


def test_plot_only_draws_the_png_from_the_result_file_without_simulating(tmp_path: Path) -> None:
    out, png = tmp_path / "swarm_scale.json", tmp_path / "inbound.png"
    out.write_text(json.dumps(RESULT))
    swarm_scale.main(["--plot-only", "--out", str(out), "--plot", str(png)])
    assert png.read_bytes().startswith(PNG_MAGIC)
    assert json.loads(out.read_text()) == RESULT  # the result is read, not rewritten


def test_a_missing_figure_leaves_a_gap_rather_than_failing(tmp_path: Path) -> None:
    plot_inbound(RESULT, tmp_path / "gap.png")
    assert (tmp_path / "gap.png").read_bytes().startswith(PNG_MAGIC)
