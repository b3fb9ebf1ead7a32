"""Which class a late event of a version without authority gets (``ledger.classify_late``), on
the paths that reach it besides frames (whose cancelled case the publication gate answers
first): a launch racing a cancel or a revision, a version that drained while another version
of its scope still holds pages, one whose certified pages still wait for adoption; and that only
retired versions are forgotten into the ledger. Mutation testing found these unchecked."""

from __future__ import annotations

from typing import Any

import retire_core as rc
from retire_checks.lockstep import Lockstep
from retire_spec.actions import ActionInstance as A
from tests.helpers import UNI
from tests.test_core_behaviour import _warm_predecessor


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


def test_a_drained_version_whose_certified_pages_wait_for_adoption_is_still_draining() -> None:
    ls = Lockstep(UNI)
    _warm_predecessor(ls)
    ls.env(A("supersede", (0, (1, 2), True)))  # both of s0@0's pages certified for s0@1
    ls.env(A("receipt", (0,)))  # s0@0 has no participant left; its pages wait, pinned
    assert {p.version for p in ls.core.pages.values()} == {0}
    assert ("s0", 0) not in ls.core.ledger  # its pages are still live: not forgotten yet
    core = rc.Retire(state=ls.core)
    drop = core.handle(rc.FrameArrived("s0", 0, 9, rc.FrameKind.TOKEN))
    assert drop == [rc.Drop(9, "s0", 0, rc.FrameKind.TOKEN, "retired_draining")]


def test_only_retired_versions_go_to_the_ledger() -> None:
    r = rc.Retire()
    r.handle(rc.Submit("s", "t", "f", (1,)))
    r.handle(rc.ParticipantStarted("s", 0, "a"))
    r.handle(rc.Supersede("s", (2,)))  # version 1, admitted cold
    r.handle(rc.ParticipantStarted("s", 1, "b"))
    r.handle(rc.Receipt("s", 1, "b"))  # the current version finished: drained, but current
    r.handle(rc.Receipt("s", 0, "a"))  # version 0 drains: RECLAIM forgets it
    assert ("s", 0) in r.state.ledger and "a" not in r.scope("s").participants
    assert ("s", 1) not in r.state.ledger and "b" in r.scope("s").participants


def test_a_version_known_only_by_its_pages_is_still_draining() -> None:
    ls = Lockstep(UNI)
    _warm_predecessor(ls)
    ls.env(A("supersede", (0, (1, 3), True)))
    ls.report(0)  # s0@1 adopts page 0 and is admitted; it never launches a participant
    ls.env(A("supersede", (0, (1, 3), True)))  # page 0, now s0@1's, is certified for s0@2
    assert not any(p.version == 1 for p in ls.core.scopes["s0"].participants.values())
    assert ls.core.pages[0].version == 1 and ls.core.pages[0].pinned
    core = rc.Retire(state=ls.core)
    drop = core.handle(rc.FrameArrived("s0", 1, 9, rc.FrameKind.TOKEN))
    assert drop == [rc.Drop(9, "s0", 1, rc.FrameKind.TOKEN, "retired_draining")]
