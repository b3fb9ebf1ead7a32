"""A version's own output as an inheritable prefix: the engine names the prefix identity of a
block past the version's context when its writer closes (``WriterClosed.prefix``). The core keeps
the name only for a completed page whose version still holds authority; a revision whose context
continues with those tokens then certifies and adopts the page like a context page. Every other
name is dropped (logged ``inheritable: False``) and the page stays as uninheritable as before."""

from __future__ import annotations

from typing import Any

import pytest

import retire_core as rc
from retire_core.state import ScopeState


def _generated(core: rc.Retire, *, completes: bool = True, draft: bool = False) -> rc.Retire:
    """Scope ``s`` at version 0 with context ``(1,)``: page 7 holds block 0 (key 1) and is
    closed; page 8 holds block 1, past the context (the version's output), writer still open."""
    core.handle(rc.Submit("s", "t", "f", (1,)))
    core.handle(rc.ParticipantStarted("s", 0, "a"))
    core.handle(rc.PageAllocated("s", 0, "a", 7, 0))
    core.handle(rc.WriteAttempted("s", 0, "a", 7, True))
    core.handle(rc.WriterClosed(7, "d7"))
    core.handle(rc.PageAllocated("s", 0, "a", 8, 1))
    core.handle(rc.WriteAttempted("s", 0, "a", 8, completes, draft=draft))
    return core


def _close(core: rc.Retire, page: int, name: Any) -> dict[str, Any]:
    core.handle(rc.WriterClosed(page, f"d{page}", prefix=name))
    (t,) = [t for t in core.last_transitions if t.action == "close_writer"]
    return dict(t.args)


def test_a_named_output_block_is_inherited_by_a_revision_that_continues_it() -> None:
    core = _generated(rc.Retire())
    args = _close(core, 8, "out-1")
    assert args["named"] == "out-1" and args["inheritable"] is True
    assert core.state.pages[8].prefix == "out-1"
    core.handle(rc.VersionFinished("s", 0))
    out = core.handle(rc.Supersede("s", (1, "out-1", 5)))
    (pin,) = [c for c in out if isinstance(c, rc.PinCertified)]
    assert [(e.page, e.position) for e in pin.certificate.entries] == [(7, 0), (8, 1)]


def test_without_a_name_the_output_block_is_not_inherited() -> None:
    core = _generated(rc.Retire())
    core.handle(rc.WriterClosed(8, "d8"))
    assert core.state.pages[8].prefix is None
    core.handle(rc.VersionFinished("s", 0))
    out = core.handle(rc.Supersede("s", (1, "out-1", 5)))
    (pin,) = [c for c in out if isinstance(c, rc.PinCertified)]
    assert [e.page for e in pin.certificate.entries] == [7]


def test_a_name_that_differs_from_the_revised_context_is_not_inherited() -> None:
    core = _generated(rc.Retire())
    _close(core, 8, "out-1")
    core.handle(rc.VersionFinished("s", 0))
    out = core.handle(rc.Supersede("s", (1, "other", 5)))
    (pin,) = [c for c in out if isinstance(c, rc.PinCertified)]
    assert [e.page for e in pin.certificate.entries] == [7]


@pytest.mark.parametrize(
    "why",
    ["incomplete", "drafts rolled back", "revised before the close", "not admitted"],
)
def test_a_name_is_dropped_where_the_page_could_not_be_inherited(why: str) -> None:
    core = rc.Retire()
    if why == "not admitted":
        # version 1 waits for version 0's receipt (ALIGNING) when its page 8 closes
        core.handle(rc.Submit("s", "t", "f", (1,)))
        core.handle(rc.ParticipantStarted("s", 0, "a"))
        core.handle(rc.PageAllocated("s", 0, "a", 7, 0))
        core.handle(rc.WriteAttempted("s", 0, "a", 7, True))
        core.handle(rc.Supersede("s", (1,)))
        assert core.scope("s").state is ScopeState.ALIGNING
        core.handle(rc.ParticipantStarted("s", 0, "b"))
        core.handle(rc.PageAllocated("s", 0, "b", 8, 1))
        core.handle(rc.WriteAttempted("s", 0, "b", 8, True))
    else:
        _generated(
            core, completes=why != "incomplete", draft=why == "drafts rolled back"
        )
        if why == "revised before the close":
            core.handle(rc.Supersede("s", (1, "out-1")))
    args = _close(core, 8, "out-1")
    assert args["named"] == "out-1" and args["inheritable"] is False
    assert core.state.pages[8].prefix is None


def test_a_context_page_keeps_the_identity_its_context_gave_it() -> None:
    core = rc.Retire()
    core.handle(rc.Submit("s", "t", "f", (1,)))
    core.handle(rc.ParticipantStarted("s", 0, "a"))
    core.handle(rc.PageAllocated("s", 0, "a", 7, 0))
    core.handle(rc.WriteAttempted("s", 0, "a", 7, True))
    args = _close(core, 7, "renamed")
    assert args["inheritable"] is False and core.state.pages[7].prefix == 1


@pytest.mark.parametrize("name", [True, 1.5, ["k"]])
def test_a_malformed_name_is_refused_at_the_edge(name: Any) -> None:
    with pytest.raises(rc.MalformedIdError):
        rc.WriterClosed(8, "d8", prefix=name)
