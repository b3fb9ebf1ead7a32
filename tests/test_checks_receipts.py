"""Coordinated closure (issue 17, item 3): duplicated receipts are refused by the core and the
harness accepts nothing else; a lost receipt keeps its version's pages and is reported by the
quiescence check; RECLAIM one receipt short is caught."""

from __future__ import annotations

from typing import Any

import attrs

import retire_core as rc
from retire_checks.abstraction import Universe
from retire_checks.environment import Budget, env_moves
from retire_checks.lockstep import Lockstep
from retire_checks.mutants import MUTANTS, judge
from retire_checks.parallel import explore
from retire_checks.profiles import QUICK
from retire_spec.actions import ActionInstance as A
from retire_spec.expr import Concrete
from retire_spec.invariants import INVARIANT_BY_NAME
from retire_spec.schema import NO_MATCH

CHAIN = next(c for c in QUICK.configs if c.name == "chain")


def test_the_quick_profile_delivers_receipts_again() -> None:
    assert CHAIN.budget.duplicate_receipts
    result = explore(CHAIN, jobs=1)
    assert result.violation is None
    assert result.probes["move:receipt_again"] > 0


def _accepting(silently: bool) -> Any:
    """A core that accepts a duplicated receipt (as a no-op, or with another typed error)."""

    def step(core: rc.CoreState, ev: Any) -> rc.Step:
        try:
            return rc.step(core, ev)
        except rc.DuplicateReceiptError:
            if silently:
                return rc.Step(core, (), ())
            raise rc.UnknownParticipantError("not the duplicate's error") from None

    return step


def test_a_core_accepting_a_duplicated_receipt_is_caught() -> None:
    for silently, words in (
        (True, "accepted the duplicated"),
        (False, "not DuplicateReceiptError"),
    ):
        result = explore(CHAIN, _accepting(silently), jobs=1)
        assert result.violation is not None
        assert words in result.violation.error
        assert result.violation.moves[-1].name == "receipt_again"


def test_duplicated_receipts_through_the_ledger_and_past_it() -> None:
    ls = Lockstep(Universe.of(CHAIN.bounds), ledger_size=1)
    budget = attrs.evolve(CHAIN.budget, duplicate_receipts=True)
    moves = [
        A("open", (0, (1,), True)),
        A("launch", (0, 0, 0)),
        A("receipt", (0,)),
        A("supersede", (0, (2,), True)),  # v0 drains: into the ledger
    ]
    for m in moves:
        ls.env(m)
    again = A("receipt_again", (0,))
    assert again in env_moves(ls, budget)
    before = ls.snapshot()
    assert ls.env(again).transitions == ()
    assert ls.snapshot()[:2] == before[:2]
    assert ls.core.ledger == (("s0", 0),) and "q0" not in ls.core.scopes["s0"].participants
    for m in (A("launch", (1, 0, 1)), A("receipt", (1,)), A("supersede", (0, (1,), True))):
        ls.env(m)
    # v1 drained too: v0 left the one-entry ledger; the core no longer knows participant 0
    assert ls.core.ledger == (("s0", 1),)
    assert ls.env(again).transitions == ()
    assert A("receipt_again", (0,)) not in env_moves(ls, Budget())  # off by default


def test_a_lost_receipt_holds_the_version_and_quiescence_reports_it() -> None:
    ls = Lockstep(Universe.of(CHAIN.bounds), ledger_size=1)
    for m in (
        A("open", (0, (1,), True)),
        A("launch", (0, 0, 0)),
        A("allocate", (0, 0, 0)),
        A("attempt_write", (0, 0, True)),
        A("supersede", (0, (2,), True)),
        A("close_writer", (0, NO_MATCH)),
    ):
        ls.env(m)
    # participant 0's receipt never arrives: its page stays allocated and referenced
    spec = ls.spec
    assert spec["page_alloc"][0] and spec["page_held"][0] and not spec["part_closed"][0]
    I = Concrete(CHAIN.bounds.sizes())
    assert INVARIANT_BY_NAME["coordinated_closure"].holds(I, spec)
    # once nothing else happens, the quiescence check names the missing receipt
    assert not INVARIANT_BY_NAME["obsolete_closed"].holds(I, spec)
    # and only the receipt frees the page
    ls.env(A("receipt", (0,)))
    assert not ls.spec["page_alloc"][0]
    assert INVARIANT_BY_NAME["obsolete_closed"].holds(I, ls.spec)


def test_reclaim_one_receipt_short_is_killed_by_the_explorer() -> None:
    verdict = judge(MUTANTS["freed_one_receipt_short"], use_z3=False)
    assert verdict.killed_by == ("explorer",)
    assert "unhold" in verdict.detail["explorer"]
