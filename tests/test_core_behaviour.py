"""Behaviour of the core on scripted paths: handoff, faults, chains, late events, bad input."""

from __future__ import annotations

import ast
import pathlib
from collections.abc import Callable

import pytest
import structlog
from structlog.testing import capture_logs

import retire_core as rc
from retire_checks.lockstep import Lockstep
from retire_core.gates import publication_gate
from retire_spec.actions import ActionInstance as A
from retire_spec.invariants import QUIESCENCE
from retire_spec.schema import NO_MATCH
from tests.helpers import UNI, lockstep_at

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _warm_predecessor(ls: Lockstep, ctx: tuple[int, int] = (1, 2)) -> None:
    """s0@0 completes two blocks of ``ctx`` and closes both writers."""
    for move in (
        A("open", (0, ctx, True)),
        A("launch", (0, 0, 0)),
        A("allocate", (0, 0, 0)),
        A("attempt_write", (0, 0, True)),
        A("close_writer", (0, NO_MATCH)),
        A("allocate", (1, 0, 1)),
        A("attempt_write", (1, 0, True)),
        A("close_writer", (1, NO_MATCH)),
    ):
        ls.env(move)


def _commands(outcome: object, kind: type) -> list[object]:
    return [c for c in outcome.commands if isinstance(c, kind)]  # type: ignore[attr-defined]


def test_successor_adopts_the_certified_common_prefix() -> None:
    ls = Lockstep(UNI)
    _warm_predecessor(ls)
    out = ls.env(A("supersede", (0, (1, 3), True)))
    (pin,) = _commands(out, rc.PinCertified)
    assert pin.certificate.pages == (0,)  # block 1 differs (2 vs 3): only block 0 is common
    assert _commands(out, rc.Fence) == [rc.Fence("s0", 0, ("q0",))]
    report = ls.report(0)
    assert _commands(report, rc.Adopt) == [rc.Adopt("s0", 1, (0,))]
    assert _commands(report, rc.Admit) == [rc.Admit("s0", 1, 1, cold=False)]


def test_digest_mismatch_is_released_and_recomputed() -> None:
    ls = Lockstep(UNI)
    _warm_predecessor(ls)
    ls.env(A("supersede", (0, (1, 2), True)))
    ls.env(A("receipt", (0,)))  # the predecessor drains: certified pages are retained by pins
    ls.env(A("corrupt", (1,)))
    report = ls.report(0)
    assert _commands(report, rc.Adopt) == [rc.Adopt("s0", 1, (0,))]
    assert _commands(report, rc.Unpin) == [rc.Unpin((1,), "digest_mismatch")]
    assert _commands(report, rc.Admit) == [rc.Admit("s0", 1, 1, cold=False)]
    assert 1 not in ls.core.pages  # released and freed: the successor recomputes block 1


def test_recycled_block_id_is_caught_by_the_generation() -> None:
    ls = Lockstep(UNI)
    _warm_predecessor(ls)
    ls.env(A("supersede", (0, (1, 2), True)))
    ls.env(A("receipt", (0,)))
    ls.env(A("reuse_id", (0,)))  # same bytes, but the id was recycled underneath us
    report = ls.report(0)
    assert _commands(report, rc.Adopt) == []
    assert _commands(report, rc.Unpin) == [rc.Unpin((0, 1), "generation_changed")]
    assert _commands(report, rc.Admit) == [rc.Admit("s0", 1, 0, cold=False)]


def test_cold_successor_pins_nothing() -> None:
    ls = Lockstep(UNI)
    _warm_predecessor(ls)
    out = ls.env(A("supersede", (0, (1, 2), False)))
    assert _commands(out, rc.PinCertified) == []
    assert _commands(out, rc.Admit) == [rc.Admit("s0", 1, 0, cold=True)]
    assert ls.core.pages and not any(p.pinned for p in ls.core.pages.values())


def test_align_waits_for_an_open_writer_in_the_common_prefix() -> None:
    ls = Lockstep(UNI)
    for move in (
        A("open", (0, (1, 2), True)),
        A("launch", (0, 0, 0)),
        A("allocate", (0, 0, 0)),
        A("attempt_write", (0, 0, True)),
    ):
        ls.env(move)
    out = ls.env(A("supersede", (0, (1, 2), True)))
    assert _commands(out, rc.PinCertified) == [] and _commands(out, rc.Admit) == []
    closed = ls.env(A("close_writer", (0, NO_MATCH)))
    (pin,) = _commands(closed, rc.PinCertified)
    assert pin.certificate.pages == (0,)


def test_chain_collapse_releases_pins_and_leaks_nothing() -> None:
    ls = Lockstep(UNI)
    _warm_predecessor(ls)
    ls.env(A("supersede", (0, (1, 3), True)))
    out = ls.env(A("supersede", (0, (4, 5), True)))  # e+1 never ran; e+2 shares nothing
    assert rc.Unpin((0,), "superseded_before_adoption") in out.commands
    assert _commands(out, rc.Admit) == [rc.Admit("s0", 2, 0, cold=True)]
    late = ls.feed(rc.AdoptionReport("s0", 1, (rc.PageDigest(0, "1"),)), None)
    assert [t.action for t in late.transitions] == ["late_report"]
    ls.env(A("receipt", (0,)))
    assert not ls.core.pages
    for inv in QUIESCENCE:
        if inv.name != "finals_admitted":
            assert inv.holds(ls.I, ls.spec), inv.name


