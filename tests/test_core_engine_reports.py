"""The core's answers to what the engine reports about pages and participants, and what it logs:
a recycled or evicted page that is still referenced is refused (and nothing changes), reports
about untracked pages name the event, a participant named with the wrong version or after it
closed is refused with its own error, ``Forget`` waits for the scope's last page, every logged
field of every transition of one scope's life (``LOGGED``), the table violation's names, and a
batch bounding a hand-built over-long ledger between events as single steps do. Mutation testing
(``make mutation`` over ``handlers``, ``machine`` and ``txn``) found these unchecked."""

from __future__ import annotations

from typing import Any

import pytest

import retire_core as rc
from retire_core import machine
from retire_core.state import CoreState, ScopeState
from tests.helpers import one_written_page


def _transitions(core: rc.Retire) -> list[tuple[str, str, int, dict[str, Any]]]:
    return [(t.action, t.scope, t.version, dict(t.changed)) for t in core.last_transitions]


def _written(core: rc.Retire) -> rc.Retire:
    """Scope ``s`` at version 0, participant ``a``: page 7 full and writer-closed, page 8
    partial with its writer open; both still referenced by the running request."""
    core.handle(rc.Submit("s", "t", "f", (1, 2, 3)))
    core.handle(rc.ParticipantStarted("s", 0, "a"))
    core.handle(rc.PageAllocated("s", 0, "a", 7, 0))
    core.handle(rc.WriteAttempted("s", 0, "a", 7, True))
    core.handle(rc.WriterClosed(7, "d7"))
    core.handle(rc.PageAllocated("s", 0, "a", 8, 1))
    core.handle(rc.WriteAttempted("s", 0, "a", 8, False))
    return core


@pytest.mark.parametrize("event", [rc.PageReused(7), rc.PageEvicted(7)])
def test_a_referenced_page_is_neither_recycled_nor_evicted(event: Any) -> None:
    core = _written(rc.Retire())
    before = core.state
    assert before.pages[7].held and not before.pages[7].writer_open and before.pages[7].full
    with pytest.raises(rc.PageInUseError, match="page 7"):
        core.handle(event)
    assert core.state is before


def test_a_page_given_back_to_the_cache_is_recycled_and_evicted_with_its_owner_logged() -> None:
    core = _written(rc.Retire())
    core.handle(rc.WriterClosed(8, "d8"))
    core.handle(rc.Receipt("s", 0, "a"))
    assert core.handle(rc.VersionFinished("s", 0)) == [rc.Free((8,)), rc.ReleaseToCache((7,))]
    assert not core.state.pages[7].held
    assert core.handle(rc.PageReused(7)) == []
    assert _transitions(core) == [("reuse_id", "s", 0, {"generation": 2})]
    assert core.state.pages[7].generation == 2 and core.state.generations[7] == 2
    assert core.handle(rc.PageEvicted(7)) == []
    assert _transitions(core) == [("evict", "s", 0, {})]
    assert 7 not in core.state.pages and core.state.generations[7] == 2


@pytest.mark.parametrize("cls", [rc.PageReused, rc.PageEvicted])
def test_reports_about_untracked_pages_name_the_event(cls: Any) -> None:
    core = _written(rc.Retire())
    core.handle(rc.WriterClosed(8, "d8"))
    core.handle(rc.Receipt("s", 0, "a"))
    core.handle(rc.VersionFinished("s", 0))  # page 8 (partial) is freed
    with pytest.raises(rc.UnknownPageError) as never:
        core.handle(cls(10))
    assert f"{cls.__name__} for page 10, which was never allocated" in str(never.value)
    with pytest.raises(rc.DoubleFreeError) as freed:
        core.handle(cls(8))
    assert str(freed.value) == f"{cls.__name__} for page 8, which was already freed"


def test_forget_waits_for_the_last_page_of_the_scope() -> None:
    core = _written(rc.Retire())
    core.handle(rc.Cancel("s"))
    core.handle(rc.Receipt("s", 0, "a"))  # page 8's writer is still open: it stays
    assert list(core.state.pages) == [8]
    before = core.state
    with pytest.raises(rc.IllegalTransitionError) as err:
        core.handle(rc.Forget("s"))
    assert "still has 0 participants running and 1 pages" in str(err.value)
    assert core.state is before
    core.handle(rc.WriterClosed(8, "d8"))  # the last page goes
    assert not core.state.pages
    core.handle(rc.Forget("s"))
    assert _transitions(core) == [("forget", "s", 0, {"state": None})]
    assert "s" not in core.state.scopes


