"""A version's own output as an inheritable prefix: the engine names the prefix identity of a
block past the version's context when its writer closes (``WriterClosed.prefix``). The core keeps
the name only for a completed page whose version still holds authority; a revision whose context
continues with those tokens then certifies and adopts the page like a context page. Every other
name is dropped and the page keeps the identity it had (``inheritable`` logs whether it has one)."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
import structlog

import retire_core as rc
from retire_checks.abstraction import Universe
from retire_checks.lockstep import Lockstep
from retire_checks.trace_validation import TraceError, validate_lines
from retire_core.state import ScopeState
from retire_spec.actions import ActionInstance as A
from retire_spec.schema import BEYOND, NO_MATCH, Bounds


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
        _generated(core, completes=why != "incomplete", draft=why == "drafts rolled back")
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
    assert args["inheritable"] is True and core.state.pages[7].prefix == 1


@pytest.mark.parametrize("name", [True, 1.5, ["k"]])
def test_a_malformed_name_is_refused_at_the_edge(name: Any) -> None:
    with pytest.raises(rc.MalformedIdError):
        rc.WriterClosed(8, "d8", prefix=name)


# --- the spec agrees, and the log is a behaviour of the spec ------------------------------------

OUTPUT_BOUNDS = Bounds(1, 2, 0, 2, 2, 1, ((1, BEYOND), (1, 2)), (0,), names=(2, 3))


def _turn(ls: Lockstep, name: int, *, revise_first: bool = False) -> None:
    """Version 0 (context ``(1,)``) fills block 0 and its output block 1 (page 1), whose writer
    closes with ``name``; ``revise_first``: the revision to ``(1, 2)`` comes before that close."""
    for move in (
        A("open", (0, (1, BEYOND), True)),
        A("launch", (0, 0, 0)),
        A("allocate", (0, 0, 0)),
        A("attempt_write", (0, 0, True)),
        A("close_writer", (0, NO_MATCH)),
        A("allocate", (1, 0, 1)),
        A("attempt_write", (1, 0, True)),
    ):
        ls.env(move)
    if revise_first:
        ls.env(A("supersede", (0, (1, 2), True)))
    ls.env(A("close_writer", (1, name)))


@pytest.mark.parametrize("name", [2, 3, NO_MATCH])
def test_the_spec_and_the_core_agree_on_an_inherited_output_block(name: int) -> None:
    ls = Lockstep(Universe.of(OUTPUT_BOUNDS))
    _turn(ls, name)
    assert ls.spec["page_tok"][1] == name and ls.core.pages[1].prefix == (
        None if name == NO_MATCH else name
    )
    ls.env(A("receipt", (0,)))
    out = ls.env(A("supersede", (0, (1, 2), True)))
    (pin,) = [c for c in out.commands if isinstance(c, rc.PinCertified)]
    assert pin.certificate.pages == ((0, 1) if name == 2 else (0,))
    admitted = ls.report(0)
    (admit,) = [c for c in admitted.commands if isinstance(c, rc.Admit)]
    assert admit.adopted_blocks == (2 if name == 2 else 1)


def test_a_name_after_the_revision_is_dropped_by_the_spec_and_the_core() -> None:
    ls = Lockstep(Universe.of(OUTPUT_BOUNDS))
    _turn(ls, 2, revise_first=True)
    assert ls.spec["page_tok"][1] == NO_MATCH and ls.core.pages[1].prefix is None


def _logged_turn(name: str) -> list[str]:
    buf = io.StringIO()
    log = structlog.wrap_logger(
        structlog.WriteLogger(buf), processors=[structlog.processors.JSONRenderer()]
    )
    core = _generated(rc.Retire(logger=log))
    core.handle(rc.WriterClosed(8, "d8", prefix=name))
    core.handle(rc.Receipt("s", 0, "a"))
    core.handle(rc.Supersede("s", (1, "out-1")))
    core.handle(rc.AdoptionReport("s", 1, (rc.PageDigest(7, "d7"), rc.PageDigest(8, "d8"))))
    return buf.getvalue().splitlines()


def test_a_log_with_a_named_output_block_is_a_behaviour_of_the_spec() -> None:
    lines = _logged_turn("out-1")
    adopted = [r for r in map(json.loads, lines) if r["transition"] == "adopt"]
    assert [r["pages"] for r in adopted] == [[7, 8]]  # one transition over both pages
    assert validate_lines(lines).transitions == len(lines)
    # the validator holds the log to the spec: a close that claims the name was dropped, while
    # the version held authority over a completed block past its context, is refused
    records = [json.loads(line) for line in lines]
    for r in records:
        if r["transition"] == "close_writer" and r["page"] == 8:
            r["inheritable"] = False
    with pytest.raises(TraceError) as err:
        validate_lines([json.dumps(r) for r in records])
    assert "close_writer logged inheritable=False" in str(err.value)
