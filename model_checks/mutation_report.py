"""``make mutation``'s report: mutmut's results over ``retire_core``'s protocol modules as JSON.

``mutmut run`` (configured in ``pyproject.toml``: the modules, and the kill command -- the core
unit tests, then the explorer of ``retire check --profile quick``, ``tests/mutation``) leaves one
``mutants/retire_core/<module>.py.meta`` per module with an exit code per mutant. This module
reads them and writes ``mutation-report.json``:

* ``killed`` -- mutants some test failed on (a timeout or a crash also kills: the run did not
  pass);
* ``survived`` -- mutants every test passed on, less those listed in :data:`EQUIVALENT`;
* ``equivalent`` -- survivors whose behaviour is the original's, each with a one-line reason;
* ``score`` = killed / (killed + survived);

and the details: every survivor and equivalent mutant with its diff, the mutants no selected
test executes (``no_tests``, counted as survived: nothing checked them) and those not run yet
(``not_checked``, not counted; a partial run lists them per module under ``modules``).

Run as ``python -m retire_checks.mutation_report [--out PATH]`` from the repository root, after
``mutmut run``. What does not live here: the kill command (``pyproject.toml``, ``tests/``), the
hand-written mutant catalogue (``mutants.py``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

#: The protocol modules ``make mutation`` covers (issue 14), in the order they are reported.
MODULES = ("gates", "handoff", "reclaim", "table", "ledger", "machine", "txn")

KILLED = frozenset({1, 3, 24, -24, 36, 152, 255, -9, -11})  # failed, timed out or crashed
SURVIVED = 0
NO_TESTS = frozenset({5, 33})

#: Surviving mutants whose behaviour equals the original's, with the reason (a mutant name is
#: stable while its function's source is unchanged; ``mutmut show NAME`` prints its diff).
EQUIVALENT: dict[str, str] = {}


def _diff(name: str, path: Path) -> str:
    try:
        from mutmut.mutation.diff_apply import get_diff_for_mutant
    except ImportError:  # pragma: no cover - mutmut is a dev extra
        return ""
    try:
        return str(get_diff_for_mutant(name, path=path))
    except Exception as err:  # the report must not fail over one unreadable diff
        return f"(no diff: {type(err).__name__}: {err})"


def collect(root: Path = Path("mutants")) -> dict[str, Any]:
    """The report, from the ``.meta`` files under ``root`` (mutmut's working copy)."""
    killed = 0
    survivors: list[dict[str, str]] = []
    equivalents: list[dict[str, str]] = []
    no_tests: list[dict[str, str]] = []
    modules: dict[str, dict[str, int]] = {}
    seconds = 0.0
    for module in MODULES:
        source = Path("retire_core") / f"{module}.py"
        meta = root / "retire_core" / f"{module}.py.meta"
        if not meta.exists():
            modules[module] = {"mutants": 0, "checked": 0}
            continue
        data = json.loads(meta.read_text(encoding="utf-8"))
        codes: dict[str, int | None] = data.get("exit_code_by_key", {})
        durations: dict[str, float] = data.get("durations_by_key", {})
        counts = {"mutants": len(codes), "checked": 0, "killed": 0, "survived": 0}
        counts.update({"equivalent": 0, "no_tests": 0})
        for name, code in sorted(codes.items()):
            if code is None:
                continue
            counts["checked"] += 1
            seconds += float(durations.get(name) or 0.0)
            if code in KILLED:
                killed += 1
                counts["killed"] += 1
            elif code == SURVIVED and name in EQUIVALENT:
                counts["equivalent"] += 1
                equivalents.append(
                    {"mutant": name, "reason": EQUIVALENT[name], "diff": _diff(name, source)}
                )
            elif code in NO_TESTS:
                counts["no_tests"] += 1
                no_tests.append({"mutant": name, "diff": _diff(name, source)})
            else:
                counts["survived"] += 1
                survivors.append(
                    {"mutant": name, "exit_code": str(code), "diff": _diff(name, source)}
                )
        modules[module] = counts
    survived = len(survivors) + len(no_tests)
    covered = [m for m, c in modules.items() if c["mutants"] and c["checked"] == c["mutants"]]
    return {
        "schema": "retire-mutation-report/1",
        "tool": _tool_version(),
        "killed": killed,
        "survived": survived,
        "equivalent": len(equivalents),
        "score": round(killed / (killed + survived), 4) if killed + survived else None,
        "modules_complete": covered,
        "modules_partial": [m for m, c in modules.items() if 0 < c["checked"] < c["mutants"]],
        "modules_not_run": [m for m, c in modules.items() if c["checked"] == 0],
        "modules": modules,
        "test_seconds": round(seconds, 1),
        "survivors": survivors,
        "no_tests": no_tests,
        "equivalents": equivalents,
    }


def _tool_version() -> str:
    try:
        from importlib.metadata import version

        return f"mutmut {version('mutmut')}"
    except Exception:  # pragma: no cover
        return "mutmut"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m retire_checks.mutation_report")
    p.add_argument("--out", type=Path, default=Path("mutation-report.json"))
    p.add_argument("--mutants", type=Path, default=Path("mutants"), help="mutmut's working copy")
    args = p.parse_args(argv)
    if not args.mutants.is_dir():
        print(f"no {args.mutants}/: run mutmut first (make mutation)", file=sys.stderr)
        return 2
    report = collect(args.mutants)
    args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(
        f"mutation: {report['killed']} killed, {report['survived']} survived, "
        f"{report['equivalent']} equivalent, score {report['score']} "
        f"(complete: {', '.join(report['modules_complete']) or '-'}; partial: "
        f"{', '.join(report['modules_partial']) or '-'}; not run: "
        f"{', '.join(report['modules_not_run']) or '-'}) -> {args.out}"
    )
    for s in report["survivors"] + report["no_tests"]:
        print(f"  survived: {s['mutant']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