def test_unpause_logs_the_state_it_moves_to() -> None:
    core = rc.Retire()
    core.handle(rc.Submit("s", "t", "f", (1,)))
    core.handle(rc.Pause("s"))
    core.handle(rc.Unpause("s"))
    assert _transitions(core) == [("unpause", "s", 0, {"state": ScopeState.ACTIVE})]


def test_a_participant_named_with_another_version_is_unknown_and_changes_nothing() -> None:
    core = rc.Retire()
    core.handle(rc.Submit("s", "t", "f", (1, 2)))
    core.handle(rc.ParticipantStarted("s", 0, "a"))
    core.handle(rc.Supersede("s", (3, 4)))  # version 1, admitted cold; "a" is version 0's
    before = core.state
    for event in (rc.PageAllocated("s", 1, "a", 7, 0), rc.WriteAttempted("s", 1, "a", 7)):
        with pytest.raises(rc.UnknownParticipantError) as err:
            core.handle(event)
        assert err.value.args[0] == f"{type(event).__name__}: 'a' is not a participant of s@1"
        assert core.state is before


def test_a_closed_participant_cannot_allocate_or_write() -> None:
    core = rc.Retire()
    core.handle(rc.Submit("s", "t", "f", (1, 2)))
    core.handle(rc.ParticipantStarted("s", 0, "a"))
    core.handle(rc.Receipt("s", 0, "a"))
    before = core.state
    for event in (rc.PageAllocated("s", 0, "a", 7, 0), rc.WriteAttempted("s", 0, "a", 7)):
        with pytest.raises(rc.IllegalTransitionError) as err:
            core.handle(event)
        assert (err.value.state, err.value.event) == ("closed", type(event).__name__)
        assert "participant 'a' of s@0 has already closed" in str(err.value)
        assert core.state is before


def test_a_table_violation_names_a_missing_scope_as_none_and_forgotten() -> None:
    err = machine._violation(None, rc.Submit, None, (ScopeState.ACTIVE, None))
    assert (err.state, err.event, err.after) == ("none", "Submit", "forgotten")
    assert (
        str(err)
        == "Submit in state none left the scope forgotten; the table allows active | forgotten"
    )


def test_a_batch_bounds_a_hand_built_over_long_ledger_between_events_as_steps_do() -> None:
    core = rc.Retire()
    core.handle(rc.Submit("s", "t", "f", (1,)))
    core.handle(rc.Supersede("s", (2,)))
    core.handle(rc.Supersede("s", (3,)))  # s is at version 2; versions 0 and 1 never ran
    ledger = (("s", 0), ("o", 0), ("o", 1))  # s@0 is the oldest entry
    state = CoreState(core.state.scopes, ledger=ledger, ledger_size=2)
    events = [rc.Pause("s"), rc.FrameArrived("s", 0, 1, rc.FrameKind.TOKEN)]
    one_by_one = rc.Retire(state=state)
    singles = [c for e in events for c in one_by_one.handle(e)]
    batched = rc.Retire(state=state)
    assert batched.handle_batch(events) == singles
    assert list(machine.step_many(state, events).commands) == singles  # (the counted path)
    # the first event's step bounded the ledger: s@0 is older than it remembers
    assert singles[-1] == rc.Drop(1, "s", 0, rc.FrameKind.TOKEN, "retired_expired")
    assert batched.state.ledger == one_by_one.state.ledger == (("o", 0), ("o", 1))


def _with_reasons(core: rc.Retire) -> list[tuple[str, int, dict[str, Any], str | None]]:
    return [(t.action, t.version, dict(t.changed), t.reason) for t in core.last_transitions]


