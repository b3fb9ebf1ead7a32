"""Speculative decoding in the core: a write of draft tokens marks its page as holding drafts,
the target's verification settles them (accepted: complete or not; rejected: incomplete), a
repeated or late verification is logged as ``stale_verify`` and changes nothing, a writer closing
over unverified drafts rolls them back (so ALIGN never certifies them), and every transition of
such a life is logged with the fields trace validation reads (``LOGGED``)."""

from __future__ import annotations

from typing import Any

import pytest

import retire_core as rc
from retire_checks.trace_validation import TraceError, validate_lines
from retire_spec.actions import ActionInstance as A
from tests.helpers import lockstep_at


def _open(core: rc.Retire) -> rc.Retire:
    """Scope ``s`` at version 0, participant ``a``, page 7 allocated at position 0."""
    core.handle(rc.Submit("s", "t", "f", (1, 2)))
    core.handle(rc.ParticipantStarted("s", 0, "a"))
    core.handle(rc.PageAllocated("s", 0, "a", 7, 0))
    return core


def _logged(core: rc.Retire) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    return [(t.action, dict(t.args), dict(t.changed)) for t in core.last_transitions]


def test_a_draft_write_marks_the_page_as_holding_drafts() -> None:
    core = _open(rc.Retire())
    assert core.handle(rc.WriteAttempted("s", 0, "a", 7, True, draft=True)) == [
        rc.AllowWrite(7, "a")
    ]
    page = core.state.pages[7]
    assert page.full and page.draft and page.writer_open
    assert _logged(core) == [
        (
            "write_draft",
            {"page": 7, "participant": "a", "completes": True},
            {"full": True, "draft": True},
        )
    ]
    assert (core.last_transitions[0].scope, core.last_transitions[0].version) == ("s", 0)


@pytest.mark.parametrize("accepted", [True, False])
def test_a_verification_settles_the_drafts(accepted: bool) -> None:
    core = _open(rc.Retire())
    core.handle(rc.WriteAttempted("s", 0, "a", 7, True, draft=True))
    assert core.handle(rc.DraftsVerified(7, accepted)) == []
    page = core.state.pages[7]
    assert page.full is accepted and not page.draft and page.writer_open
    assert _logged(core) == [
        (
            "verify_drafts",
            {"page": 7, "completes": accepted},
            {"full": accepted, "draft": False},
        )
    ]
    assert core.last_transitions[0].scope == "s" and core.last_transitions[0].version == 0


def test_a_verified_write_replaces_the_drafts() -> None:
    core = _open(rc.Retire())
    core.handle(rc.WriteAttempted("s", 0, "a", 7, False, draft=True))
    core.handle(rc.WriteAttempted("s", 0, "a", 7, True))
    page = core.state.pages[7]
    assert page.full and not page.draft
    assert _logged(core) == [
        (
            "write",
            {"page": 7, "participant": "a", "completes": True},
            {"full": True, "draft": False},
        )
    ]


def test_a_repeated_or_late_verification_is_stale_and_changes_nothing() -> None:
    core = _open(rc.Retire())
    core.handle(rc.WriteAttempted("s", 0, "a", 7, True, draft=True))
    core.handle(rc.DraftsVerified(7, True))
    before = core.state
    assert core.handle(rc.DraftsVerified(7, False)) == []  # twice: no drafts left
    assert core.state == before and core.state.pages[7].full
    assert _logged(core) == [("stale_verify", {"page": 7, "completes": False}, {})]
    assert (core.last_transitions[0].scope, core.last_transitions[0].version) == ("s", 0)
    core.handle(rc.WriteAttempted("s", 0, "a", 7, True, draft=True))
    core.handle(rc.WriterClosed(7, "d7"))  # rolls the drafts back
    before = core.state
    assert core.handle(rc.DraftsVerified(7, True)) == []  # late: the writer closed
    assert core.state == before and not core.state.pages[7].full
    assert _logged(core) == [("stale_verify", {"page": 7, "completes": True}, {})]


def test_closing_a_writer_over_drafts_rolls_them_back_and_nothing_is_certified() -> None:
    core = _open(rc.Retire())
    core.handle(rc.WriteAttempted("s", 0, "a", 7, True, draft=True))
    core.handle(rc.WriterClosed(7, "d7"))
    page = core.state.pages[7]
    assert not page.full and not page.draft and not page.writer_open
    assert _logged(core) == [
        (
            "close_writer",
            {"page": 7, "full": False, "digest": "d7"},
            {"writer_open": False, "full": False, "draft": False},
        )
    ]
    # the successor shares the block, but the page held unverified drafts: it starts cold
    commands = core.handle(rc.Supersede("s", (1, 3)))
    assert not any(isinstance(c, rc.PinCertified) for c in commands)
    assert "certify" not in [t.action for t in core.last_transitions]


