"""The scripted scenario: a revision chain driven through the real core, checked against the spec.

Two scopes of two tenants share an engine. Scope ``s0`` runs, is revised while its tokens are
still queued (e → e+1), revised again before its successor was admitted (e+1 → e+2: chain
collapse), inherits the certified common prefix of its first version, and suffers a page-content
fault that the digest check catches. Scope ``s1`` of the other tenant is paused, resumed and
cancelled on the side. Every step goes through ``Lockstep``: the core's transitions are replayed
on the spec, refinement and every invariant are checked after each step, and the transition log
is printed as the structured lines the core emits.
"""

from __future__ import annotations

import sys
from typing import TextIO

import structlog

from retire_checks.abstraction import Universe
from retire_checks.lockstep import Lockstep, RefinementError
from retire_spec.actions import ActionInstance as A
from retire_spec.invariants import INVARIANTS, QUIESCENCE
from retire_spec.schema import NO_MATCH, Bounds

BOUNDS = Bounds(
    scopes=2,
    parts=4,
    frames=4,
    pages=5,
    positions=3,
    max_epoch=3,
    contexts=((11, 12, 13), (11, 12, 23), (11, 32, 33), (41, 42, 43)),
    fingerprints=(0, 1),
)

SCRIPT: tuple[tuple[str, A], ...] = (
    ("s0 opens with context X (3 blocks)", A("open", (0, (11, 12, 13), True))),
    ("s1 of another tenant opens", A("open", (1, (41, 42, 43), True))),
    ("s0@0 starts a request", A("launch", (0, 0, 0))),
    ("s1@0 starts a request", A("launch", (1, 1, 0))),
    ("s0@0 fills block 0", A("allocate", (0, 0, 0))),
    ("", A("attempt_write", (0, 0, True))),
    ("", A("close_writer", (0, NO_MATCH))),
    ("s0@0 fills block 1", A("allocate", (1, 0, 1))),
    ("", A("attempt_write", (1, 0, True))),
    ("", A("close_writer", (1, NO_MATCH))),
    ("s0@0 starts block 2 (still open)", A("allocate", (2, 0, 2))),
    ("s0@0 emits a token frame (queued)", A("emit", (0, 0, 0))),
    ("s0@0 emits a commit frame (queued)", A("emit", (1, 0, 1))),
    ("s1@0 allocates and completes a page", A("allocate", (3, 1, 0))),
    ("", A("attempt_write", (3, 1, True))),
    ("", A("close_writer", (3, NO_MATCH))),
    ("s1 is paused: it keeps authority", A("pause", (1,))),
    ("s1@0 emits a token while paused", A("emit", (2, 1, 0))),
    ("", A("deliver", (2,))),
    ("REVISION s0: e -> e+1 with X' sharing 2 blocks", A("supersede", (0, (11, 12, 23), True))),
    ("queued s0@0 token arrives late: dropped", A("deliver", (0,))),
    ("queued s0@0 commit arrives late: dropped", A("deliver", (1,))),
    (
        "REVISION s0 again before e+1 was admitted: chain collapse",
        A("supersede", (0, (11, 12, 33), True)),
    ),
    ("retired s0@0 tries to write s1's page: fenced", A("attempt_write", (3, 0, True))),
    ("retired s0@0 finishes block 2 (its own page)", A("attempt_write", (2, 0, True))),
    ("", A("close_writer", (2, NO_MATCH))),
    ("s0@0 delivers its receipt", A("receipt", (0,))),
    ("fault: block 1's bytes change (same id, same counts)", A("corrupt", (1,))),
    ("the engine reports the certified pages' bytes", A("report", (0,))),
    ("s0@2 runs on the adopted prefix", A("launch", (2, 0, 2))),
    ("", A("emit", (3, 2, 0))),
    ("", A("deliver", (3,))),
    ("s1 resumes and is cancelled", A("unpause", (1,))),
    ("", A("cancel", (1,))),
    ("s1@0 delivers its receipt", A("receipt", (1,))),
    ("s0@2 finishes", A("receipt", (2,))),
)


def run(out: TextIO = sys.stdout) -> int:
    uni = Universe.of(BOUNDS)
    ls = Lockstep(uni)
    log = structlog.wrap_logger(
        structlog.PrintLogger(out),
        processors=[
            structlog.processors.KeyValueRenderer(key_order=["transition", "scope", "version"])
        ],
    )
    print(
        "Retire scripted scenario: the real core, checked step by step against the spec\n", file=out
    )
    try:
        for note, move in SCRIPT:
            if note:
                print(f"\n# {note}", file=out)
            outcome = ls.report(move.args[0]) if move.name == "report" else ls.env(move)
            if outcome is None:
                continue
            for t in outcome.transitions:
                log.info("retire.transition", **t.as_log())
            for c in outcome.commands:
                print(f"    -> {c!r}", file=out)
    except RefinementError as err:
        print(f"\nFAILED: {err}", file=out)
        return 1
    print("\nInvariants (checked after every step):", file=out)
    for inv in INVARIANTS:
        print(f"  [ok] {inv.name}: {inv.text}", file=out)
    print("Quiescence (checked at the end):", file=out)
    failed = 0
    for inv in QUIESCENCE:
        ok = bool(inv.holds(ls.I, ls.spec))
        failed += not ok
        print(f"  [{'ok' if ok else 'FAIL'}] {inv.name}: {inv.text}", file=out)
    print(f"\nrefinement: every core step was a spec step ({len(SCRIPT)} moves)", file=out)
    return 1 if failed else 0
