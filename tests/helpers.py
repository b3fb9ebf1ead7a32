"""Shared builders for the tests: a small world and scripted paths into each scope state (core),
and a short run recorded through ``CoreTimer`` (benchmarks)."""

from __future__ import annotations

import random
from typing import Any

import pytest

import retire_core as rc
from retire_checks.abstraction import Universe
from retire_checks.lockstep import Lockstep
from retire_spec.actions import ActionInstance as A
from retire_spec.schema import COLUMNS, NO_MATCH, Bounds, Kind, SpecState

BOUNDS = Bounds(
    scopes=2,
    parts=4,
    frames=4,
    pages=4,
    positions=2,
    max_epoch=4,
    contexts=((1, 2), (1, 3), (4, 5)),
    fingerprints=(0, 1),
)
UNI = Universe.of(BOUNDS)

# Scripted paths (spec moves for the environment) that leave scope s0 in each state.
PATHS: dict[str, tuple[A, ...]] = {
    "unopened": (),
    "active": (A("open", (0, (1, 2), True)), A("launch", (0, 0, 0))),
    "aligning": (
        A("open", (0, (1, 2), True)),
        A("launch", (0, 0, 0)),
        A("allocate", (0, 0, 0)),
        A("attempt_write", (0, 0, True)),
        A("close_writer", (0, NO_MATCH)),
        A("supersede", (0, (1, 3), True)),
    ),
    "paused": (A("open", (0, (1, 2), True)), A("launch", (0, 0, 0)), A("pause", (0,))),
    "cancelled": (A("open", (0, (1, 2), True)), A("launch", (0, 0, 0)), A("cancel", (0,))),
    "finished": (
        A("open", (0, (1, 2), True)),
        A("launch", (0, 0, 0)),
        A("allocate", (0, 0, 0)),
        A("attempt_write", (0, 0, True)),
        A("close_writer", (0, NO_MATCH)),
        A("emit", (0, 0, 0)),  # a frame still in flight when the version finishes
        A("receipt", (0,)),
        A("finish", (0, 0)),
    ),
}


def lockstep_at(state: str) -> Lockstep:
    ls = Lockstep(UNI)
    for move in PATHS[state]:
        ls.env(move)
    return ls


def arbitrary_spec_state(rng: random.Random, b: Bounds, ints: range) -> SpecState:
    """A spec state no run need reach: every cell random within its kind, integer cells drawn
    from ``ints`` (which may leave a column's range, to exercise reads outside it)."""
    sizes = b.sizes()
    cells: list[Any] = []
    for col in COLUMNS:
        n = sizes[col.sort]
        if col.kind is Kind.BOOL:
            cells.append(tuple(rng.random() < 0.5 for _ in range(n)))
        elif col.kind is Kind.SCOPE:
            cells.append(tuple(rng.randrange(b.scopes) for _ in range(n)))
        elif col.kind is Kind.CTX:
            cells.append(tuple(rng.choice(b.contexts) for _ in range(n)))
        else:
            cells.append(tuple(rng.choice(ints) for _ in range(n)))
    return SpecState(tuple(cells))


def recorded_core_run() -> Any:
    """A fake system holding a real core, driven through ``CoreTimer(record=True)``: a scope
    submitted and started outside steps, then pages and frames handled inside steps, one by one
    and in batches, with a fake clock that advances 1 per read (so 1 per timed call). Returns
    the ``retire_bench.systems.CoreTimer``."""
    import retire_core as rc
    from retire_bench.systems import CoreTimer, quiet_logger

    now = [0.0]

    def clock() -> float:
        now[0] += 1.0  # a timed call reads it twice: 1 per call
        return now[0]

    class System:
        def __init__(self) -> None:
            self.retire = rc.Retire(logger=quiet_logger())

    system = System()
    timer = CoreTimer(system, clock, record=True)
    core = system.retire
    core.handle(rc.Submit("s", "t", "fp", ("a", "b")))
    core.handle(rc.ParticipantStarted("s", 0, "q"))
    timer.stepping(True)
    core.handle_batch(
        [rc.PageAllocated("s", 0, "q", 1, 0), rc.WriteAttempted("s", 0, "q", 1, True)]
    )
    core.handle(rc.WriterClosed(1, "d1"))
    core.handle_batch([rc.FrameArrived("s", 0, 7, rc.FrameKind.COMMIT)])
    with pytest.raises(rc.RetireError):  # a refused call changes nothing and is not replayed
        core.handle(rc.FrameArrived("s", 5, 8, rc.FrameKind.TOKEN))
    timer.stepping(False)
    core.handle(rc.Cancel("s"))
    return timer


def one_written_page(*, completes: bool, closed: bool) -> rc.Retire:
    """A core with scope ``s`` (context ``(1, 2)``) at version 0, participant ``a`` running, and
    page 7 at position 0 written (filled or not), its writer closed with digest ``d7`` or open."""
    core = rc.Retire()
    core.handle(rc.Submit("s", "t", "f", (1, 2)))
    core.handle(rc.ParticipantStarted("s", 0, "a"))
    core.handle(rc.PageAllocated("s", 0, "a", 7, 0))
    core.handle(rc.WriteAttempted("s", 0, "a", 7, completes))
    if closed:
        core.handle(rc.WriterClosed(7, "d7"))
    return core