def test_late_frames_are_classified_not_rejected() -> None:
    core = rc.CoreState(ledger_size=1)
    r = rc.Retire(state=core)
    r.handle(rc.Submit("s", "t", "f", (1,)))
    r.handle(rc.ParticipantStarted("s", 0, "a"))
    r.handle(rc.Supersede("s", (2,)))
    drop = r.handle(rc.FrameArrived("s", 0, 1, rc.FrameKind.TOKEN))
    assert drop == [rc.Drop(1, "s", 0, rc.FrameKind.TOKEN, "retired_draining")]
    r.handle(rc.Receipt("s", 0, "a"))
    assert r.handle(rc.FrameArrived("s", 0, 2, rc.FrameKind.COMMIT))[0].reason == "retired_drained"  # type: ignore[union-attr]
    r.handle(rc.ParticipantStarted("s", 1, "b"))
    r.handle(rc.Supersede("s", (3,)))
    r.handle(rc.Receipt("s", 1, "b"))  # the ledger (size 1) now remembers only version 1
    assert r.handle(rc.FrameArrived("s", 0, 3, rc.FrameKind.INSTALL))[0].reason == "retired_expired"  # type: ignore[union-attr]
    r.handle(rc.Cancel("s"))
    assert r.handle(rc.FrameArrived("s", 2, 4, rc.FrameKind.TOKEN))[0].reason == "scope_cancelled"  # type: ignore[union-attr]


def _ready() -> rc.Retire:
    r = rc.Retire()
    r.handle(rc.Submit("s", "t", "f", (1, 2)))
    r.handle(rc.ParticipantStarted("s", 0, "a"))
    r.handle(rc.PageAllocated("s", 0, "a", 7, 0))
    return r


@pytest.mark.parametrize(
    ("event", "error"),
    [
        (rc.Supersede("nope", (1,)), rc.UnknownScopeError),
        (rc.FrameArrived("s", 5, 1, rc.FrameKind.TOKEN), rc.FutureVersionError),
        (rc.Receipt("s", 0, "zz"), rc.UnknownParticipantError),
        (rc.ParticipantStarted("s", 0, "a"), rc.DuplicateParticipantError),
        (rc.PageAllocated("s", 0, "a", 7, 1), rc.PageInUseError),
        (rc.WriterClosed(99, "d"), rc.UnknownPageError),
        (rc.PageReused(7), rc.PageInUseError),
        (rc.Unpause("s"), rc.IllegalTransitionError),
        (rc.Submit("s", "t", "f", ()), rc.ScopeExistsError),
        (rc.AdoptionReport("s", 0, ()), rc.IllegalTransitionError),
    ],
)
def test_bad_input_raises_and_changes_nothing(event: object, error: type) -> None:
    r = _ready()
    before = r.snapshot()
    with pytest.raises(error):
        r.handle(event)  # type: ignore[arg-type]
    assert r.snapshot() is before


_BUILD: dict[str, Callable[[str], object]] = {
    "scope": lambda name: rc.Pause(name),
    "participant": lambda name: rc.ParticipantStarted("s", 0, name),
    "tenant": lambda name: rc.Submit("s", name, "f", ()),
}


@pytest.mark.parametrize("field", sorted(_BUILD))
@pytest.mark.parametrize("name", ["s0\n", "a\nb", "\n"])
def test_a_name_with_a_newline_is_malformed(field: str, name: str) -> None:
    """Found by ``retire_checks.event_fuzz``: the id pattern ended in ``$``, which also matches
    before a final newline, so ``"s0\\n"`` was a valid scope, participant and tenant id."""
    with pytest.raises(rc.MalformedIdError):
        _BUILD[field](name)


def test_a_request_that_arrives_after_a_pause_starts_and_stays_current() -> None:
    """In the serving split a pause can overtake the admitted request on its way to the engine
    core: the request's participant starts (the scheduler withholds it while paused), it is not
    fenced, and after the unpause it runs and publishes as the current version."""
    r = rc.Retire()
    r.handle(rc.Submit("s", "t", "f", (1, 2)))
    r.handle(rc.Pause("s"))
    started = r.handle(rc.ParticipantStarted("s", 0, "a"))
    assert not [c for c in started if isinstance(c, rc.Fence)]
    assert r.state.scopes["s"].participants["a"].closed is False
    assert r.state.scopes["s"].state is rc.ScopeState.PAUSED
    r.handle(rc.Unpause("s"))
    published = r.handle(rc.FrameArrived("s", 0, 1, rc.FrameKind.TOKEN))
    assert [c for c in published if isinstance(c, rc.Publish)]


