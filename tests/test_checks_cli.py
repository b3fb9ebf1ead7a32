"""``retire check``: the quick profile end to end — explorer, Z3 and the mutant catalogue — with
the JSON report the issue asks for."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from retire_checks.engine import COMMANDS_CHECKED
from retire_checks.explorer import ALL_PROBES, QUICK
from retire_checks.mutants import MUTANTS
from retire_cli import main
from retire_spec.invariants import INVARIANTS, QUIESCENCE

REQUIRED_KEYS = {
    "profile",
    "states",
    "transitions",
    "max_depth",
    "seconds",
    "states_per_second",
    "invariants",
    "refinement",
    "probes",
    "z3",
    "mutants",
    "mutants_total",
    "mutants_killed",
}


def test_retire_check_quick_profile(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report_path = tmp_path / "report.json"
    code = main(["check", "--json", str(report_path), "--no-progress", "--jobs", "2", "--speedup"])
    out = capsys.readouterr().out
    assert code == 0, out
    report = json.loads(report_path.read_text(encoding="utf-8"))
    assert set(report) >= REQUIRED_KEYS
    assert report["profile"] == "quick"
    assert report["states"] > 40_000 and report["transitions"] > report["states"]
    assert report["max_depth"] >= 15
    assert report["states_per_second"] > 0
    # the explorer over two workers, and once more over one: the same results
    # six configurations on two workers: side by side, each searched by one process
    assert report["jobs"] == 2 and report["side_by_side"]
    assert all(c["workers"] == 1 for c in report["configs"])
    speedup = report["speedup"]
    assert speedup["workers"] == 2 and speedup["identical"] is True
    assert speedup["speedup"] > 0 and speedup["seconds_one_worker"] > 0
    assert set(report["invariants"]) == {i.name for i in INVARIANTS + QUIESCENCE}
    assert all(report["invariants"].values())
    assert report["refinement"] is True
    assert set(report["probes"]) == set(ALL_PROBES)
    assert all(hits > 0 for hits in report["probes"].values())
    assert report["z3"] and all(v == "proved" for v in report["z3"].values())
    assert report["z3_bmc"]["status"] == "clean"
    assert report["vacuity"] is True
    assert report["configurations"] == [c.name for c in QUICK.configs]
    assert "twins" in report["configurations"]  # two scopes of one tenant and fingerprint
    assert report["commands_checked"] == list(COMMANDS_CHECKED)
    assert report["mutants_total"] >= 40
    assert report["mutants_total"] >= 15
    assert report["mutants_killed"] == report["mutants_total"]
    for name, checks in report["mutants"].items():
        assert set(checks) >= set(MUTANTS[name].required), name
    assert all(
        "z3" in checks for name, checks in report["mutants"].items() if name.startswith("spec_")
    )
    assert "retire check --profile quick: OK" in out


def test_a_vacuous_proof_fails_the_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``vacuity`` comes from ``prove`` itself: when one of its satisfiability queries is not
    ``sat`` the report says ``"vacuity": false`` and ``retire check`` fails, although every
    invariant is still reported proved."""
    from retire_checks import proofs

    real = proofs.non_vacuity

    def one_unsat(*args: Any, **kwargs: Any) -> tuple[proofs.Check, ...]:
        checks = real(*args, **kwargs)
        return (proofs.Check("hypotheses ∧ guard: publish", "unsat", 0.0), *checks[1:])

    monkeypatch.setattr(proofs, "non_vacuity", one_unsat)
    report_path = tmp_path / "report.json"
    code = main(
        ["check", "--json", str(report_path), "--no-progress", "--skip-mutants", "--jobs", "1"]
    )
    out = capsys.readouterr().out
    report = json.loads(report_path.read_text(encoding="utf-8"))
    assert report["vacuity"] is False
    assert all(v == "proved" for v in report["z3"].values())
    # everything else passed: the failure is the vacuity's alone
    assert report["exhaustive"] and report["refinement"] and not report["missing_probes"]
    assert all(report["invariants"].values()) and report["z3_bmc"]["status"] == "clean"
    assert code == 1 and "retire check --profile quick: FAILED" in out


@pytest.mark.parametrize("args", [["--profile", "enormous"], ["--jobs", "0"]])
def test_bad_usage_exits_2(args: list[str]) -> None:
    with pytest.raises(SystemExit) as err:
        main(["check", *args])
    assert err.value.code == 2
