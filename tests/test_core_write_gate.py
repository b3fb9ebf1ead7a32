"""Why the write gate fences a write (Rule 3): the reason each ``FenceWrite`` carries, for a page
of another scope, of another version and with its writer closed (mutation testing found the
reasons unchecked: the explorer's engine does not read them)."""

from __future__ import annotations

import retire_core as rc


def _running() -> rc.Retire:
    """Scope s@0 ("a") filled and closed page 3; s2@0 ("z") runs; s@1 ("b") runs, cold."""
    r = rc.Retire()
    r.handle(rc.Submit("s", "t", "f", (1, 2)))
    r.handle(rc.Submit("s2", "t", "f", (5,)))
    r.handle(rc.ParticipantStarted("s", 0, "a"))
    r.handle(rc.ParticipantStarted("s2", 0, "z"))
    r.handle(rc.PageAllocated("s", 0, "a", 3, 0))
    r.handle(rc.WriteAttempted("s", 0, "a", 3))
    r.handle(rc.WriterClosed(3, "d3"))
    r.handle(rc.Supersede("s", (7, 8), rc.Contract(reuse=rc.ReusePolicy.NEVER)))
    r.handle(rc.ParticipantStarted("s", 1, "b"))
    return r


def test_each_fenced_write_says_why() -> None:
    cases = [
        (rc.WriteAttempted("s2", 0, "z", 3), "page_of_another_scope"),
        (rc.WriteAttempted("s", 1, "b", 3), "page_of_another_version"),
        (rc.WriteAttempted("s", 0, "a", 3), "writer_closed"),
    ]
    for event, reason in cases:
        r = _running()
        assert r.handle(event) == [rc.FenceWrite(3, event.participant, reason)], reason
