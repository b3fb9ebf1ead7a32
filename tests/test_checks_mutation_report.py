"""``retire_checks.mutation_report`` counts mutmut's verdicts as the issue defines them: killed
(a failure, a timeout or a crash), survived (no test reached it counts too), equivalent only by
name with a reason, score = killed / (killed + survived), and a module not fully run is said
to be partial or not run."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from retire_checks import mutation_report as mr


def _meta(root: Path, module: str, codes: dict[str, int | None]) -> None:
    d = root / "retire_core"
    d.mkdir(parents=True, exist_ok=True)
    data = {"exit_code_by_key": codes, "durations_by_key": {k: 1.0 for k in codes}}
    (d / f"{module}.py.meta").write_text(json.dumps(data))


def test_verdicts_are_counted_as_the_issue_defines_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    equivalent = "retire_core.gates.x_g__mutmut_3"
    monkeypatch.setitem(mr.EQUIVALENT, equivalent, "a reason")
    _meta(
        tmp_path,
        "gates",
        {
            "retire_core.gates.x_g__mutmut_1": 1,  # a test failed
            "retire_core.gates.x_g__mutmut_2": 36,  # timed out
            equivalent: 0,
            "retire_core.gates.x_g__mutmut_4": 0,  # survived
            "retire_core.gates.x_g__mutmut_5": 33,  # no test reaches it
        },
    )
    _meta(
        tmp_path,
        "table",
        {"retire_core.table.x_t__mutmut_1": 1, "retire_core.table.x_t__mutmut_2": None},
    )
    report = mr.collect(tmp_path)
    assert (report["killed"], report["survived"], report["equivalent"]) == (3, 2, 1)
    assert report["score"] == round(3 / 5, 4)
    assert [s["mutant"] for s in report["survivors"]] == ["retire_core.gates.x_g__mutmut_4"]
    assert [s["mutant"] for s in report["no_tests"]] == ["retire_core.gates.x_g__mutmut_5"]
    assert report["equivalents"][0]["reason"] == "a reason"
    assert report["modules_complete"] == ["gates"]
    assert report["modules_partial"] == ["table"]
    assert "machine" in report["modules_not_run"]


def test_every_listed_equivalent_mutant_has_a_reason() -> None:
    assert mr.EQUIVALENT
    for name, reason in mr.EQUIVALENT.items():
        assert name.startswith("retire_core.") and "__mutmut_" in name
        assert len(reason) > 40, name


def test_a_run_over_some_modules_keeps_the_earlier_verdicts_of_the_others(
    tmp_path: Path,
) -> None:
    _meta(tmp_path / "old", "gates", {"retire_core.gates.x_g__mutmut_1": 1})
    _meta(tmp_path / "old", "table", {"retire_core.table.x_t__mutmut_1": 0})
    previous = mr.collect(tmp_path / "old")
    # this run checked txn only; gates and table were generated but not run
    _meta(tmp_path / "new", "txn", {"retire_core.txn.x_a__mutmut_1": 1})
    _meta(tmp_path / "new", "gates", {"retire_core.gates.x_g__mutmut_1": None})
    report = mr.keep_previous(mr.collect(tmp_path / "new"), previous)
    assert report["modules_from_previous"] == ["gates", "table"]
    assert (report["killed"], report["survived"]) == (
        2,
        1,
    )  # txn's kill, gates' kill, table's survivor
    assert report["score"] == round(2 / 3, 4)
    assert [s["mutant"] for s in report["survivors"]] == ["retire_core.table.x_t__mutmut_1"]
    assert report["modules_complete"] == ["gates", "table", "txn"]
    assert "machine" in report["modules_not_run"] and "txn" not in report["modules_not_run"]
    # a module this run checked is never overwritten by the earlier report
    assert mr.keep_previous(report, {"modules": {"txn": {"checked": 5, "killed": 0}}}) == report


#: The core's test files that do not meet every mutant in mutmut's run, and why.
NOT_PER_MUTANT = {
    "tests/test_core_hypothesis.py": "too slow per mutant: it judges the survivors (--recheck)",
    "tests/test_core_event_fuzz.py": "too slow per mutant: about 145,000 events, 7 s a run",
}


def test_every_core_test_file_meets_the_mutants() -> None:
    """A new core test file left out of mutmut's selection would let ``make mutation`` report
    survivors it kills; Hypothesis, left out for its time, judges the survivors instead."""
    root = Path(__file__).resolve().parent.parent
    mutmut = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["mutmut"]
    selection = set(mutmut["pytest_add_cli_args_test_selection"])
    core_tests = {f"tests/{p.name}" for p in (root / "tests").glob("test_core_*.py")}
    assert core_tests - selection == set(NOT_PER_MUTANT)
    assert all((root / t).is_file() for t in selection), selection
    assert "--recheck tests/test_core_hypothesis.py" in (root / "Makefile").read_text()