def test_a_preempted_version_gives_its_pages_back_and_runs_again_as_new_participants() -> None:
    """``VersionPreempted``: refused (nothing changed) while a participant runs or a writer is
    open; then every page of the version is freed, the scope keeps its state and authority, a
    new participant starts and allocates; a report for a retired version is ``late_preempt``."""
    core = _written(rc.Retire())
    for closing in (None, rc.Receipt("s", 0, "a")):
        if closing is not None:
            core.handle(closing)
        before = core.state
        with pytest.raises(rc.IllegalTransitionError):
            core.handle(rc.VersionPreempted("s", 0))  # "a" runs; then page 8's writer is open
        assert core.state is before
    core.handle(rc.WriterClosed(8, "d8"))
    commands = core.handle(rc.VersionPreempted("s", 0))
    assert commands == [rc.Free((7, 8))]
    assert _with_reasons(core)[0] == ("preempt", 0, {}, None)
    assert core.state.scopes["s"].state is ScopeState.ACTIVE and not core.state.pages
    assert core.handle(rc.ParticipantStarted("s", 0, "a#1")) == []
    core.handle(rc.PageAllocated("s", 0, "a#1", 7, 0))
    assert core.handle(rc.WriteAttempted("s", 0, "a#1", 7, True)) == [rc.AllowWrite(7, "a#1")]
    assert core.handle(rc.FrameArrived("s", 0, 0, rc.FrameKind.TOKEN))[0] == rc.Publish(
        0, "s", 0, rc.FrameKind.TOKEN
    )
    core.handle(rc.Supersede("s", (1, 2)))
    core.handle(rc.VersionPreempted("s", 0))  # superseded, "a#1" still running
    assert _with_reasons(core) == [("late_preempt", 0, {}, "retired_draining")]
    fresh = rc.Retire()
    fresh.handle(rc.Submit("n", "t", "f", (1,)))
    with pytest.raises(rc.IllegalTransitionError):  # no participant ever started
        fresh.handle(rc.VersionPreempted("n", 0))


def test_pause_finish_and_late_finishes_log_what_they_changed_and_why() -> None:
    core = rc.Retire()
    core.handle(rc.Submit("s", "t", "f", (1,)))
    core.handle(rc.Pause("s"))
    assert _with_reasons(core) == [("pause", 0, {"state": ScopeState.PAUSED}, None)]
    core.handle(rc.Unpause("s"))
    core.handle(rc.VersionFinished("s", 0))
    assert _with_reasons(core) == [("finish", 0, {"state": ScopeState.FINISHED}, None)]
    core.handle(rc.VersionFinished("s", 0))  # repeated: late
    assert _with_reasons(core) == [("late_finish", 0, {}, "version_finished")]
    core.handle(rc.Submit("r", "t", "f", (1,)))
    core.handle(rc.ParticipantStarted("r", 0, "a"))
    core.handle(rc.Supersede("r", (2,)))
    core.handle(rc.VersionFinished("r", 0))  # superseded, "a" still running
    assert _with_reasons(core) == [("late_finish", 0, {}, "retired_draining")]
    before = core.state
    with pytest.raises(rc.FutureVersionError) as err:
        core.handle(rc.VersionFinished("r", 3))
    assert str(err.value) == "VersionFinished for r@3, but the current version is 1"
    assert core.state is before


def _aligning() -> rc.Retire:
    """Scope ``s``: version 0 wrote and closed page 7 (key 1) and drained; version 1 (context
    ``(1, 9)``) has page 7 certified and pinned and waits for its byte check (ALIGNING)."""
    core = rc.Retire()
    core.handle(rc.Submit("s", "t", "f", (1, 2)))
    core.handle(rc.ParticipantStarted("s", 0, "a"))
    core.handle(rc.PageAllocated("s", 0, "a", 7, 0))
    core.handle(rc.WriteAttempted("s", 0, "a", 7, True))
    core.handle(rc.WriterClosed(7, "d7"))
    core.handle(rc.Supersede("s", (1, 9)))
    core.handle(rc.Receipt("s", 0, "a"))
    assert core.scope("s").state is ScopeState.ALIGNING and core.state.pages[7].pinned
    return core


def test_a_cancel_while_aligning_unpins_as_cancelled_and_logs_what_it_changed() -> None:
    core = _aligning()
    assert core.handle(rc.Cancel("s")) == [
        rc.Unpin((7,), rc.UnpinReason.CANCELLED),
        rc.Free((7,)),
    ]
    assert _with_reasons(core)[0] == (
        "cancel",
        1,
        {"state": ScopeState.CANCELLED, "admitted": False},
        None,
    )


