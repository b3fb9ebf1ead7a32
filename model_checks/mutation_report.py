"""``make mutation``'s report: mutmut's results over ``retire_core``'s protocol modules as JSON.

``mutmut run`` (configured in ``pyproject.toml``: the modules, and the kill command -- the core
unit tests, then the explorer of ``retire check --profile quick``, ``tests/mutation``) leaves one
``mutants/retire_core/<module>.py.meta`` per module with an exit code per mutant. This module
reads them and writes ``mutation-report.json``:

* ``killed`` -- mutants some test failed on (a timeout or a crash also kills: the run did not
  pass), in mutmut's run or when the survivors are judged again (``--recheck``: the Hypothesis
  lock-step machine, too slow for every mutant, and tests written after the run started);
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
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

#: The protocol modules ``make mutation`` covers (issue 14), in the order they are reported.
MODULES = ("gates", "handoff", "reclaim", "table", "ledger", "handlers", "machine", "txn")

KILLED = frozenset({1, 3, 24, -24, 36, 152, 255, -9, -11})  # failed, timed out or crashed
SURVIVED = 0
NO_TESTS = frozenset({5, 33})

#: Surviving mutants whose behaviour equals the original's, with the reason (a mutant name is
#: stable while its function's source is unchanged; ``mutmut show NAME`` prints its diff).
EQUIVALENT: dict[str, str] = {}

_LOST = (
    "unreachable case: a certified page stays tracked and pinned until its adoption report "
    "(RECLAIM frees no pinned page; pins are dropped only here or with the certificate itself, "
    "release_certificate), so no certified page is ever missing or unpinned at verify_adoption"
)
_SHORTCUT = (
    "RECLAIM's shortcut counts the current version as retired too, so it answers 'nothing to "
    "do' less often; the full pass it then runs finds the same nothing (tests/test_core_batch.py "
    "compares the shortcut with the full scan)"
)
_MEMO = (
    "a lookup in the memo of rec.drained misses, so rec.drained(v) is computed again: the same "
    "answer, later"
)
_CLEAN_MEMO = (
    "RECLAIM's per-step memo of scopes found clean never hits (or, for changes=1 outside a "
    "thawed page map, stores and compares the same constant): the scan runs and finds the "
    "same result"
)
_CLEAN_MEMO_N = (7, 8, 9, 14, 16, 33)
EQUIVALENT.update(
    {
        "retire_core.handoff.x_verify_adoption__mutmut_15": _LOST,  # `or` -> `and`
        "retire_core.reclaim.x__nothing_drained__mutmut_9": _SHORTCUT,
        "retire_core.reclaim.x__nothing_drained__mutmut_12": _SHORTCUT,
        **{f"retire_core.reclaim.x_reclaim__mutmut_{n}": _CLEAN_MEMO for n in _CLEAN_MEMO_N},
        "retire_core.reclaim.x_reclaim__mutmut_17": (
            "RECLAIM's memo of clean scopes then hits only when it was taken on the frozen "
            "page map and the map has been thawed since with no counted change (changes == 0): "
            "only deletions happened, which cannot make a clean scope unclean, and the record "
            "is the same, so skipping is still right (the counter's definition is tested: "
            "tests/test_core_page_index.py); where the original hits (the same view) it "
            "misses, and the check runs again with the same result"
        ),
        "retire_core.reclaim.x_reclaim__mutmut_56": _MEMO,
        "retire_core.reclaim.x_reclaim__mutmut_57": _MEMO,
        "retire_core.reclaim.x__forget_drained_versions__mutmut_10": _MEMO,
        "retire_core.reclaim.x__forget_drained_versions__mutmut_11": _MEMO,
        "retire_core.handoff.x__candidates__mutmut_11": (
            "`page.version <= rec.epoch` for `<`: while ALIGN runs the successor is not "
            "admitted, so it has no participant and no page carries its version"
        ),
        "retire_core.gates.x_write_gate__mutmut_2": (
            "the write gate lets a write into an unallocated page through, but on_write fences "
            "it anyway (`if not allowed or page is None`), with the same reason"
        ),
        "retire_core.handoff.x_release_certificate__mutmut_7": _LOST,  # `and` -> `or`
        "retire_core.handoff.x_verify_adoption__mutmut_18": _LOST,  # no reason for a lost page
        "retire_core.handoff.x_verify_adoption__mutmut_46": _LOST,  # `continue` -> `break`
        "retire_core.handoff.x_verify_adoption__mutmut_131": (
            "`released or failure` for `released and failure`: a page is released only once a "
            "failure is found, and the entry where the failure is found is itself released "
            "(a failure on a tracked, pinned page), except for a lost page, which cannot happen: "
            + _LOST
        ),
        "retire_core.handoff.x_verify_adoption__mutmut_11": (
            "`failure` starts as '' instead of None: it is read only when a page is released, "
            "and a page is released only when an entry failed (while every entry is valid the "
            "certificate's own cut is the best one), by which time `failure or problem` holds "
            "that entry's reason"
        ),
        "retire_core.handoff.x_verify_adoption__mutmut_23": (
            "a valid entry's problem is '' instead of None: it is only or-ed into `failure`, "
            "where both are false, so the first failing entry's reason still wins"
        ),
        "retire_core.handoff.x_best_cut__mutmut_16": (
            "a sliding group's run count starts at 1 instead of 0: the start adds only to a run "
            "that begins at block 0, and such a run ending at the cut's last block is already "
            "`cut` long, at least min(w, cut), so every cut is judged the same"
        ),
    }
)

# handlers, machine, txn (the run of 2026-12-02)
_NO_HIGHER = (
    "no participant of a version above the scope's epoch exists (ParticipantStarted refuses a "
    "future version), so fencing below epoch + 2, or up to and including the bound, fences the "
    "same participants"
)
_FUTURE_GUARD = (
    "the guard only skips a call to _no_future, which itself raises only for a version above "
    "the epoch: with `>=` the current version's events make a call that does nothing"
)
_DISPATCHED = (
    "machine.dispatch looks a page event's page up before the handler runs (and raises "
    "UnknownPageError or DoubleFreeError naming the event), so the handler's own lookup always "
    "finds the page and never uses its label or its arguments"
)
_GENERATION = (
    "a tracked page always has an entry in generations (set at its allocation, kept when it is "
    "freed), so the default of this lookup is never used"
)
_FAST_PATH = (
    "a lookup shortcut: every class of TABLE.steady is also in TABLE.rows, a class missing from "
    "the lookup is found again by isinstance over EVENT_TYPES, and _tracked_page returns a "
    "tracked page's record, so the general path gives the same answer"
)
_LEDGER_BOUND = (
    "at the bound itself: trimming a ledger of exactly ledger_size entries removes nothing, "
    "and trim_ledger returns at once for a ledger within its bound"
)
EQUIVALENT.update(
    {
        **{
            f"retire_core.handlers.{name}": _NO_HIGHER
            for name in (
                "x_on_supersede__mutmut_62",
                "x__fence_running__mutmut_3",
                "x_on_cancel__mutmut_40",
                "x_on_version_finished__mutmut_63",
            )
        },
        **{
            f"retire_core.handlers.{name}__mutmut_3": _FUTURE_GUARD
            for name in ("x_on_frame", "x_on_page_allocated", "x_on_write")
        },
        "retire_core.handlers.x_on_frame__mutmut_18": (
            "publication_gate does not read the frame kind: Rule 1 is the same for tokens, "
            "scheduler commits and installs"
        ),
        **{
            f"retire_core.handlers.x_{handler}__mutmut_{n}": _DISPATCHED
            for handler, numbers in (
                ("on_page_reused", (4, 8, 9, 10)),
                ("on_page_evicted", (4, 8, 9, 10)),
                ("on_writer_closed", (6, 7, 8, 9, 10, 11, 12, 13, 14)),
                ("on_drafts_verified", (5, 6, 7, 8, 9, 10, 11, 12, 13)),
            )
            for n in numbers
        },
        **{f"retire_core.handlers.x_on_page_reused__mutmut_{n}": _GENERATION for n in (17, 19, 20)},
        "retire_core.handlers.x_on_page_reused__mutmut_11": (
            "a page whose writer is open is always held (its reference is dropped only after "
            "its writer closed) and an unheld page that is not full is freed at once, so "
            "`held or writer_open or not full` and `held or writer_open and not full` agree on "
            "every page the core tracks"
        ),
        **{
            f"retire_core.machine.x_dispatch__mutmut_{n}": _FAST_PATH
            for n in (1, 2, 3, 4, 17, 18, 32, 33)
        },
        **{f"retire_core.machine.x_dispatch__mutmut_{n}": _FAST_PATH for n in (27, 29)},
        **{
            f"retire_core.handlers.x__allow_write__mutmut_{n}": (
                "a cache of AllowWrite commands: a miss builds the same command again, and "
                "the cache is bounded one entry later"
            )
            for n in (2, 3, 5)
        },
        **{
            f"retire_core.handlers.x_{handler}__mutmut_{n}": (
                "the inlined check of a running participant only decides whether to call "
                "_running_participant, which reads the participant again and returns for a "
                "running one of the event's version"
            )
            for handler in ("on_page_allocated", "on_write")
            for n in (15, 16)
        },
        "retire_core.handlers.x_on_write__mutmut_40": (
            "write_gate does not read the participant: a page's writer is its version, the "
            "participant is named in the command only"
        ),
        **{f"retire_core.txn.xǁTxnǁfreeze__mutmut_{n}": _LEDGER_BOUND for n in (2, 4)},
        **{
            name: (
                "a page's id is always in its owner's ids when the page is deleted or moves to "
                "another owner (every write keeps the ids exact, and a map is thawed only from "
                "an index of its own pages, Txn._index), so this pop never misses and its "
                "default is never used"
            )
            for name in (
                "retire_core.txn.xǁPageDictǁ__delitem____mutmut_4",
                "retire_core.txn.xǁPageDictǁ__setitem____mutmut_27",
            )
        },
        **{
            name: "the page index is an ordered set: its dict values are never read"
            for name in (
                "retire_core.txn.xǁPageDictǁ__setitem____mutmut_29",
                "retire_core.txn.xǁPageDictǁ__setitem____mutmut_31",
                "retire_core.txn.x_build_index__mutmut_3",
            )
        },
        "retire_core.txn.xǁPageDictǁ_count__mutmut_3": (
            "the scope is never marked as owning its copy of the counts, so every change "
            "copies them again (after the first, from this map's own copy, never the shared "
            "one): the same counts, one more copy of a few (version, held) pairs per write; no "
            "caller keeps a view of a scope's counts across a write (RECLAIM and classify_late "
            "read page_kinds before they write)"
        ),
        "retire_core.machine.x_run_batch__mutmut_4": _LEDGER_BOUND,
        "retire_core.txn.xǁTxnǁtrim_ledger__mutmut_4": _LEDGER_BOUND,
        "retire_core.txn.xǁTxnǁtrim_ledger__mutmut_6": _LEDGER_BOUND,
    }
)


def _diff(name: str, path: Path) -> str:
    try:
        from mutmut.mutation.diff_apply import get_diff_for_mutant
    except ImportError:  # pragma: no cover - mutmut is a dev extra
        return ""
    try:
        return str(get_diff_for_mutant(name, path=path))
    except Exception as err:  # the report must not fail over one unreadable diff
        return f"(no diff: {type(err).__name__}: {err})"


def recheck(
    names: list[str], tests: list[str], root: Path = Path("mutants"), jobs: int = 2
) -> dict[str, str]:
    """Judge surviving mutants again with ``tests``: the Hypothesis lock-step machine (too slow
    to run for every mutant), and test files added after the run started (changing mutmut's test
    selection would reset every cached verdict). Each test file is copied into ``root`` as it is
    now; the unmutated code must pass them. Returns the mutants a test failed on, with the test
    files that were run."""
    for test in tests:
        target = root / test
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(test, target)

    def run(mutant: str) -> int:
        env = dict(os.environ, MUTANT_UNDER_TEST=mutant, RETIRE_MUTATION="1")
        cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests]
        return subprocess.run(cmd, cwd=root, env=env, capture_output=True).returncode

    if run("") != 0:
        raise RuntimeError(f"the unmutated code fails {tests}: fix the tests before rechecking")
    with ThreadPoolExecutor(max_workers=jobs) as pool:  # each run is its own process
        codes = dict(zip(names, pool.map(run, names), strict=True))
    return {name: " ".join(tests) for name, code in codes.items() if code != 0}


def collect(
    root: Path = Path("mutants"), recheck_tests: list[str] | None = None, jobs: int = 2
) -> dict[str, Any]:
    """The report, from the ``.meta`` files under ``root`` (mutmut's working copy); survivors
    are judged again with ``recheck_tests`` if given (see ``recheck``)."""
    late_kills: dict[str, str] = {}
    if recheck_tests:
        surviving = [
            name
            for module in MODULES
            for name, code in _codes(root, module).items()
            if (code == SURVIVED or code in NO_TESTS) and name not in EQUIVALENT
        ]
        late_kills = recheck(surviving, recheck_tests, root, jobs)
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
        codes = {n: (1 if n in late_kills else c) for n, c in codes.items()}
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
        "recheck_tests": recheck_tests or [],
        "killed_on_recheck": [{"mutant": n, "by": t} for n, t in sorted(late_kills.items())],
        "survivors": survivors,
        "no_tests": no_tests,
        "equivalents": equivalents,
    }


def keep_previous(report: dict[str, Any], previous: dict[str, Any]) -> dict[str, Any]:
    """``report`` with the verdicts of ``previous`` (an earlier report) for every module this
    run did not check at all (a run restricted to some modules, ``make mutation MODULES=...``);
    those modules are listed under ``modules_from_previous`` with the earlier run's tool, and
    the totals and score are recomputed over both."""
    taken = [
        m
        for m in report["modules_not_run"]
        if previous.get("modules", {}).get(m, {}).get("checked", 0) > 0
    ]
    out = dict(report)
    if not taken:
        return out

    def of(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [r for r in rows if r["mutant"].split(".")[1] in taken]

    modules = dict(report["modules"])
    for m in taken:
        modules[m] = previous["modules"][m]
    for key in ("survivors", "no_tests", "equivalents", "killed_on_recheck"):
        out[key] = report[key] + of(previous.get(key, []))
    killed = sum(c.get("killed", 0) for c in modules.values())
    survived = len(out["survivors"]) + len(out["no_tests"])
    out.update(
        killed=killed,
        survived=survived,
        equivalent=len(out["equivalents"]),
        score=round(killed / (killed + survived), 4) if killed + survived else None,
        modules=modules,
        modules_complete=[m for m in MODULES if m in report["modules_complete"] or m in taken],
        modules_not_run=[m for m in report["modules_not_run"] if m not in taken],
        modules_from_previous=taken,
        previous_tool=previous.get("tool"),
        test_seconds=round(report["test_seconds"] + previous.get("test_seconds", 0.0), 1),
    )
    return out


def _codes(root: Path, module: str) -> dict[str, int | None]:
    meta = root / "retire_core" / f"{module}.py.meta"
    if not meta.exists():
        return {}
    codes: dict[str, int | None] = json.loads(meta.read_text(encoding="utf-8")).get(
        "exit_code_by_key", {}
    )
    return codes


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
    p.add_argument(
        "--recheck",
        nargs="+",
        default=None,
        metavar="TEST",
        help="judge the survivors again with these test files (added after the run started)",
    )
    p.add_argument("--jobs", type=int, default=2, help="rechecks run at once")
    p.add_argument(
        "--keep",
        type=Path,
        default=None,
        metavar="REPORT",
        help="an earlier report whose verdicts stand for the modules this run did not check",
    )
    args = p.parse_args(argv)
    if not args.mutants.is_dir():
        print(f"no {args.mutants}/: run mutmut first (make mutation)", file=sys.stderr)
        return 2
    report = collect(args.mutants, args.recheck, args.jobs)
    if args.keep is not None:
        report = keep_previous(report, json.loads(args.keep.read_text(encoding="utf-8")))
    args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(
        f"mutation: {report['killed']} killed, {report['survived']} survived, "
        f"{report['equivalent']} equivalent, score {report['score']} "
        f"(complete: {', '.join(report['modules_complete']) or '-'}; partial: "
        f"{', '.join(report['modules_partial']) or '-'}; not run: "
        f"{', '.join(report['modules_not_run']) or '-'}; from the earlier report: "
        f"{', '.join(report.get('modules_from_previous', [])) or '-'}) -> {args.out}"
    )
    for s in report["survivors"] + report["no_tests"]:
        print(f"  survived: {s['mutant']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