def test_verified_drafts_are_certified_like_any_completed_block() -> None:
    core = _open(rc.Retire())
    core.handle(rc.WriteAttempted("s", 0, "a", 7, True, draft=True))
    core.handle(rc.DraftsVerified(7, True))
    core.handle(rc.WriterClosed(7, "d7"))
    assert core.state.pages[7].full and not core.state.pages[7].draft
    commands = core.handle(rc.Supersede("s", (1, 3)))
    pins = [c for c in commands if isinstance(c, rc.PinCertified)]
    assert [c.certificate.pages for c in pins] == [(7,)]


def test_a_fenced_draft_write_changes_nothing() -> None:
    core = _open(rc.Retire())
    core.handle(rc.WriterClosed(7, "d7"))
    before = core.state
    (command,) = core.handle(rc.WriteAttempted("s", 0, "a", 7, True, draft=True))
    assert isinstance(command, rc.FenceWrite) and command.page == 7
    assert core.state == before
    assert [t.action for t in core.last_transitions] == ["fence_write"]


def test_a_verification_of_an_untracked_page_names_the_event() -> None:
    core = _open(rc.Retire())
    before = core.state
    with pytest.raises(rc.UnknownPageError) as never:
        core.handle(rc.DraftsVerified(99, True))
    assert "DraftsVerified for page 99, which was never allocated" in str(never.value)
    core.handle(rc.WriteAttempted("s", 0, "a", 7, True, draft=True))
    core.handle(rc.WriterClosed(7, "d7"))
    core.handle(rc.Receipt("s", 0, "a"))
    core.handle(rc.VersionFinished("s", 0))  # page 7 (incomplete: drafts rolled back) is freed
    assert 7 not in core.state.pages
    before = core.state
    with pytest.raises(rc.DoubleFreeError) as freed:
        core.handle(rc.DraftsVerified(7, True))
    assert str(freed.value) == "DraftsVerified for page 7, which was already freed"
    assert core.state is before


def test_draft_events_are_validated_at_construction() -> None:
    with pytest.raises(TypeError):
        rc.DraftsVerified(7, 1)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        rc.WriteAttempted("s", 0, "a", 7, True, draft="yes")  # type: ignore[arg-type]


@pytest.mark.parametrize("state", ["active", "aligning", "paused", "cancelled", "finished"])
@pytest.mark.parametrize("accepted", [True, False])
def test_a_verification_is_legal_in_every_state_of_the_pages_owner(
    state: str, accepted: bool
) -> None:
    """``DraftsVerified`` names only a page: keyed on its owner's state, legal in all of them.
    Each tracked page of s0 is verified, with drafts under an open writer where the engine could
    still write them, and the step is replayed through the lock-step harness (a spec step, or
    the ``stale_verify`` stutter)."""
    ls = lockstep_at(state)
    running = [q for q, (s, _) in ls.launched.items() if s == 0 and not ls.spec["part_closed"][q]]
    if running:
        q = running[0]
        ls.env(A("allocate", (2, q, 1)))
        ls.env(A("attempt_draft", (2, q, True)))
    pages = sorted(ls.core.pages)
    assert pages or state == "finished"
    for p in pages:
        at = ls.snapshot()
        owner = ls.core.scopes[ls.core.pages[p].owner].state
        out = ls.env(A("verify_drafts", (p, accepted)))
        (t,) = out.transitions
        assert t.action in ("verify_drafts", "stale_verify")
        assert ls.core.scopes[ls.core.pages[p].owner].state is owner
        ls.restore(at)


# --- the log of a speculative life -------------------------------------------------------------

SPECULATIVE_LIFE = [
    rc.Submit("s", "t", "f", (1, 2)),
    rc.ParticipantStarted("s", 0, "a"),
    rc.PageAllocated("s", 0, "a", 7, 0),
    rc.WriteAttempted("s", 0, "a", 7, True, draft=True),
    rc.DraftsVerified(7, True),
    rc.WriterClosed(7, "d7"),
    rc.PageAllocated("s", 0, "a", 8, 1),
    rc.WriteAttempted("s", 0, "a", 8, True, draft=True),
    rc.DraftsVerified(8, False),
    rc.WriteAttempted("s", 0, "a", 8, True, draft=True),
    rc.DraftsVerified(8, False),
    rc.DraftsVerified(8, False),
    rc.WriteAttempted("s", 0, "a", 8, True, draft=True),
    rc.Supersede("s", (1, 2)),
    rc.WriterClosed(8, "d8"),
    rc.DraftsVerified(8, True),
]
LOGGED = [
    ("open", {"tenant": "t", "fingerprint": "f", "context": (1, 2), "reuse": True}),
    ("launch", {"participant": "a"}),
    ("allocate", {"page": 7, "participant": "a", "position": 0, "inheritable": True}),
    ("write_draft", {"page": 7, "participant": "a", "completes": True}),
    ("verify_drafts", {"page": 7, "completes": True}),
    ("close_writer", {"page": 7, "full": True, "digest": "d7"}),
    ("allocate", {"page": 8, "participant": "a", "position": 1, "inheritable": True}),
    ("write_draft", {"page": 8, "participant": "a", "completes": True}),
    ("verify_drafts", {"page": 8, "completes": False}),
    ("write_draft", {"page": 8, "participant": "a", "completes": True}),
    ("verify_drafts", {"page": 8, "completes": False}),
    ("stale_verify", {"page": 8, "completes": False}),
    ("write_draft", {"page": 8, "participant": "a", "completes": True}),
    ("supersede", {"previous": 0, "context": (1, 2), "reuse": True}),
    ("fence", {"participants": ("a",)}),
    ("close_writer", {"page": 8, "full": False, "digest": "d8"}),
    ("certify", {"page": 7, "position": 0, "generation": 1, "digest": "d7"}),
    ("stale_verify", {"page": 8, "completes": True}),
]


