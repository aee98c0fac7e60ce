"""bench.report: the README's results section is generated from the result files (a fixture renders to an exact
row, the real README is up to date, a drifted number fails --check) and --stale lists results whose measured
sources changed, except the historical ones."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from bench import provenance
from bench.report import END, HEADER, RESULTS, START, Stale, main, render_section, splice, stale
from bench.report_rows import ROWS

REPO = Path(__file__).resolve().parents[2]
GOSSIP = {"nodes": 4, "groups": 1200, "delivered_frac": 1.0, "groups_per_s": 237.7, "p50_ms": 16.2, "p99_ms": 52.8,
          "stream_mb_s": 112.0}
MEASURED = {"commit": "0123456789abcdef", "date": "2026-11-26T10:00:00Z", "dirty": False, "loaded": False,
            "command": "python -m bench.measured"}
BACKFILLED = {"backfilled": True, "commit": "aaaaaaa111", "numbers_commit": "bbbbbbb222",
              "numbers_date": "2026-11-22T04:37:09+00:00", "date": None}
GOSSIP_ROW = ("| `python -m bench.gossip` | 4 libp2p processes on loopback: groups/s delivered to every peer, latency, "
              "stream MB/s | delivered 1.000 at 238 groups/s; p50 16 ms, p99 53 ms at 100 groups/s; stream 112 MB/s "
              "| `gossip.json` `0123456` 2026-11-26 |")


def write(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


def test_a_fixture_result_renders_into_its_row(tmp_path: Path) -> None:
    write(tmp_path / "gossip.json", {**GOSSIP, "provenance": MEASURED})
    assert render_section(tmp_path, {"gossip": ROWS["gossip"]}) == f"{HEADER}\n{GOSSIP_ROW}"


STEP_RATE = {"ratio_now_over_then": {"solo": 0.629, "join": 0.683},
             "steps_per_min_median": {"solo": {"old": 37.8, "now": 23.8}, "join": {"old": 27.5, "now": 18.8}},
             "factors": {"task_mix": {"solo": 1.13, "join": 1.367}, "validation_budgets": {"join": 0.28}}}


def test_the_step_rate_row_gives_both_modes_and_every_factor(tmp_path: Path) -> None:
    write(tmp_path / "step_rate.json", {**STEP_RATE, "provenance": MEASURED})
    cell = render_section(tmp_path, {"step_rate": ROWS["step_rate"]}).splitlines()[-1].split(" | ")[2]
    assert cell == ("solo 37.8 -> 23.8 steps/min (now/old 0.63); join 27.5 -> 18.8 steps/min (now/old 0.68); "
                    "each factor's arm over today's (mmap_threshold: fixed at 1 MiB from the start, as nodes did "
                    "before 2026-11-26; prompts_per_step: 16 prompts a step, the old default, against today's 32): "
                    "task_mix solo 1.13 / join 1.37, "
                    "validation_budgets join 0.28")


def test_a_historical_result_is_marked_and_named_by_the_commit_of_its_numbers(tmp_path: Path) -> None:
    write(tmp_path / "gossip.json", {**GOSSIP, "provenance": BACKFILLED})
    (tmp_path / "HISTORICAL.toml").write_text('[[result]]\nresult = "gossip.json"\nreason = "old"\ncommit = "aaa"\n')
    row = render_section(tmp_path, {"gossip": ROWS["gossip"]}).splitlines()[-1]
    assert row.endswith("| `gossip.json` `bbbbbbb` 2026-11-22, historical |")
    write(tmp_path / "gossip.json", {**GOSSIP, "provenance": {**MEASURED, "dirty": True, "loaded": True}})
    assert render_section(tmp_path, {"gossip": ROWS["gossip"]}).endswith(
        "| `gossip.json` `0123456` 2026-11-26, uncommitted changes, loaded machine, historical |")


def test_every_registered_row_renders_from_the_committed_results() -> None:
    section = render_section()
    # a row registered until_measured is left out while its result file does not exist yet
    shown = [r for r in ROWS.values() if not r.until_measured or all((RESULTS / f).exists() for f in r.files)]
    assert len(section.splitlines()) == 2 + len(shown)
    assert "`nat.json`" in section and "43 groups exchanged" in section  # the file's figure, not an older README's


def test_the_readme_section_is_what_the_generator_produces() -> None:
    assert main(["--check"]) == 0


def test_check_fails_on_a_drifted_number(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    results = tmp_path / "results"
    write(results / "gossip.json", {**GOSSIP, "provenance": MEASURED})
    readme = tmp_path / "README.md"
    readme.write_text(f"# title\n\nintro\n\n{START}\n{END}\n\nafter\n")
    rows = dict(ROWS)
    ROWS.clear()
    ROWS["gossip"] = rows["gossip"]
    try:
        assert main(["--readme", str(readme), "--results", str(results)]) == 0
        assert readme.read_text() == f"# title\n\nintro\n\n{START}\n{HEADER}\n{GOSSIP_ROW}\n{END}\n\nafter\n"
        assert main(["--check", "--readme", str(readme), "--results", str(results)]) == 0
        readme.write_text(readme.read_text().replace("238 groups/s", "160 groups/s"))
        assert main(["--check", "--readme", str(readme), "--results", str(results)]) == 1
        assert "differs from bench/results/" in capsys.readouterr().err
        readme.write_text("# no markers\n")
        assert main(["--check", "--readme", str(readme), "--results", str(results)]) == 2
    finally:
        ROWS.clear()
        ROWS.update(rows)


def test_splice_keeps_what_is_outside_the_markers() -> None:
    assert splice(f"a\n{START}\nold\n{END}\nb", "new") == f"a\n{START}\nnew\n{END}\nb"
    with pytest.raises(ValueError):
        splice("no markers", "new")


def measured_result(root: Path, results: Path, name: str, recipe: str) -> None:
    sources = ["pkg/measured.py"]
    prov = {**MEASURED, "sources": sources, "default_model_recipe": recipe,
            "sources_fingerprint": provenance.sources_fingerprint(root, sources, recipe)}
    write(results / name, {"rate": 1.0, "provenance": prov})


def test_stale_lists_results_whose_measured_sources_changed(tmp_path: Path) -> None:
    root, results = tmp_path / "repo", tmp_path / "repo" / "bench" / "results"
    module = root / "pkg" / "measured.py"
    module.parent.mkdir(parents=True)
    module.write_text("RATE = 1\n")
    (root / "pkg" / "other.py").write_text("X = 1\n")
    measured_result(root, results, "fresh.json", "r1")
    measured_result(root, results, "old.json", "r1")
    (results / "HISTORICAL.toml").write_text('[[result]]\nresult = "old.json"\nreason = "backfilled"\ncommit = "a"\n')
    write(results / "spot_check" / "bare.json", {"rate": 2.0})
    bare = Stale("spot_check/bare.json", "no provenance with a sources fingerprint")  # nothing to say how measured
    assert stale(results, root, recipe="r1") == [bare]

    (root / "pkg" / "other.py").write_text("X = 2\n")  # not measured by either result
    assert [entry.result for entry in stale(results, root, recipe="r1")] == ["spot_check/bare.json"]
    module.write_text("RATE = 2\n")
    assert stale(results, root, recipe="r1") == [
        Stale("fresh.json", "its measured sources changed since 0123456 (2026-11-26)", MEASURED["command"]),
        bare]  # old.json is historical
    module.write_text("RATE = 1\n")
    assert stale(results, root, recipe="r2")[0] == Stale(
        "fresh.json", "the default model's recipe changed since 0123456 (2026-11-26)", MEASURED["command"])


def test_stale_names_the_measuring_command_and_prints_nothing_when_all_are_current(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--stale", "--results", str(tmp_path)]) == 0
    assert capsys.readouterr().out == ""
    prov = {**MEASURED, "sources": ["bench/report.py"], "sources_fingerprint": "0" * 64, "command": "python -m x"}
    write(tmp_path / "old.json", {"rate": 1.0, "provenance": prov})
    assert main(["--stale", "--results", str(tmp_path)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("stale: old.json: ") and out[0].endswith("; measured by: python -m x")
    assert out[1] == "1 stale result(s); historical ones (HISTORICAL.toml) not listed"


def test_stale_runs_on_the_repository() -> None:
    assert main(["--stale"]) in (0, 1)


def test_every_committed_result_has_a_provenance_or_is_historical() -> None:
    from bench.report import RESULTS, historical, load_result

    old = historical(RESULTS)
    for path in sorted([*RESULTS.rglob("*.json"), *RESULTS.rglob("*.jsonl")]):
        name = str(path.relative_to(RESULTS))
        prov = load_result(path).get("provenance")
        assert prov is not None, name
        assert set(prov) >= {"commit", "dirty", "sources_fingerprint", "command", "date", "machine"}, name
        if prov.get("backfilled"):
            assert name in old, f"{name}: backfilled but not in HISTORICAL.toml"


def test_stale_lists_a_part_measured_at_a_commit_whose_sources_changed_since(tmp_path: Path) -> None:
    """byo_model.json keeps parts measured at older commits: the part is stale when git shows its sources changed."""
    root, results = tmp_path / "repo", tmp_path / "repo" / "bench" / "results"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "measured.py").write_text("RATE = 1\n")
    (root / "constraints.txt").write_text("torch==1\n")

    def commit(message: str) -> str:
        git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(root)]
        subprocess.run([*git, "add", "-A"], check=True)
        subprocess.run([*git, "commit", "-qm", message], check=True)
        return subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    first = commit("first")
    (root / "pkg" / "other.py").write_text("X = 1\n")  # not measured
    second = commit("second")
    measured_result(root, results, "parts.json", "r1")
    path = results / "parts.json"
    data = json.loads(path.read_text())
    data["provenance"]["commit"] = second
    data["measured"] = {"a": {"commit": first, "date": "2026-11-25T00:00:00Z"}, "b": {"commit": second}}
    write(path, data)
    assert stale(results, root, recipe="r1") == []  # part a's sources are the same at both commits
    (root / "constraints.txt").write_text("torch==2\n")
    (root / "pkg" / "measured.py").write_text("RATE = 2\n")
    sources = data["provenance"]["sources"]
    data["provenance"]["sources_fingerprint"] = provenance.sources_fingerprint(root, sources, "r1")
    write(path, data)  # the last run (part b) measured the new sources; part a did not
    assert stale(results, root, recipe="r1") == [
        Stale("parts.json", f"part a: its measured sources changed since {first[:7]} (2026-11-25)")]  # no command
    data["measured"]["a"]["commit"] = "f" * 40  # a commit git does not know: cannot compare, so stale
    write(path, data)
    assert [entry.why.split(":")[0] for entry in stale(results, root, recipe="r1")] == ["part a"]


def test_best_mix_takes_each_specialtys_lowest_set_at_a_g_every_specialty_was_scanned_at() -> None:
    from bench.report_rows_scale import best_mix, regime_of

    def scan(**by_g: float) -> dict[str, dict[str, float]]:
        return {g.removeprefix("g"): {"no_signal_frac": frac} for g, frac in by_g.items()}
    sets = {"a1": {"name": "a"}, "a2": {"name": "a"}, "b1": {"name": "b"}}
    scans = {"a1": scan(g8=0.5, g16=0.4, g32=0.0), "a2": scan(g8=0.3), "b1": scan(g8=0.7, g16=0.4)}
    # G = 8: a's best 0.3 (a2), b 0.7 -> 0.5; G = 16: 0.4 and 0.4 -> 0.4; G = 32: b was not scanned there
    assert best_mix({"option_sets": sets, "scans": scans}) == (0.4, "16")
    assert (regime_of(0.4), regime_of(0.2), regime_of(0.3)) == ("`hard`", "`medium`", "no regime")