def test_late_frames_and_reports_of_a_cancelled_scope_say_so() -> None:
    core = _aligning()
    core.handle(rc.Cancel("s"))
    # an older version's frame: the scope's cancellation is the reason, not the version's age
    assert core.handle(rc.FrameArrived("s", 0, 5, rc.FrameKind.TOKEN)) == [
        rc.Drop(5, "s", 0, rc.FrameKind.TOKEN, rc.DropReason.SCOPE_CANCELLED)
    ]
    assert core.handle(rc.AdoptionReport("s", 1, (rc.PageDigest(7, "d7"),))) == []
    assert [(t.action, t.scope, t.version, t.reason) for t in core.last_transitions] == [
        ("late_report", "s", 1, "scope_cancelled")
    ]


@pytest.mark.parametrize(
    "event",
    [
        rc.Receipt("s", 4, "a"),
        rc.FrameArrived("s", 4, 1, rc.FrameKind.TOKEN),
        rc.AdoptionReport("s", 4, ()),
        rc.VersionFinished("s", 4),
        rc.WriteAttempted("s", 4, "a", 7),
        rc.PageAllocated("s", 4, "a", 7, 0),
        rc.ParticipantStarted("s", 4, "z"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_a_report_about_a_future_version_names_the_event_scope_and_version(event: Any) -> None:
    core = _aligning()
    before = core.state
    with pytest.raises(rc.FutureVersionError) as err:
        core.handle(event)
    assert str(err.value) == f"{type(event).__name__} for s@4, but the current version is 1"
    assert core.state is before


def test_a_receipt_is_logged_with_its_version_and_participant() -> None:
    core = rc.Retire()
    core.handle(rc.Submit("s", "t", "f", (1,)))
    core.handle(rc.ParticipantStarted("s", 0, "a"))
    core.handle(rc.Supersede("s", (2,)))
    core.handle(rc.Receipt("s", 0, "a"))
    receipt = core.last_transitions[0]
    assert (receipt.action, receipt.scope, receipt.version) == ("receipt", "s", 0)
    assert dict(receipt.changed) == {"closed": True} and dict(receipt.args) == {"participant": "a"}


#: Every transition of one scope's life, with every logged field (``retire.transition`` lines:
#: what trace validation and an operator read), event by event.
A, L, P, F, C = (
    ScopeState.ACTIVE,
    ScopeState.ALIGNING,
    ScopeState.PAUSED,
    ScopeState.FINISHED,
    ScopeState.CANCELLED,
)
TOKEN = rc.FrameKind.TOKEN
LIFE = [
    rc.Submit("s", "t", "f", (1, 2)),
    rc.ParticipantStarted("s", 0, "a"),
    rc.PageAllocated("s", 0, "a", 7, 0),
    rc.WriteAttempted("s", 0, "a", 7, True),
    rc.WriterClosed(7, "d7"),
    rc.PageAllocated("s", 0, "a", 8, 1),
    rc.WriteAttempted("s", 0, "a", 8, False),
    rc.Supersede("s", (1, 9)),
    rc.WriterClosed(8, "d8"),
    rc.Receipt("s", 0, "a"),
    rc.AdoptionReport("s", 1, (rc.PageDigest(7, "d7"),)),
    rc.ParticipantStarted("s", 1, "b"),
    rc.FrameArrived("s", 1, 1, TOKEN),
    rc.FrameArrived("s", 0, 2, TOKEN),
    rc.Pause("s"),
    rc.Unpause("s"),
    rc.Receipt("s", 1, "b"),
    rc.VersionFinished("s", 1),
    rc.PageReused(7),
    rc.PageEvicted(7),
    rc.Cancel("s"),
    rc.Forget("s"),
]
LOGGED = [
    (
        "open",
        "s",
        0,
        {"tenant": "t", "fingerprint": "f", "context": (1, 2), "reuse": True},
        {"state": A, "admitted": True},
        None,
    ),
    ("launch", "s", 0, {"participant": "a"}, {}, None),
    (
        "allocate",
        "s",
        0,
        {"page": 7, "participant": "a", "position": 0, "inheritable": True},
        {"generation": 1},
        None,
    ),
    ("write", "s", 0, {"page": 7, "participant": "a", "completes": True}, {"full": True}, None),
    (
        "close_writer",
        "s",
        0,
        {"page": 7, "full": True, "digest": "d7"},
        {"writer_open": False},
        None,
    ),
    (
        "allocate",
        "s",
        0,
        {"page": 8, "participant": "a", "position": 1, "inheritable": True},
        {"generation": 1},
        None,
    ),
    ("write", "s", 0, {"page": 8, "participant": "a", "completes": False}, {"full": False}, None),
    (
        "supersede",
        "s",
        1,
        {"previous": 0, "context": (1, 9), "reuse": True},
        {"epoch": 1, "state": L, "admitted": False},
        None,
    ),
    ("fence", "s", 0, {"participants": ("a",)}, {}, None),
    (
        "certify",
        "s",
        1,
        {"page": 7, "position": 0, "generation": 1, "digest": "d7"},
        {"pinned": True},
        None,
    ),
    (
        "close_writer",
        "s",
        0,
        {"page": 8, "full": False, "digest": "d8"},
        {"writer_open": False},
        None,
    ),
    ("receipt", "s", 0, {"participant": "a"}, {"closed": True}, None),
    ("unhold", "s", 0, {"pages": (7, 8)}, {"held": False}, None),  # one transition, two pages
    ("free", "s", 0, {"page": 8}, {}, None),
    (
        "adopt",
        "s",
        1,
        {"page": 7, "position": 0, "digest": "d7"},
        {"version": 1, "held": True, "pinned": False},
        None,
    ),
    ("resume", "s", 1, {"adopted_blocks": 1, "cold": False}, {"state": A, "admitted": True}, None),
    ("launch", "s", 1, {"participant": "b"}, {}, None),
    ("publish", "s", 1, {"frame": 1, "kind": TOKEN}, {}, None),
    ("drop", "s", 0, {"frame": 2, "kind": TOKEN}, {}, rc.DropReason.RETIRED_DRAINED),
    ("pause", "s", 1, {}, {"state": P}, None),
    ("unpause", "s", 1, {}, {"state": A}, None),
    ("receipt", "s", 1, {"participant": "b"}, {"closed": True}, None),
    ("finish", "s", 1, {}, {"state": F}, None),
    ("unhold", "s", 1, {"page": 7}, {"held": False}, None),
    ("reuse_id", "s", 1, {"page": 7}, {"generation": 2}, None),
    ("evict", "s", 1, {"page": 7}, {}, None),
    ("cancel", "s", 1, {}, {"state": C, "admitted": False}, None),
    ("forget", "s", 1, {}, {"state": None}, None),
]


#: The commands each event of ``LIFE`` returns.
COMMANDS: list[list[Any]] = [
    [rc.Admit(scope="s", version=0, adopted_blocks=0, cold=True)],
    [],
    [],
    [rc.AllowWrite(page=7, participant="a")],
    [],
    [],
    [rc.AllowWrite(page=8, participant="a")],
    [
        rc.Fence(scope="s", version=0, participants=("a",)),
        rc.PinCertified(
            certificate=rc.Certificate(
                scope="s",
                version=1,
                entries=(
                    rc.CertEntry(
                        page=7, position=0, generation=1, prefix=1, fingerprint="f", digest="d7"
                    ),
                ),
            )
        ),
    ],
    [],
    [rc.Free(pages=(8,))],
    [
        rc.Adopt(scope="s", version=1, pages=(7,)),
        rc.Admit(scope="s", version=1, adopted_blocks=1, cold=False),
    ],
    [],
    [rc.Publish(frame=1, scope="s", version=1, kind=TOKEN)],
    [rc.Drop(frame=2, scope="s", version=0, kind=TOKEN, reason=rc.DropReason.RETIRED_DRAINED)],
    [],
    [],
    [],
    [rc.ReleaseToCache(pages=(7,))],
    [],
    [],
    [],
    [],
]


def test_every_field_of_every_transition_and_command_of_a_scopes_life() -> None:
    core = rc.Retire()
    logged = []
    commands = []
    for event in LIFE:
        commands.append(core.handle(event))
        logged += [
            (t.action, t.scope, t.version, dict(t.args), dict(t.changed), t.reason)
            for t in core.last_transitions
        ]
    assert logged == LOGGED
    assert commands == COMMANDS


def test_a_writer_closed_for_an_unknown_page_names_the_event() -> None:
    core = _written(rc.Retire())
    before = core.state
    with pytest.raises(rc.UnknownPageError) as err:
        core.handle(rc.WriterClosed(99, "d"))
    assert "WriterClosed for page 99, which was never allocated" in str(err.value)
    assert core.state is before


def test_an_event_of_a_subclass_is_handled_as_its_class_and_anything_else_is_refused() -> None:
    class Submitted(rc.Submit):
        __slots__ = ()

    core = rc.Retire()
    assert core.handle(Submitted("s", "t", "f", (1,))) == [rc.Admit("s", 0, 0, True)]
    assert core.scope("s").state is ScopeState.ACTIVE
    before = core.state
    with pytest.raises(TypeError, match="not a Retire event: 'Submit'"):
        core.handle("Submit")  # type: ignore[arg-type]
    assert core.state is before


def test_a_submit_records_its_tenant() -> None:
    core = rc.Retire()
    core.handle(rc.Submit("s", "tenant-a", "f", (1,)))
    assert core.scope("s").tenant == "tenant-a"


def test_a_page_past_the_context_is_not_inheritable() -> None:
    core = rc.Retire()
    core.handle(rc.Submit("s", "t", "f", (1, 2)))
    core.handle(rc.ParticipantStarted("s", 0, "a"))
    core.handle(rc.PageAllocated("s", 0, "a", 7, 2))  # the context has blocks 0 and 1 only
    assert dict(core.last_transitions[0].args)["inheritable"] is False
    assert core.state.pages[7].prefix is None


def test_a_fenced_write_is_logged_with_its_version_and_completion() -> None:
    core = _written(rc.Retire())
    core.handle(rc.Supersede("s", (4, 5, 6)))
    core.handle(rc.ParticipantStarted("s", 1, "b"))
    assert core.handle(rc.WriteAttempted("s", 1, "b", 8, False)) == [
        rc.FenceWrite(8, "b", rc.FenceReason.PAGE_OF_ANOTHER_VERSION)
    ]
    (t,) = core.last_transitions
    assert (t.action, t.scope, t.version, t.reason) == (
        "fence_write",
        "s",
        1,
        "page_of_another_version",
    )
    assert dict(t.args) == {"page": 8, "participant": "b", "completes": False}


def test_a_launch_before_admission_is_refused_and_a_late_launch_is_fenced_and_logged() -> None:
    core = _aligning()
    before = core.state
    with pytest.raises(rc.IllegalTransitionError, match="version 1 is not admitted yet"):
        core.handle(rc.ParticipantStarted("s", 1, "b"))
    assert core.state is before
    assert core.handle(rc.ParticipantStarted("s", 0, "c")) == [rc.Fence("s", 0, ("c",))]
    launch, fence = core.last_transitions
    assert (launch.action, dict(launch.args)) == ("launch", {"participant": "c"})
    # (version 0 is still known by its page certified for version 1)
    assert (fence.action, fence.version, fence.reason) == ("fence", 0, "retired_draining")
    assert dict(fence.args) == {"participants": ("c",)}


def test_a_core_without_a_ledger_remembers_no_drained_version() -> None:
    core = rc.Retire(ledger_size=0)
    core.handle(rc.Submit("s", "t", "f", (1,)))
    core.handle(rc.ParticipantStarted("s", 0, "a"))
    core.handle(rc.Supersede("s", (2,)))
    core.handle(rc.Receipt("s", 0, "a"))  # version 0 drains
    assert core.state.ledger == ()
    assert core.handle(rc.FrameArrived("s", 0, 1, TOKEN)) == [
        rc.Drop(1, "s", 0, TOKEN, rc.DropReason.RETIRED_EXPIRED)
    ]


def test_a_drained_version_is_forgotten_only_once_its_last_page_is_gone() -> None:
    # A receipt may overtake the report that closes the participant's last writer.
    core = one_written_page(completes=False, closed=False)
    core.handle(rc.Supersede("s", (1, 3)))
    core.handle(rc.Receipt("s", 0, "a"))
    assert core.state.pages[7].writer_open and core.state.pages[7].version == 0
    assert list(core.state.scopes["s"].participants) == ["a"] and core.state.ledger == ()
    with pytest.raises(rc.DuplicateReceiptError, match="'a' of s@0 already closed"):
        core.handle(rc.Receipt("s", 0, "a"))
    # the closed page is incomplete: nothing to certify, the successor starts cold
    assert core.handle(rc.WriterClosed(7, "d7")) == [rc.Admit("s", 1, 0, True), rc.Free((7,))]
    assert dict(core.state.scopes["s"].participants) == {} and core.state.ledger == (("s", 0),)


def test_a_page_the_engine_stopped_referencing_goes_to_the_cache_and_is_still_inherited() -> None:
    """``PageUnreferenced`` (a sliding window passed the block): refused, changing nothing, for
    a page whose writer is open, one not referenced any more and one never allocated; for a
    completed, writer-closed page of the running version it drops the reference and gives the
    page back to the engine's cache, where it stays while the version runs (RECLAIM does not free
    it), a revision certifies and adopts it, and an eviction would forget it; a report for a
    superseded version's page is ``late_unreference`` and changes nothing."""
    core = _written(rc.Retire())
    for page, error in ((8, rc.PageInUseError), (9, rc.UnknownPageError)):
        before = core.state
        with pytest.raises(error, match=f"PageUnreferenced for page {page}"):
            core.handle(rc.PageUnreferenced(page))
        assert core.state is before
    assert core.handle(rc.PageUnreferenced(7)) == [rc.ReleaseToCache((7,))]
    assert _transitions(core) == [("unreference", "s", 0, {"held": False})]
    assert not core.state.pages[7].held and not core.state.pages[7].pinned
    before = core.state
    with pytest.raises(rc.PageInUseError, match="which is not referenced"):
        core.handle(rc.PageUnreferenced(7))  # twice
    assert core.state is before
    core.handle(rc.WriterClosed(8, "d8"))  # RECLAIM runs: page 7 stays in the cache
    assert 7 in core.state.pages and not core.state.pages[7].held
    # a revision sharing the first block certifies the cached page; the receipt frees page 8
    commands = core.handle(rc.Supersede("s", (1, 5)))
    (certificate,) = [c.certificate for c in commands if isinstance(c, rc.PinCertified)]
    assert certificate.pages == (7,) and core.state.pages[7].pinned
    assert core.handle(rc.Receipt("s", 0, "a")) == [rc.Free((8,))]
    commands = core.handle(rc.AdoptionReport("s", 1, (rc.PageDigest(7, "d7"),)))
    assert rc.Adopt("s", 1, (7,)) in commands and core.state.pages[7].held
    # the successor's participant runs; a report about the old version's page comes late
    core.handle(rc.ParticipantStarted("s", 1, "b"))
    core.handle(rc.PageAllocated("s", 1, "b", 9, 1))
    core.handle(rc.WriteAttempted("s", 1, "b", 9, True))
    core.handle(rc.WriterClosed(9, "d9"))
    core.handle(rc.Supersede("s", (6,)))  # nothing shared: "b" is fenced, its pages held
    before = core.state
    assert core.handle(rc.PageUnreferenced(9)) == []
    assert _transitions(core) == [("late_unreference", "s", 1, {})]
    assert core.state.pages[9] == before.pages[9] and core.state.pages[9].held


def test_a_preemption_frees_the_pages_of_the_version_the_engine_cache_kept_too() -> None:
    """A preempted version computes everything again (its prefix hashes are evicted), so the
    pages of it a sliding window passed, which the engine's cache kept, are freed with the
    others: nothing of the run stays tracked for a prefix no one will hit."""
    core = _written(rc.Retire())
    assert core.handle(rc.PageUnreferenced(7)) == [rc.ReleaseToCache((7,))]
    core.handle(rc.WriterClosed(8, "d8"))
    core.handle(rc.Receipt("s", 0, "a"))
    assert core.handle(rc.VersionPreempted("s", 0)) == [rc.Free((7, 8))]
    assert [(t.action, t.args) for t in core.last_transitions] == [
        ("preempt", (("unheld", 1),)),
        ("free", (("pages", (7, 8)),)),
    ]
    assert not core.state.pages and core.state.scopes["s"].state is ScopeState.ACTIVE
