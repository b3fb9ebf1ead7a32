"""Which class a late event of a version without authority gets (``ledger.classify_late``), on
the paths that reach it besides frames (whose cancelled case the publication gate answers
first): a launch racing a cancel or a revision, and a version that drained while another
version of its scope still holds pages. Mutation testing found these classes unchecked there."""

from __future__ import annotations

from typing import Any

import retire_core as rc


def _reasons(core: rc.Retire, event: Any, action: str) -> list[str]:
    core.handle(event)
    return [t.reason for t in core.last_transitions if t.action == action and t.reason]


def test_a_launch_racing_a_cancel_is_fenced_as_scope_cancelled() -> None:
    r = rc.Retire()
    r.handle(rc.Submit("s", "t", "f", (1,)))
    r.handle(rc.ParticipantStarted("s", 0, "a"))
    r.handle(rc.Supersede("s", (2,)))  # nothing to inherit: version 1 is admitted cold
    r.handle(rc.Cancel("s"))
    # the cancelled scope's own (current) version
    assert _reasons(r, rc.ParticipantStarted("s", 1, "b"), "fence") == ["scope_cancelled"]
    # an older version of the cancelled scope, still draining ("a" runs): not scope_cancelled
    assert _reasons(r, rc.ParticipantStarted("s", 0, "c"), "fence") == ["retired_draining"]


def test_a_drained_version_is_not_draining_because_another_version_holds_pages() -> None:
    r = rc.Retire()
    r.handle(rc.Submit("s", "t", "f", (1, 2)))
    r.handle(rc.ParticipantStarted("s", 0, "a"))
    r.handle(rc.Supersede("s", (3, 4)))  # version 1, admitted cold
    r.handle(rc.ParticipantStarted("s", 1, "b"))
    r.handle(rc.PageAllocated("s", 1, "b", 7, 0))  # version 1 holds a page
    r.handle(rc.Receipt("s", 0, "a"))  # version 0 drains: no participant, no page left
    assert {(p.owner, p.version) for p in r.state.pages.values()} == {("s", 1)}
    drop = r.handle(rc.FrameArrived("s", 0, 1, rc.FrameKind.TOKEN))
    assert drop == [rc.Drop(1, "s", 0, rc.FrameKind.TOKEN, "retired_drained")]
