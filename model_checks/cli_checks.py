"""The ``retire check`` and ``retire validate-trace`` subcommands.

``retire check [--profile quick|full] [--json PATH]`` runs, in this order of importance, the
explorer over the real core (``explorer.run_profile``), the Z3 proofs and bounded model checking
(``proofs.prove``) and the mutant catalogue (``mutants``), prints a summary and optionally writes
a JSON report. The catalogue runs in a second process while the explorer and Z3 run in this one
(``--jobs 1`` keeps everything in one process). A violation found by the explorer is printed as
numbered steps and written as a pytest file (``--counterexample``). ``retire validate-trace
FILE`` checks a structlog JSON-lines log of ``retire_core.Retire`` against the spec
(``trace_validation``).

Exit codes — ``retire check``: 0 every invariant held in every explored state, refinement held,
every probe was hit, every Z3 obligation was proved with a clean BMC, and every mutant was
killed; 1 any of these failed (the summary says which); 2 bad usage. ``retire validate-trace``:
0 the trace is a behaviour of the spec; 1 it is not (the first offending line is printed as
``FILE:LINE: reason``); 2 bad usage or an unreadable file.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from retire_checks.cli import command

if TYPE_CHECKING:
    from retire_checks.profiles import ProfileResult

PROFILE_SETTINGS: dict[str, dict[str, Any]] = {
    "quick": {"bmc_depth": 4, "z3_timeout_ms": 30_000, "hypothesis": False},
    "full": {"bmc_depth": 6, "z3_timeout_ms": 120_000, "hypothesis": True},
}


def _configure_check(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", choices=sorted(PROFILE_SETTINGS), default="quick")
    p.add_argument("--json", metavar="PATH", help="write the JSON report here")
    p.add_argument(
        "--counterexample",
        metavar="PATH",
        default="test_retire_counterexample.py",
        help="where a counterexample found by the explorer is written as a pytest file",
    )
    p.add_argument(
        "--jobs",
        type=_positive,
        default=_cpus(),
        metavar="N",
        help="worker processes (default: the CPUs available): the explorer's configurations run "
        "side by side over them (or, with fewer configurations than workers, each split across "
        "all of them), then the mutant catalogue and Z3 share them",
    )
    p.add_argument(
        "--speedup",
        action="store_true",
        help="also run the explorer with one worker and report the speed-up of --jobs N "
        "against it (the two runs must agree on every count, probe and verdict)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress line on stderr")
    p.add_argument("--skip-mutants", action="store_true", help="do not run the catalogue")
    p.add_argument(
        "--hypothesis",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="also judge core mutants with the Hypothesis machine (default: full profile only)",
    )


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on every platform
        return os.cpu_count() or 1


def _mutant_job(names: list[str], use_hypothesis: bool) -> list[dict[str, Any]]:
    """Judge some mutants (in a worker process) and return plain, picklable verdicts."""
    from retire_checks.mutants import run_catalogue

    out = []
    for v in run_catalogue(names, use_hypothesis=use_hypothesis):
        out.append(
            {
                "name": v.mutant.name,
                "kind": v.mutant.kind,
                "level": v.mutant.level,
                "description": v.mutant.description,
                "killed_by": list(v.killed_by),
                "killed": v.killed,
                "detail": v.detail,
                "seconds": round(v.seconds, 2),
            }
        )
    return out


def _z3_job(bmc_depth: int, timeout_ms: int) -> dict[str, Any]:
    try:
        from retire_checks.proofs import prove
    except ModuleNotFoundError as err:
        return {"error": f"z3-solver is not installed ({err}); pip install 'retire[check]'"}
    report = prove(bmc_depth=bmc_depth, timeout_ms=timeout_ms)
    return {
        "results": report.results,
        "bmc_depth": report.bmc_depth,
        "bmc_status": report.bmc_status,
        "seconds": round(report.seconds, 2),
        "checks": len(report.checks),
        "all_proved": report.all_proved,
        "vacuity": report.vacuity,
        "vacuity_checks": [
            {"check": c.name, "status": c.status, "detail": c.detail} for c in report.vacuity_checks
        ],
        "summary": report.summary(),
        "not_proved": [
            {"check": c.name, "status": c.status, "detail": c.detail}
            for c in report.checks
            if c.status != "proved"
        ],
    }


def _speedup(result: ProfileResult, single: ProfileResult) -> dict[str, Any]:
    """The explorer's run over N workers against its run over one: wall times, rates, the
    ratio, and whether the two agree on every count, probe and verdict (they must)."""

    def outcome(r: ProfileResult) -> list[Any]:
        return [
            (x.states, x.transitions, x.max_depth, x.quiescent, x.exhaustive, x.probes, x.violation)
            for x in r.results
        ]

    workers = result.workers
    return {
        "workers": workers,
        "seconds": round(result.seconds, 2),
        "seconds_one_worker": round(single.seconds, 2),
        "states_per_second": round(result.states_per_second, 1),
        "states_per_second_one_worker": round(single.states_per_second, 1),
        "speedup": round(single.seconds / result.seconds, 3) if result.seconds > 0 else 0.0,
        "speedup_per_worker": round(single.seconds / result.seconds / workers, 3)
        if result.seconds > 0
        else 0.0,
        "identical": outcome(result) == outcome(single),
    }


def _run_tasks(tasks: list[tuple[str, Any, tuple[Any, ...]]], jobs: int) -> dict[str, Any]:
    """Run ``(name, function, args)`` tasks, in this process or over ``jobs`` worker
    processes (tasks are submitted in the given order: put the longest first)."""
    if jobs == 1:
        return {name: fn(*args) for name, fn, args in tasks}
    with concurrent.futures.ProcessPoolExecutor(max_workers=jobs) as pool:
        futures = {name: pool.submit(fn, *args) for name, fn, args in tasks}
        return {name: f.result() for name, f in futures.items()}


@command(
    "check", "explore, prove and mutate: the protocol's machine-checked safety", _configure_check
)
def check(args: argparse.Namespace) -> int:
    from retire_checks.engine import COMMANDS_CHECKED
    from retire_checks.explorer import PROFILES, run_profile
    from retire_checks.mutants import CORE_MUTANTS, SPEC_MUTANTS
    from retire_spec.invariants import INVARIANTS, QUIESCENCE

    settings = PROFILE_SETTINGS[args.profile]
    use_hyp = settings["hypothesis"] if args.hypothesis is None else args.hypothesis
    profile = PROFILES[args.profile]
    out = sys.stdout
    t0 = time.perf_counter()
    progress = not args.no_progress
    # The explorer first, over every worker; then the catalogue and Z3 share
    # the workers as tasks, longest first so that they finish together.
    result = run_profile(profile, progress=progress, jobs=args.jobs)
    speedup = None
    if args.speedup:
        # one worker after N, not before: the N-worker run must not inherit what this process
        # compiled for the one-worker run
        single = run_profile(profile, progress=progress, jobs=1)
        speedup = _speedup(result, single)
    tasks: list[tuple[str, Any, tuple[Any, ...]]] = []
    if not args.skip_mutants:
        names = [m.name for m in CORE_MUTANTS]
        for i in range(min(args.jobs, len(names))):
            tasks.append((f"mutants:core:{i}", _mutant_job, (names[i :: args.jobs], use_hyp)))
        tasks.append(("mutants:spec", _mutant_job, ([m.name for m in SPEC_MUTANTS], False)))
    tasks.append(("z3", _z3_job, (settings["bmc_depth"], settings["z3_timeout_ms"])))
    done = _run_tasks(tasks, args.jobs)

    print(result.summary(), file=out)
    if speedup is not None:
        print(
            f"  speed-up: {speedup['speedup']:.2f}x with {speedup['workers']} workers "
            f"({speedup['seconds']:.1f} s) against one ({speedup['seconds_one_worker']:.1f} s); "
            f"results {'identical' if speedup['identical'] else 'DIFFERENT'}",
            file=out,
        )
    cex = result.violation
    cex_path = None
    if cex is not None:
        print("\ncounterexample (shortest path, replayed through the core):", file=out)
        print(cex.steps(), file=out)
        cex_path = Path(args.counterexample)
        cex_path.write_text(cex.to_pytest(), encoding="utf-8")
        print(f"written as a pytest case: {cex_path}", file=out)
    z3_info = done["z3"]
    print("\n" + z3_info.get("summary", z3_info.get("error", "")), file=out)
    order = {m.name: i for i, m in enumerate(CORE_MUTANTS + SPEC_MUTANTS)}
    verdicts: list[dict[str, Any]] = sorted(
        (v for name, vs in done.items() if name.startswith("mutants:") for v in vs),
        key=lambda v: order[v["name"]],
    )
    print(f"\nmutants ({len(verdicts)}):", file=out)
    for v in verdicts:
        status = "killed  " if v["killed"] else "SURVIVED"
        print(
            f"  {status} {v['name']:<38} [{v['level']}] by {', '.join(v['killed_by']) or '-'}",
            file=out,
        )
    seconds = time.perf_counter() - t0

    z3_results = z3_info.get("results") or {inv.name: "unknown" for inv in INVARIANTS}
    invariants = result.invariants()
    killed = sum(1 for v in verdicts if v["killed"])
    report = {
        "profile": args.profile,
        "states": result.states,
        "transitions": result.transitions,
        "max_depth": result.max_depth,
        # the explorer's wall time (its configurations one after another, each over ``jobs``
        # workers) and distinct states per second of it
        "seconds": round(result.seconds, 2),
        "states_per_second": round(result.states_per_second, 1),
        "cpu_seconds": round(result.cpu_seconds, 2),
        "cpu_states_per_second": round(result.cpu_states_per_second, 1),
        "invariants": invariants,
        "refinement": result.refinement(),
        "probes": {p: result.probes[p] for p in result.profile.required_probes},
        "z3": z3_results,
        # the proofs are not vacuous: initial state and every guard with every hypothesis sat
        "vacuity": z3_info.get("vacuity") is True,
        "mutants": {v["name"]: v["killed_by"] for v in verdicts},
        "mutants_total": len(verdicts),
        "mutants_killed": killed,
        # the explorer's configurations, by name, in the order they are listed
        "configurations": [c.name for c in profile.configs],
        # command classes the engine's checks (``engine.obey``) met in this run: each one the
        # core emitted was carried out on the engine's books and checked there
        "commands_checked": [
            n for n in COMMANDS_CHECKED if result.probes[f"command:{n}"] and result.exhaustive
        ],
        # beyond the required keys
        "exhaustive": result.exhaustive,
        "missing_probes": list(result.missing_probes),
        "quiescence": {q.name: invariants[q.name] for q in QUIESCENCE},
        "configs": [
            {
                "name": r.config.name,
                "bounds": {
                    "scopes": r.config.bounds.scopes,
                    "parts": r.config.bounds.parts,
                    "frames": r.config.bounds.frames,
                    "pages": r.config.bounds.pages,
                    "positions": r.config.bounds.positions,
                    "max_epoch": r.config.bounds.max_epoch,
                    "contexts": [list(c) for c in r.config.bounds.contexts],
                    "fingerprints": list(r.config.bounds.fingerprints),
                },
                "ledger_size": r.config.ledger_size,
                "kv_windows": list(r.config.kv_windows),
                "page_groups": list(r.config.page_groups),
                "faults": r.config.budget.faults,
                "states": r.states,
                "transitions": r.transitions,
                "max_depth": r.max_depth,
                "quiescent_states": r.quiescent,
                "seconds": round(r.seconds, 2),
                "states_per_second": round(r.states_per_second, 1),
                "cpu_seconds": round(r.cpu_seconds, 2),
                "workers": r.workers,
                "exhaustive": r.exhaustive,
            }
            for r in result.results
        ],
        "counterexample": None
        if cex is None
        else {
            "config": cex.config.name,
            "error": cex.error,
            "moves": [str(m) for m in cex.moves],
            "pytest": str(cex_path),
        },
        "z3_bmc": {"depth": z3_info.get("bmc_depth"), "status": z3_info.get("bmc_status")},
        "z3_seconds": z3_info.get("seconds"),
        "z3_not_proved": z3_info.get("not_proved", z3_info.get("error")),
        "mutant_details": verdicts,
        "total_seconds": round(seconds, 2),
        "jobs": args.jobs,
        # the configurations ran side by side (one worker each), else one after another
        "side_by_side": result.wall is not None,
        "cpus": os.cpu_count(),
        # with --speedup: the explorer with one worker against ``jobs`` workers
        "speedup": speedup,
    }
    ok = (
        result.ok
        and all(invariants.values())
        and report["refinement"]
        and z3_info.get("all_proved") is True
        and z3_info.get("vacuity") is True
        and (args.skip_mutants or (killed == len(verdicts) and len(verdicts) >= 15))
        and (speedup is None or speedup["identical"])
    )
    print(
        f"\nretire check --profile {args.profile}: {'OK' if ok else 'FAILED'} — "
        f"{result.states:,} states ({result.states_per_second:,.0f}/s), "
        f"{len(result.profile.required_probes) - len(result.missing_probes)}/"
        f"{len(result.profile.required_probes)} probes, "
        f"z3 {sum(v == 'proved' for v in z3_results.values())}/{len(z3_results)} proved"
        f"{'' if z3_info.get('vacuity') is True else ' (VACUOUS or undecided)'}, "
        f"mutants {killed}/{len(verdicts)} killed, {seconds:.1f} s",
        file=out,
    )
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        print(f"report written to {args.json}", file=out)
    return 0 if ok else 1


def _configure_validate(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", metavar="FILE", help="a JSON-lines log of retire.transition events")


@command(
    "validate-trace",
    "check that a recorded retire.transition log is a behaviour of the spec",
    _configure_validate,
)
def validate_trace(args: argparse.Namespace) -> int:
    from retire_checks.trace_validation import TraceError, validate_file

    try:
        report = validate_file(args.file)
    except OSError as err:
        print(f"retire validate-trace: cannot read {args.file}: {err}", file=sys.stderr)
        return 2
    except TraceError as err:
        print(f"{args.file}:{err.line}: {err.message}")
        return 1
    print(
        f"{args.file}: valid — {report.transitions} transitions replayed against the spec "
        f"(universe {report.sizes}; placed {report.hidden['emit']} frame emits and "
        f"{report.hidden['corrupt']} byte corruptions the log does not show)"
    )
    return 0
