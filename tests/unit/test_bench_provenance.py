"""Benchmark provenance: the sources fingerprint follows the imported modules' code, the load guard refuses a busy
machine unless --loaded (and records it), paired ratios are medians of per-run ratios, and a simulation cell's
identity includes the code version."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest

import simulations.results
from bench import provenance
from bench.load_guard import add_loaded_flag, refuse_if_loaded, wait_to_settle
from bench.memory import read_samples
from bench.paired import paired_ratio, per_run_ratios
from simulations.code_version import files_fingerprint
from simulations.results import cell_fingerprint
from simulations.scenario import parse_scenario


def toy_package(root: Path, name: str, body: str) -> Path:
    pkg = root / name
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "measured.py").write_text(body)
    return pkg / "measured.py"


@pytest.fixture
def toy_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [m for m in sys.modules if m.startswith("toy_bench_pkg")]:
        del sys.modules[name]


def test_imported_sources_are_the_modules_loaded_from_the_root(toy_root: Path) -> None:
    toy_package(toy_root, "toy_bench_pkg", "RATE = 1\n")
    (toy_root / "toy_bench_pkg" / "never_imported.py").write_text("X = 0\n")
    import toy_bench_pkg.measured  # noqa: F401

    assert provenance.imported_sources(toy_root) == ["toy_bench_pkg/__init__.py", "toy_bench_pkg/measured.py"]


def test_fingerprint_changes_when_an_imported_module_changes(toy_root: Path) -> None:
    module = toy_package(toy_root, "toy_bench_pkg", "RATE = 1\n")
    (toy_root / "constraints.txt").write_text("torch==2.13.0\n")
    sources = ["toy_bench_pkg/__init__.py", "toy_bench_pkg/measured.py"]
    before = provenance.sources_fingerprint(toy_root, sources, "recipe-a")
    assert provenance.sources_fingerprint(toy_root, sources, "recipe-a") == before  # deterministic
    module.write_text("RATE = 2\n")
    after = provenance.sources_fingerprint(toy_root, sources, "recipe-a")
    assert after != before
    assert provenance.sources_fingerprint(toy_root, sources, "recipe-b") != after  # the default model's recipe
    (toy_root / "constraints.txt").write_text("torch==2.14.0\n")
    assert provenance.sources_fingerprint(toy_root, sources, "recipe-a") != after  # the pinned packages
    (toy_root / "toy_bench_pkg" / "unrelated.py").write_text("Y = 1\n")  # a module it did not import: no change
    assert provenance.sources_fingerprint(toy_root, sources, "recipe-a") == provenance.sources_fingerprint(
        toy_root, sources, "recipe-a")


def test_files_fingerprint_names_a_missing_file_and_ignores_order(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("A = 1\n")
    assert files_fingerprint(tmp_path, ["a.py", "b.py"]) == files_fingerprint(tmp_path, ["b.py", "a.py", "a.py"])
    with_b = files_fingerprint(tmp_path, ["a.py", "b.py"])
    (tmp_path / "b.py").write_text("")
    assert files_fingerprint(tmp_path, ["a.py", "b.py"]) != with_b


def test_load_guard_refuses_at_load_0_9_and_runs_with_loaded(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as refused:
        provenance.begin(timed=True, loaded=False, load_avg=lambda: (0.9, 0.5, 0.4))
    assert refused.value.code == 2
    assert "load average is 0.90 (above 0.5)" in capsys.readouterr().err
    run = provenance.begin(timed=True, loaded=True, load_avg=lambda: (0.9, 0.5, 0.4))
    assert (run.loaded, run.load_avg_start) == (True, 0.9)
    idle = provenance.begin(timed=True, loaded=False, load_avg=lambda: (0.4, 0.5, 0.4))
    assert (idle.loaded, idle.load_avg_start) == (False, 0.4)
    untimed = provenance.begin(timed=False, loaded=False, load_avg=lambda: (3.0, 3.0, 3.0))  # RSS, rewards: no guard
    assert untimed.load_avg_start == 3.0
    refuse_if_loaded(0.5, loaded=False)  # at the threshold: runs


def test_wait_to_settle_polls_until_the_load_falls_or_the_timeout() -> None:
    readings, slept = iter([2.0, 1.2, 0.6, 0.4, 0.1]), []
    assert wait_to_settle(timeout_s=300, poll_s=10, load_avg=lambda: (next(readings), 0.0, 0.0),
                          sleep=slept.append) == 0.4
    assert slept == [10, 10, 10]
    slept.clear()  # a machine that stays loaded: gives up after the timeout and returns the load the guard refuses
    assert wait_to_settle(timeout_s=25, poll_s=10, load_avg=lambda: (2.0, 0.0, 0.0), sleep=slept.append) == 2.0
    assert slept == [10, 10, 10]
    assert wait_to_settle(load_avg=lambda: (0.3, 0.0, 0.0), sleep=slept.append) == 0.3  # idle: no wait
    assert slept == [10, 10, 10]


def test_loaded_flag_parses_and_the_result_records_it() -> None:
    parser = argparse.ArgumentParser()
    add_loaded_flag(parser)
    assert parser.parse_args([]).loaded is False
    args = parser.parse_args(["--loaded"])
    run = provenance.begin(timed=True, loaded=args.loaded, load_avg=lambda: (0.9, 0.0, 0.0))
    stamped = provenance.stamp({"tok_s": 10.0, "provenance": {"old": True}}, run, runs=3)
    prov = stamped["provenance"]
    assert stamped["tok_s"] == 10.0
    assert (prov["loaded"], prov["runs"], prov["machine"]["load_avg_start"]) == (True, 3, 0.9)
    assert set(prov) >= {"commit", "dirty", "sources_fingerprint", "sources", "default_model_recipe", "command",
                         "date", "machine"}
    assert set(prov["machine"]) == {"cores", "mem_gib", "load_avg_start", "load_avg_end"}
    assert "bench/provenance.py" in prov["sources"]
    assert prov["sources_fingerprint"] == provenance.sources_fingerprint(provenance.REPO, prov["sources"],
                                                                         prov["default_model_recipe"])


def test_jsonl_provenance_is_a_first_line_that_readers_skip(tmp_path: Path) -> None:
    run = provenance.begin(load_avg=lambda: (0.1, 0.1, 0.1))
    samples = [{"t": 0.0, "rss_mib": 500.0}, {"t": 30.0, "rss_mib": 510.0}]
    lines = provenance.stamp_lines([{"provenance": {"old": True}}, *samples], run, runs=1)
    assert lines[1:] == samples and lines[0]["provenance"]["runs"] == 1
    path = tmp_path / "soak.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert read_samples(path) == samples


def test_paired_ratio_is_the_median_of_per_run_ratios() -> None:
    ours, raw = [100.0, 40.0, 90.0], [100.0, 80.0, 100.0]
    assert per_run_ratios(ours, raw) == [1.0, 0.5, 0.9]
    assert paired_ratio(ours, raw) == 0.9
    assert paired_ratio([97.0, 30.0], [100.0, 60.0]) == pytest.approx(0.735)  # not 63.5 / 80, the ratio of medians
    with pytest.raises(ValueError):
        per_run_ratios([1.0], [1.0, 2.0])


def test_a_cell_fingerprint_includes_the_code_version(monkeypatch: pytest.MonkeyPatch) -> None:
    scn = parse_scenario({"simulation": {"nodes": 2, "rounds": 1}})
    here = cell_fingerprint(scn, scn.variants[0])
    monkeypatch.setattr(simulations.results, "code_version", lambda: "other-code")
    assert cell_fingerprint(scn, scn.variants[0]) != here


def test_a_changed_result_alone_leaves_a_checkout_clean_whatever_its_status_columns(tmp_path: Path) -> None:
    # " M path" (changed in the work tree only) starts with a space: the path must still be read from column 3
    import subprocess

    from bench.provenance import dirty

    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    git("init", "-q")
    git("config", "user.email", "t@t"), git("config", "user.name", "t")
    (tmp_path / "bench" / "results").mkdir(parents=True)
    (tmp_path / "bench" / "results" / "r.json").write_text("{}")
    (tmp_path / "code.py").write_text("x = 1\n")
    git("add", "-A"), git("commit", "-qm", "c")
    assert dirty(tmp_path) is False
    (tmp_path / "bench" / "results" / "r.json").write_text('{"a": 1}')
    assert dirty(tmp_path) is False  # " M bench/results/r.json"
    (tmp_path / "code.py").write_text("x = 2\n")
    assert dirty(tmp_path) is True
