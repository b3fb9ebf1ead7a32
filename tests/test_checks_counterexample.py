"""A replayed counterexample: the explorer's shortest path to the ``digest_ignored`` mutant's
violation, kept as data. Replayed through the mutated core it reproduces the violation (a page
whose bytes changed after certification is adopted); replayed through the real core the byte
check releases the page and the successor recomputes it."""

from __future__ import annotations

import pytest

from retire_checks.explorer import replay
from retire_checks.lockstep import RefinementError
from retire_checks.mutant_kind import CONFIGS
from retire_checks.mutants import MUTANTS
from retire_spec.actions import ActionInstance as A
from retire_spec.schema import NO_MATCH

CONFIG = CONFIGS["chain"]
MOVES = (
    A("open", (0, (1,), True)),
    A("launch", (0, 0, 0)),
    A("allocate", (0, 0, 0)),
    A("supersede", (0, (1,), True)),  # e -> e+1 sharing block 0: the successor waits for it
    A("attempt_write", (0, 0, True)),  # the retired version completes its own block
    A("receipt", (0,)),
    # ALIGN certifies and pins block 0; RECLAIM drops the reference
    A("close_writer", (0, NO_MATCH)),
    A("corrupt", (0,)),  # fault: same block id, same counts, different bytes
    A("report", (0,)),  # the engine's byte check reports the changed digest
)


def test_replay_reproduces_the_violation_in_the_mutant() -> None:
    with MUTANTS["digest_ignored"].active(), pytest.raises(RefinementError, match="adopt"):
        replay(CONFIG, MOVES)


def test_replay_is_clean_on_the_real_core() -> None:
    ls = replay(CONFIG, MOVES, check_quiescence=False)
    assert "release(0, 0)" in " ".join(ls.trace)  # the page was released, not adopted
    assert ls.core.scopes["s0"].admitted


def test_the_explorer_finds_this_very_path() -> None:
    from retire_checks.explorer import explore

    with MUTANTS["digest_ignored"].active():
        cex = explore(CONFIG).violation
    assert cex is not None
    assert cex.moves == MOVES  # breadth-first: a shortest path, deterministic
