"""Issue 18's core fuzzer (``retire_checks.event_fuzz``): over 100,000 plausible and mutated
events in traces shaped like an engine's, every refused event raises a ``RetireError`` and
changes nothing; three mutants of the core that break this are caught."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any
from unittest import mock

import hypothesis.strategies as st
import pytest
from hypothesis import Phase, given, settings

import retire_core as rc
from retire_checks.engine import COMMANDS_CHECKED
from retire_checks.event_fuzz import FAMILIES, FuzzFailure, Plan, Tally, run_trace
from retire_checks.mutants_core import _handler
from retire_core import handlers
from retire_core.events import PAGE_EVENTS, SCOPE_EVENTS
from retire_core.state import evolve

EXAMPLES = 60
LENGTH = 2000

plans = st.builds(
    Plan,
    seed=st.integers(0, 2**32 - 1),
    length=st.just(LENGTH),
    scopes=st.integers(1, 4),
    pages=st.integers(2, 24),
    mutate=st.sampled_from((0.05, 0.2, 0.35, 0.6)),
    batch=st.sampled_from((0.0, 0.05, 0.15, 0.3)),
    logged=st.booleans(),
    ledger=st.sampled_from((1, 2, 8, 1024)),
    families=st.frozensets(st.sampled_from(FAMILIES), min_size=1) | st.just(frozenset(FAMILIES)),
)


def test_a_hundred_thousand_hostile_events_are_refused_cleanly() -> None:
    tally = Tally()

    @settings(
        max_examples=EXAMPLES,
        derandomize=True,
        deadline=None,
        database=None,
        phases=(Phase.explicit, Phase.generate),  # a failure names its plan; no shrinking
    )
    @given(plan=plans)
    def fuzz(plan: Plan) -> None:
        run_trace(plan, tally)

    fuzz()
    assert tally.traces == EXAMPLES
    assert tally.events >= 100_000, tally.events
    # Deep enough: every event type was accepted, every kind of refusal and command was met.
    assert set(tally.accepted_types) == {cls.__name__ for cls in (*SCOPE_EVENTS, *PAGE_EVENTS)}
    refused = {name for name in tally.refused if not name.startswith("build:")}
    assert refused >= {
        e.__name__
        for e in (
            rc.UnknownScopeError,
            rc.ScopeExistsError,
            rc.FutureVersionError,
            rc.ScopeCancelledError,
            rc.IllegalTransitionError,
            rc.DuplicateReceiptError,
            rc.UnknownParticipantError,
            rc.DuplicateParticipantError,
            rc.UnknownPageError,
            rc.PageInUseError,
            rc.DoubleFreeError,
            rc.ReportMismatchError,
        )
    }
    assert {"build:MalformedIdError", "build:TypeError", "build:ContractError"} <= set(
        tally.refused
    )
    assert set(tally.commands) >= set(COMMANDS_CHECKED)
    assert tally.refused_batches > 0 and tally.batches > tally.refused_batches


# --- mutants: the fuzzer must catch each ----------------------------------------------------


def _receipt_leaking_key_error(txn: Any, ev: Any) -> None:
    try:
        handlers.on_receipt(txn, ev)
    except rc.RetireError as err:
        raise KeyError(ev.participant) from err  # a lookup that escapes untyped


def _frame_dirtying_state(txn: Any, ev: Any) -> None:
    try:
        handlers.on_frame(txn, ev)
    except rc.RetireError:
        scopes = txn.state.scopes  # the caller's state, changed in place before refusing
        if ev.scope in scopes:
            scopes._d[ev.scope] = evolve(scopes[ev.scope], admitted=not scopes[ev.scope].admitted)
        raise


def _batch_one_by_one(self: rc.Retire, events: Any) -> list[rc.Command]:
    commands: list[rc.Command] = []
    for event in events:  # commits the events before a bad one
        commands += self.handle(event)
    return commands


MUTANTS: dict[str, tuple[Any, str]] = {
    "untyped_error": (
        _handler(rc.Receipt, _receipt_leaking_key_error),
        "untyped KeyError",
    ),
    "dirty_refusal": (
        _handler(rc.FrameArrived, _frame_dirtying_state),
        "changed the state in place",
    ),
    "partial_batch": (
        lambda: mock.patch.object(rc.Retire, "handle_batch", _batch_one_by_one),
        "a refused event",  # changed the state, or left its prefix's transitions
    ),
}
MUTANT_PLANS = [Plan(seed=seed, length=400, batch=0.15) for seed in range(10)]


def _failures(plans: list[Plan]) -> Iterator[FuzzFailure]:
    for plan in plans:
        try:
            run_trace(plan)
        except FuzzFailure as failure:
            yield failure


def test_the_mutant_plans_pass_on_the_real_core() -> None:
    assert list(_failures(MUTANT_PLANS)) == []


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_the_fuzzer_catches_the_mutant(name: str) -> None:
    patch, message = MUTANTS[name]
    context: AbstractContextManager[Any] = patch()
    with context:
        failure = next(_failures(MUTANT_PLANS), None)
    assert failure is not None, f"mutant {name} survived"
    assert message in str(failure)