def test_duplicate_receipt_double_free_and_cancelled_scope() -> None:
    r = _ready()
    r.handle(rc.WriteAttempted("s", 0, "a", 7))
    r.handle(rc.WriterClosed(7, "d"))
    r.handle(rc.Receipt("s", 0, "a"))
    with pytest.raises(rc.DuplicateReceiptError):
        r.handle(rc.Receipt("s", 0, "a"))
    r.handle(rc.Cancel("s"))
    assert 7 not in r.state.pages
    with pytest.raises(rc.DoubleFreeError):
        r.handle(rc.WriterClosed(7, "d"))
    for event in (rc.Supersede("s", (1,)), rc.Pause("s"), rc.ParticipantStarted("s", 1, "b")):
        before = r.snapshot()
        with pytest.raises((rc.ScopeCancelledError, rc.FutureVersionError)):
            r.handle(event)
        assert r.snapshot() is before


@pytest.mark.parametrize(
    "build",
    [
        lambda: rc.Submit("", "t", "f", ()),
        lambda: rc.Submit("a b", "t", "f", ()),
        lambda: rc.Submit("s", "t", "f", [1, 2]),  # type: ignore[arg-type]
        lambda: rc.Submit("s", "t", "f", (1.5,)),  # type: ignore[arg-type]
        lambda: rc.FrameArrived("s", -1, 0, rc.FrameKind.TOKEN),
        lambda: rc.FrameArrived("s", 0, True, rc.FrameKind.TOKEN),
        lambda: rc.PageAllocated("s", 0, "q", -3, 0),
        lambda: rc.Contract(min_reuse_blocks=-1),
    ],
)
def test_malformed_ids_are_rejected_at_construction(build: object) -> None:
    with pytest.raises((rc.MalformedIdError, rc.ContractError)):
        build()  # type: ignore[operator]


def test_deterministic_and_snapshot_restore() -> None:
    def run() -> tuple[list[object], rc.CoreState]:
        ls = lockstep_at("aligning")
        out = ls.report(0)
        return list(out.commands), ls.core

    first, second = run(), run()
    assert first == second and hash(first[1]) == hash(second[1])
    r = rc.Retire(state=first[1])
    snap = r.snapshot()
    r.handle(rc.Cancel("s0"))
    assert r.state != snap
    r.restore(snap)
    assert r.state == snap and r.fingerprint() == hash(snap)


def test_one_log_event_per_transition() -> None:
    r = rc.Retire(logger=structlog.get_logger("test"))
    with capture_logs() as logs:
        r.handle(rc.Submit("s", "t", "f", (1,)))
        r.handle(rc.ParticipantStarted("s", 0, "a"))
        cmds = r.handle(rc.Supersede("s", (2,)))
    assert [entry["transition"] for entry in logs] == [
        "open",
        "launch",
        "supersede",
        "fence",
        "resume",
    ]
    assert all(entry["event"] == "retire.transition" for entry in logs)
    assert logs[2]["changed"] == {"epoch": 1, "state": "aligning", "admitted": False}
    assert [e["seq"] for e in logs] == [1, 2, 3, 4, 5]
    assert rc.Fence("s", 0, ("a",)) in cmds


FORBIDDEN = {
    "vllm",
    "torch",
    "threading",
    "asyncio",
    "time",
    "socket",
    "subprocess",
    "os",
    "io",
    "z3",
}


def forbidden_imports(source: str) -> list[str]:
    """Absolute imports of engine, thread, clock, I/O or solver modules in ``source``."""
    names: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return [n for n in names if n.split(".")[0] in FORBIDDEN]


@pytest.mark.parametrize("package", ["retire_core", "spec"])
def test_core_and_spec_are_sans_io(package: str) -> None:
    offenders = {
        path.name: bad
        for path in (ROOT / package).glob("*.py")
        if (bad := forbidden_imports(path.read_text()))
    }
    assert offenders == {}


def test_sans_io_check_can_fail() -> None:
    source = "import time\nfrom vllm import LLM\nfrom . import gates\nimport attrs\n"
    assert forbidden_imports(source) == ["time", "vllm"]


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("unopened", {0: rc.DropReason.SCOPE_CANCELLED}),
        ("active", {0: None}),
        ("paused", {0: None}),
        ("finished", {0: None}),
        ("aligning", {0: rc.DropReason.RETIRED_VERSION, 1: None}),
        ("cancelled", {0: rc.DropReason.SCOPE_CANCELLED}),
    ],
)
def test_revocation_says_why_a_version_lost_its_authority(
    path: str, expected: dict[int, rc.DropReason | None]
) -> None:
    """The engine ends a request of a version the core no longer lets run with the reason this
    query gives (``superseded`` or ``cancelled``); it is the publication gate's own rule, so a
    revoked version's frames are dropped for the same reason."""
    r = rc.Retire()
    r.restore(lockstep_at(path).core)
    scope = UNI.scopes[0]
    for version, reason in expected.items():
        assert r.revocation(scope, version) is reason
        record = r.state.scopes.get(scope)
        if reason is not None and record is not None:
            for kind in rc.FrameKind:
                assert publication_gate(record, version, kind) == (False, reason)
