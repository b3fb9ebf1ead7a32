"""The adoption report in detail: a report that does not give exactly one digest per certified
page is refused, and the logged ``adopt`` transition names the successor's version and what
changed (mutation testing found both unchecked: the explorer's engine always reports exactly
the certified pages, and refinement reads the transition's page, not these fields)."""

from __future__ import annotations

import pytest

import retire_core as rc
from retire_checks.lockstep import Lockstep
from retire_spec.actions import ActionInstance as A
from tests.helpers import UNI, one_written_page
from tests.test_core_behaviour import _warm_predecessor


def _pending() -> Lockstep:
    """s0@1 waits for the byte check of its certified prefix: page 0 (block 1 differs)."""
    ls = Lockstep(UNI)
    _warm_predecessor(ls)
    ls.env(A("supersede", (0, (1, 3), True)))
    assert ls.core.scopes["s0"].certificate is not None
    assert ls.core.scopes["s0"].certificate.pages == (0,)
    return ls


@pytest.mark.parametrize(
    "digests",
    [
        (rc.PageDigest(1, "a"),),  # as many digests as certified pages, for another page
        (rc.PageDigest(0, "a"), rc.PageDigest(0, "a")),  # the certified page, twice
        (rc.PageDigest(0, "a"), rc.PageDigest(1, "a")),  # and one page more
    ],
)
def test_a_report_not_covering_exactly_the_certified_pages_is_refused(
    digests: tuple[rc.PageDigest, ...],
) -> None:
    ls = _pending()
    core = rc.Retire(state=ls.core)
    before = core.fingerprint()
    with pytest.raises(rc.ReportMismatchError):
        core.handle(rc.AdoptionReport("s0", 1, digests))
    assert core.fingerprint() == before


def test_the_adopt_transition_names_the_successor_and_what_changed() -> None:
    ls = _pending()
    out = ls.report(0)
    (adopt,) = [t.as_log() for t in out.transitions if t.action == "adopt"]
    assert adopt["scope"] == "s0" and adopt["version"] == 1 and adopt["page"] == 0
    assert adopt["changed"] == {"version": 1, "held": True, "pinned": False}
    assert adopt["position"] == 0


def test_the_release_transition_names_the_successor_the_page_and_why() -> None:
    ls = Lockstep(UNI)
    _warm_predecessor(ls)
    ls.env(A("supersede", (0, (1, 2), True)))  # both blocks certified
    ls.env(A("receipt", (0,)))  # the predecessor drains: its pages are kept by their pins
    ls.env(A("corrupt", (1,)))
    reported = str(ls.spec["page_data"][1])
    assert reported != ls.core.scopes["s0"].certificate.entries[1].digest
    out = ls.report(0)
    (release,) = [t.as_log() for t in out.transitions if t.action == "release"]
    assert release["scope"] == "s0" and release["version"] == 1
    assert release["reason"] == "digest_mismatch"
    assert release["changed"] == {"pinned": False}
    assert (release["page"], release["position"]) == (1, 1)
    assert release["digest"] == reported  # the bytes the engine reported, not the certified


def test_the_certify_and_resume_transitions_log_what_they_decided() -> None:
    ls = Lockstep(UNI)
    _warm_predecessor(ls)
    out = ls.env(A("supersede", (0, (1, 3), True)))
    (certify,) = [t.as_log() for t in out.transitions if t.action == "certify"]
    page = ls.core.pages[0]
    assert (certify["scope"], certify["version"], certify["page"]) == ("s0", 1, 0)
    assert certify["changed"] == {"pinned": True}
    assert (certify["position"], certify["generation"]) == (0, page.generation)
    assert certify["digest"] == page.digest and page.digest is not None
    (resume,) = [t.as_log() for t in ls.report(0).transitions if t.action == "resume"]
    assert (resume["scope"], resume["version"]) == ("s0", 1)
    assert resume["changed"] == {"state": "active", "admitted": True}
    assert (resume["adopted_blocks"], resume["cold"]) == (1, False)
    cold = ls.env(A("supersede", (0, (4, 5), True)))  # nothing in common: admitted cold
    (resume,) = [t.as_log() for t in cold.transitions if t.action == "resume"]
    assert (resume["version"], resume["adopted_blocks"], resume["cold"]) == (2, 0, True)


def test_adoption_ends_the_certificate_and_a_second_report_is_refused() -> None:
    ls = _pending()
    report = rc.AdoptionReport("s0", 1, (rc.PageDigest(0, ls.core.pages[0].digest or ""),))
    core = rc.Retire(state=ls.core)
    core.handle(report)
    assert core.scope("s0").certificate is None and core.scope("s0").admitted
    before = core.fingerprint()
    with pytest.raises(rc.IllegalTransitionError):
        core.handle(report)
    assert core.fingerprint() == before


