"""``retire_checks.mutation_report`` counts mutmut's verdicts as the issue defines them: killed
(a failure, a timeout or a crash), survived (no test reached it counts too), equivalent only by
name with a reason, score = killed / (killed + survived), and a module not fully run is said
to be partial or not run."""

from __future__ import annotations

import json
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
