"""The README's plots and row for bench/rollout_methods.py (issue 31): the pure series functions on hand-made results,
the row's exact text, the PNGs plot_all writes, and the report leaving the row out until its result file exists."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench import rollout_methods_plot as rmp
from bench.report import HEADER, render_section
from bench.report_registry import ROWS

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
MEASURED = {"commit": "0123456789abcdef", "date": "2026-11-28T10:00:00Z", "dirty": False, "loaded": False}


def cell(mean: float | None, std: float | None, seeds: list[int]) -> dict[str, Any]:
    return {"heldout_acc_mean": mean, "heldout_acc_std": std, "per_seed": [], "seeds_done": seeds}


# lags out of order as strings ("16" < "4"), corrections out of canonical order, one entry without a mean
STALENESS = {
    "16": {"vcpo": cell(None, None, []), "tis": cell(0.5, 0.125, [0, 1, 2]), "none": cell(0.25, 0.0625, [0, 1, 2])},
    "4": {"tis": cell(0.625, 0.25, [0, 1])},
    "1": {"m2po": cell(0.75, 0.0, [0, 1, 2]), "none": cell(0.5, 0.125, [0, 1, 2])},
}
SELECTION = {
    "adaptive": {"signal_frac": 0.75, "gen_tokens": 1000.0, "cum_reward": 4.0, "heldout_acc": 0.75,
                 "heldout_ci95": [0.5, 0.875], "seeds_done": [0, 1, 2],
                 "heldout_vs_uniform_paired": {"diff": 0.25, "ci95": [-0.02, 0.5]}},
    "uniform": {"signal_frac": 0.5, "gen_tokens": 1000.0, "cum_reward": 3.0, "heldout_acc": 0.5,
                "heldout_ci95": [0.375, 0.625], "seeds_done": [0, 1, 2]},
    "adaptive_swarm": {"signal_frac": None, "gen_tokens": None, "cum_reward": None, "heldout_acc": None,
                       "heldout_ci95": None, "seeds_done": [], "heldout_vs_uniform_paired": None},
}
APRIL = {"throughput_ratio_vs_sync": 1.25, "throughput_ratio_long_tail": 1.5,
         "heldout_at_equal_wall_time": {"sync": 0.5, "april": 0.625, "paired_diff_ci95": [-0.02, 0.25]},
         "p95_over_median": {"base": 2.0, "long_tail": 2.25}, "arms": {}}
RESULT = {"staleness": STALENESS, "staleness_setup": {"complete": False}, "selection": SELECTION,
          "selection_setup": {"complete": True}, "april": APRIL, "provenance": MEASURED}


def test_staleness_series_sorts_lags_numerically_and_skips_entries_without_a_mean() -> None:
    series = rmp.staleness_series(STALENESS)
    assert list(series) == ["none", "tis", "m2po"]  # STALE_CORRECTIONS order; vcpo has no mean anywhere
    assert series == {"none": ([1, 16], [0.5, 0.25], [0.125, 0.0625]),
                      "tis": ([4, 16], [0.625, 0.5], [0.25, 0.125]),
                      "m2po": ([1], [0.75], [0.0])}


def test_the_staleness_title_says_the_seeds_done_only_when_they_differ() -> None:
    assert rmp.seeds_done_counts(STALENESS) == [2, 3]
    assert rmp.staleness_title(STALENESS) == ("Held-out accuracy against the lag S (mean ± std; seeds done per entry: "
                                              "2, 3)")
    even = {"1": {"none": cell(0.5, 0.1, [0, 1, 2])}}
    assert rmp.staleness_title(even) == "Held-out accuracy against the lag S (mean ± std over 3 seeds)"
    one = {"1": {"none": cell(0.5, 0.0, [0])}}
    assert rmp.staleness_title(one) == "Held-out accuracy against the lag S (mean ± std over 1 seed)"
    assert rmp.staleness_title({"1": {}}) == "Held-out accuracy against the lag S (no entry finished)"


def test_selection_series_orders_the_arms_and_gives_interval_lengths() -> None:
    assert rmp.selection_series(SELECTION) == rmp.SelectionSeries(
        arms=["uniform", "adaptive", "adaptive_swarm"], signal_frac=[0.5, 0.75, None], heldout=[0.5, 0.75, None],
        heldout_err=([0.125, 0.25, 0.0], [0.125, 0.125, 0.0]))


def test_april_series_reads_both_ratios_and_the_equal_wall_time_accuracies() -> None:
    assert rmp.april_series(APRIL) == rmp.AprilSeries(
        settings=["base", "long tail"], throughput_ratio=[1.25, 1.5], modes=["sync", "april"], heldout=[0.5, 0.625],
        paired_diff_ci95=[-0.02, 0.25])
    empty = rmp.april_series({"throughput_ratio_vs_sync": None})
    assert (empty.throughput_ratio, empty.heldout, empty.paired_diff_ci95) == ([None, None], [None, None], None)


def test_the_plot_constants_agree_with_the_bench() -> None:
    from bench import rollout_methods, rollout_selection
    from swarm_node import variants

    assert rmp.ARMS == rollout_selection.ARMS and rmp.PARTS == rollout_methods.PARTS
    assert rmp.STALE_CORRECTIONS == variants.STALE_CORRECTIONS


def test_plot_all_writes_one_png_per_part(tmp_path: Path) -> None:
    paths = rmp.plot_all(RESULT, tmp_path)
    assert paths == [tmp_path / f"rollout_methods_{p}.png" for p in ("staleness", "selection", "april")]
    assert all(p.read_bytes().startswith(PNG_MAGIC) for p in paths)


def test_a_result_with_one_part_draws_only_that_part(tmp_path: Path) -> None:
    assert rmp.plot_all({"april": APRIL, "april_setup": {}}, tmp_path) == [tmp_path / "rollout_methods_april.png"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rollout_methods_april.png"]
    assert (tmp_path / "rollout_methods_april.png").read_bytes().startswith(PNG_MAGIC)


def test_parts_without_figures_still_draw(tmp_path: Path) -> None:
    # a sweep just started: no staleness entry finished, a lag of 0, april's ratios not computable
    result = {"staleness": {"1": {}, "0": {"none": cell(0.5, 0.0, [0])}}, "april": {"throughput_ratio_vs_sync": None}}
    assert all(p.read_bytes().startswith(PNG_MAGIC) for p in rmp.plot_all(result, tmp_path))


ROW_TEXT = (
    "**staleness** (incomplete) S = 1: best m2po 0.750 ± 0.000 (3 seeds), none 0.500 ± 0.125 (3 seeds); S = 4: "
    "best tis 0.625 ± 0.250 (2 seeds); S = 16: best tis 0.500 ± 0.125 (3 seeds), none 0.250 ± 0.062 (3 seeds); "
    "**selection** uniform signal 0.500, held-out 0.500 [0.375, 0.625] (3 seeds); adaptive signal 0.750, held-out "
    "0.750 [0.500, 0.875], +25.0 [-2.0, +50.0] points vs uniform (3 seeds); adaptive_swarm signal -, held-out - "
    "(0 seeds); **april** throughput april / sync x1.25, long tail x1.50 (completion length p95 / median: base 2.0, "
    "long tail 2.2); held-out at equal wall time sync 0.500, april 0.625, april - sync [-2.0, +25.0] points")


def test_the_row_renders_each_part_present() -> None:
    render = ROWS["rollout_methods"].render
    assert render({"rollout_methods.json": RESULT}) == ROW_TEXT
    assert render({"rollout_methods.json": {"april": APRIL}}) == ROW_TEXT[ROW_TEXT.index("**april**"):]
    assert render({"rollout_methods.json": {"provenance": MEASURED}}) == "no part measured yet"


def test_the_row_is_left_out_until_its_result_file_exists(tmp_path: Path) -> None:
    rows = {"rollout_methods": ROWS["rollout_methods"]}
    assert render_section(tmp_path, rows) == HEADER
    (tmp_path / "rollout_methods.json").write_text(json.dumps(RESULT))
    assert render_section(tmp_path, rows) == (
        f"{HEADER}\n| `python -m bench.rollout_methods` | {ROWS['rollout_methods'].measures} | {ROW_TEXT} | "
        "`rollout_methods.json` `0123456` 2026-11-28 |")


def test_a_row_not_registered_until_measured_still_fails_without_its_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        render_section(tmp_path, {"gossip": ROWS["gossip"]})