def test_the_unhold_transition_logs_what_changed() -> None:
    ls = _pending()
    out = ls.env(A("receipt", (0,)))  # s0@0 drains: its pages lose their reference
    unholds = [t.as_log() for t in out.transitions if t.action == "unhold"]
    assert {u["page"] for u in unholds} == {0, 1}
    for u in unholds:
        assert (u["scope"], u["version"], u["changed"]) == ("s0", 0, {"held": False})


def test_the_free_transitions_name_the_scope_and_version_of_the_page() -> None:
    ls = Lockstep(UNI)
    _warm_predecessor(ls)
    ls.env(A("supersede", (0, (1, 3), True)))  # page 0 certified, page 1 not
    out = ls.env(A("receipt", (0,)))  # page 1 is unheld and unpinned: freed at once
    frees = [t.as_log() for t in out.transitions if t.action == "free"]
    assert [(f["scope"], f["version"], f["page"]) for f in frees] == [("s0", 0, 1)]
    ls2 = Lockstep(UNI)
    _warm_predecessor(ls2)
    ls2.env(A("supersede", (0, (1, 2), True)))  # both certified
    ls2.env(A("receipt", (0,)))  # unheld, kept by their pins
    ls2.env(A("corrupt", (1,)))
    out = ls2.report(0)  # page 1 fails its byte check: unpinned, then freed
    frees = [t.as_log() for t in out.transitions if t.action == "free"]
    assert [(f["scope"], f["version"], f["page"]) for f in frees] == [("s0", 0, 1)]


def test_a_write_into_an_unallocated_page_is_fenced_with_that_reason() -> None:
    core = rc.Retire()
    core.handle(rc.Submit("s", "t", "f", (1,)))
    core.handle(rc.ParticipantStarted("s", 0, "a"))
    assert core.handle(rc.WriteAttempted("s", 0, "a", 9)) == [
        rc.FenceWrite(9, "a", "page_not_allocated")
    ]
    (fence,) = [t.as_log() for t in core.last_transitions]
    assert (fence["transition"], fence["reason"]) == ("fence_write", "page_not_allocated")


def test_a_page_released_while_its_version_drains_is_left_as_it_was_before_the_pin() -> None:
    # (The spec corrupts only unreferenced pages, so the explorer never sees this: the engine
    # reports bytes that differ for a page the draining predecessor still references.)
    core = one_written_page(completes=True, closed=True)
    before = core.state.pages[7]
    out = core.handle(rc.Supersede("s", (1, 3)))
    assert [c for c in out if isinstance(c, rc.PinCertified)]
    out = core.handle(rc.AdoptionReport("s", 1, (rc.PageDigest(7, "other"),)))
    assert rc.Unpin((7,), rc.ReleaseReason.DIGEST_MISMATCH) in out
    assert core.state.pages[7] == before  # unpinned, still the draining predecessor's


def test_a_revision_logs_each_operation_on_many_pages_once() -> None:
    """Certifying a prefix, adopting it, and unholding and freeing a retired version's pages
    are one transition each over all their pages (``pages``, then one column per per-page
    fact), not one per page: a revision of a long context logs a few lines. ``per_page`` gives
    the per-page steps each stands for, which refinement and trace validation replay."""
    core = rc.Retire()
    context = (1, 2, 3, 4, 5, 6)
    core.handle(rc.Submit("s", "t", "f", context))
    core.handle(rc.ParticipantStarted("s", 0, "a"))
    for page in range(6):
        core.handle_batch(
            [
                rc.PageAllocated("s", 0, "a", page, page),
                rc.WriteAttempted("s", 0, "a", page, True),
                rc.WriterClosed(page, f"d{page}"),
            ]
        )
    core.handle(rc.Supersede("s", (*context[:3], 9, 10)))
    (certify,) = [t for t in core.last_transitions if t.action == "certify"]
    assert certify.args == (
        ("pages", (0, 1, 2)),
        ("position", (0, 1, 2)),
        ("generation", (1, 1, 1)),
        ("digest", ("d0", "d1", "d2")),
    )
    assert [t.args for t in rc.per_page([certify])] == [
        (("page", p), ("position", p), ("generation", 1), ("digest", f"d{p}")) for p in range(3)
    ]
    core.handle(rc.Receipt("s", 0, "a"))
    reclaimed = [t for t in core.last_transitions if t.stage is rc.Stage.RECLAIM]
    assert [(t.action, t.version, t.args, t.changed) for t in reclaimed] == [
        ("unhold", 0, (("pages", (0, 1, 2, 3, 4, 5)),), (("held", False),)),
        ("free", 0, (("pages", (3, 4, 5)),), ()),
    ]
    core.handle(rc.AdoptionReport("s", 1, tuple(rc.PageDigest(p, f"d{p}") for p in range(3))))
    (adopt,) = [t.as_log() for t in core.last_transitions if t.action == "adopt"]
    assert (adopt["pages"], adopt["position"], adopt["digest"]) == (
        [0, 1, 2],
        [0, 1, 2],
        ["d0", "d1", "d2"],
    )
    assert adopt["changed"] == {"version": 1, "held": True, "pinned": False}