def test_every_transition_of_a_speculative_life_is_logged_and_is_a_behaviour_of_the_spec() -> None:
    """Page 7's drafts are verified and certified; page 8's are rejected, rewritten, rejected
    again (and verified twice), then written once more and left unverified when the revision
    fences the writer: ALIGN waits for that writer, its close rolls the drafts back, the
    successor certifies page 7 only, and the late verification is stale."""
    import io
    import json

    import structlog

    buf = io.StringIO()
    log = structlog.wrap_logger(
        structlog.WriteLogger(buf), processors=[structlog.processors.JSONRenderer()]
    )
    core = rc.Retire(logger=log)
    logged = []
    for event in SPECULATIVE_LIFE:
        core.handle(event)
        logged += [(t.action, dict(t.args)) for t in core.last_transitions]
    assert logged == LOGGED
    assert core.state.scopes["s"].certificate is not None
    assert core.state.scopes["s"].certificate.pages == (7,)
    lines = buf.getvalue().splitlines()
    report = validate_lines(lines)
    assert report.transitions == len(LOGGED)
    # the validator holds the log to the spec: a page that still holds its unverified drafts
    # cannot be certified (here: drop the line that rolled them back, so that the writer is
    # still open when the certificate names the page)
    records = [json.loads(line) for line in lines]
    forged = [r for r in records if r["transition"] != "verify_drafts" or r["page"] != 7]
    for n, r in enumerate(forged, 1):
        r["seq"] = n
    with pytest.raises(TraceError) as err:
        validate_lines([json.dumps(r) for r in forged])
    assert "certify" in str(err.value) or "close_writer" in str(err.value)


# --- the spec's draft invariants have teeth -------------------------------------------------------


def test_certified_bytes_verified_alone_catches_certified_drafts() -> None:
    """With every other invariant left out, ``certified_bytes_verified`` still finds the spec
    mutant whose writers close over unverified drafts keeping the page complete: the successor
    certifies bytes no one verified. The unmutated spec keeps it in the same world, and so does
    it keep ``closed_writer_holds_no_drafts``, which a close that forgets to settle the drafts
    breaks."""
    import attrs

    from retire_checks import mutant_kind, mutants
    from retire_checks.explorer import explore_spec
    from retire_spec import actions as spec_actions
    from retire_spec.expr import Interp, Val
    from retire_spec.invariants import INVARIANT_BY_NAME
    from retire_spec.schema import SpecState

    certified = (INVARIANT_BY_NAME["certified_bytes_verified"],)
    no_drafts = (INVARIANT_BY_NAME["closed_writer_holds_no_drafts"],)
    world = attrs.evolve(mutant_kind.SPEC_CHAIN, max_states=None)
    mutant = mutants.MUTANTS["spec_unverified_drafts_certified"]
    found = explore_spec(world, mutant.actions, invariants=certified).violation
    assert found is not None and found.violated == ("certified_bytes_verified",)
    assert [m.name for m in found.moves][-1] == "certify"
    clean = explore_spec(world, invariants=certified + no_drafts)
    assert clean.violation is None and clean.exhaustive

    def close_keeping_draft_flag(I: Interp, st: SpecState, p: Val, t: Val) -> dict[str, Val]:
        effect = spec_actions.close_writer_effect(I, st, p, t)
        del effect["page_draft"]
        return effect

    table = dict(spec_actions.ACTION_BY_NAME)
    table["close_writer"] = attrs.evolve(table["close_writer"], effect=close_keeping_draft_flag)
    found = explore_spec(world, table, invariants=no_drafts).violation
    assert found is not None and found.violated == ("closed_writer_holds_no_drafts",)
