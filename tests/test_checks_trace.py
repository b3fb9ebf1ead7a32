"""Trace validation: logs recorded from the real core are accepted, tampered ones rejected at
the first offending line, and ``retire validate-trace`` reports it with documented exit codes."""

from __future__ import annotations

import io
import json
import random
from pathlib import Path
from typing import Any

import pytest
import structlog

import retire_core as rc
from retire_checks import trace_validation
from retire_checks.abstraction import Universe
from retire_checks.environment import Budget, apply_move, env_moves
from retire_checks.lockstep import Lockstep
from retire_checks.scenario import BOUNDS as SCENARIO_BOUNDS
from retire_checks.scenario import SCRIPT
from retire_checks.trace_validation import TraceError, validate_lines
from retire_cli import main
from retire_spec.expr import Interp, Val
from retire_spec.invariants import INVARIANTS, Invariant
from retire_spec.schema import Bounds, SpecState

WALK = Bounds(
    scopes=2,
    parts=3,
    frames=2,
    pages=3,
    positions=2,
    max_epoch=3,
    contexts=((1, 2), (1, 3), (4, 5)),
    fingerprints=(0, 1),
)


def _logging_lockstep(bounds: Bounds, ledger: int = 1024) -> tuple[Lockstep, io.StringIO]:
    """A lock-step harness whose core steps go through ``retire_core.Retire`` with a structlog
    JSON renderer: the log is exactly what an embedding engine would record."""
    buf = io.StringIO()
    log = structlog.wrap_logger(
        structlog.WriteLogger(buf), processors=[structlog.processors.JSONRenderer()]
    )
    retire = rc.Retire(logger=log, ledger_size=ledger)

    def step(state: rc.CoreState, event: Any) -> rc.Step:
        retire.restore(state)
        commands = retire.handle(event)
        return rc.Step(retire.state, tuple(commands), retire.last_transitions)

    ls = Lockstep(Universe.of(bounds), step_fn=step, ledger_size=ledger)
    return ls, buf


def random_trace(seed: int, steps: int = 80) -> list[str]:
    rng = random.Random(seed)
    ls, buf = _logging_lockstep(WALK, ledger=rng.choice((1, 4)))
    budget = Budget(faults=2, partial_writes=True, drafts=seed % 2 == 1)  # odd: speculative
    for _ in range(steps):
        moves = env_moves(ls, budget)
        if not moves:
            break
        apply_move(ls, rng.choice(moves))
    return buf.getvalue().splitlines()


def scenario_trace() -> list[str]:
    """The scripted revision chain: certified handoff, adoption, a digest fault, chain collapse."""
    ls, buf = _logging_lockstep(SCENARIO_BOUNDS)
    for _, move in SCRIPT:
        apply_move(ls, move)
    return buf.getvalue().splitlines()


def _records(lines: list[str]) -> list[dict[str, Any]]:
    return [json.loads(line) for line in lines]


def _pages(record: dict[str, Any]) -> list[Any]:
    """The pages a line names: its ``page``, or its ``pages`` (a transition over several)."""
    return list(record["pages"]) if "pages" in record else [record.get("page")]


def _renumber(lines: list[str]) -> list[str]:
    out = []
    for n, line in enumerate(lines, 1):
        d = json.loads(line)
        d["seq"] = n
        out.append(json.dumps(d))
    return out


def test_random_core_runs_are_behaviours_of_the_spec() -> None:
    transitions = emits = 0
    kinds: set[str] = set()
    for seed in range(60):
        lines = random_trace(seed)
        report = validate_lines(lines)
        transitions += report.transitions
        emits += report.hidden["emit"]
        kinds |= {d["transition"] for d in _records(lines)}
    assert transitions > 2000
    assert emits > 20  # the validator had to place frame emits the log never shows
    # speculative decoding: drafts written, verified, verified again or late (a stutter)
    assert {"write_draft", "verify_drafts", "stale_verify"} <= kinds


def test_scenario_trace_with_adoption_and_fault_is_valid() -> None:
    lines = scenario_trace()
    kinds = {d["transition"] for d in _records(lines)}
    assert {"certify", "adopt", "release", "drop", "publish", "fence_write"} <= kinds
    report = validate_lines(lines)
    assert report.transitions == len(lines)
    assert report.hidden["corrupt"] >= 1  # the digest mismatch is explained by a corruption


def test_a_state_breaking_an_invariant_is_rejected_at_that_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The validator checks every invariant after every line (one compiled body): with a stricter
    invariant that the spec does not keep -- no page is ever pinned -- the scenario trace is
    rejected at its first certification, naming that invariant."""

    def no_page_pinned(I: Interp, st: SpecState) -> Val:
        return I.forall("Page", lambda p: I.not_(I.get(st["page_pinned"], p)))

    lines = scenario_trace()
    first_certify = next(i for i, d in enumerate(_records(lines)) if d["transition"] == "certify")
    stricter = (*INVARIANTS, Invariant("no_page_pinned", "No page is pinned.", no_page_pinned))
    monkeypatch.setattr(trace_validation, "INVARIANTS", stricter)
    with pytest.raises(TraceError) as err:
        validate_lines(lines)
    assert err.value.line == first_certify + 1
    assert "violating ['no_page_pinned']" in err.value.message


def test_frame_published_after_its_version_retired_is_rejected_at_that_line() -> None:
    checked = 0
    for seed in range(80):
        lines = random_trace(seed)
        recs = _records(lines)
        late = [
            i
            for i, d in enumerate(recs)
            if d["transition"] == "drop" and d.get("reason", "").startswith("retired")
        ]
        if not late:
            continue
        i = late[0]
        forged = dict(recs[i], transition="publish", stage="publish")
        forged.pop("reason")
        tampered = [*lines[:i], json.dumps(forged), *lines[i + 1 :]]
        with pytest.raises(TraceError) as err:
            validate_lines(tampered)
        assert err.value.line == i + 1
        assert "only the current version may publish" in err.value.message
        checked += 1
    assert checked >= 10


def test_adoption_before_the_writer_closed_is_rejected() -> None:
    lines = scenario_trace()
    recs = _records(lines)
    adopt = next(i for i, d in enumerate(recs) if d["transition"] == "adopt")
    page = _pages(recs[adopt])[0]
    certify = max(
        i for i in range(adopt) if recs[i]["transition"] == "certify" and page in _pages(recs[i])
    )
    close = max(
        i
        for i in range(certify)
        if recs[i]["transition"] == "close_writer" and recs[i]["page"] == page
    )
    # The writer now closes only after the adoption: ALIGN certified an open-writer page.
    moved = [*lines[:close], *lines[close + 1 : adopt + 1], lines[close], *lines[adopt + 1 :]]
    with pytest.raises(TraceError) as err:
        validate_lines(_renumber(moved))
    assert close < err.value.line <= adopt  # the first line that relied on the closed writer
    assert "writer is still open" in err.value.message


def test_injected_adoption_of_an_open_writer_page_is_rejected_at_that_line() -> None:
    lines = scenario_trace()
    recs = _records(lines)
    alloc = next(i for i, d in enumerate(recs) if d["transition"] == "allocate")
    forged = {
        "seq": 0,
        "trigger": "AdoptionReport",
        "transition": "adopt",
        "stage": "resume",
        "scope": recs[alloc]["scope"],
        "version": recs[alloc]["version"],
        "page": recs[alloc]["page"],
        "position": recs[alloc]["position"],
        "event": "retire.transition",
    }
    tampered = _renumber([*lines[: alloc + 1], json.dumps(forged), *lines[alloc + 1 :]])
    with pytest.raises(TraceError) as err:
        validate_lines(tampered)
    assert err.value.line == alloc + 2
    assert "writer is still open" in err.value.message


def test_adoption_of_a_page_whose_reported_bytes_differ_is_rejected_at_that_line() -> None:
    """The byte check's outcome is in the log (the reported digest of every adopted or released
    page), so a core that adopts despite a mismatch is caught without trusting its comparison:
    here the scenario's failed byte check is forged into an adoption, and a clean adoption's
    reported digest is altered."""
    lines = scenario_trace()
    recs = _records(lines)
    failed = next(
        i
        for i, d in enumerate(recs)
        if d["transition"] == "release" and d.get("reason") == "digest_mismatch"
    )
    assert "digest" in recs[failed]
    forged = {k: v for k, v in recs[failed].items() if k not in ("reason", "changed")}
    forged.update(transition="adopt", changed={"version": recs[failed]["version"]})
    with pytest.raises(TraceError) as err:
        validate_lines([*lines[:failed], json.dumps(forged), *lines[failed + 1 :]])
    assert err.value.line == failed + 1
    assert "a page whose bytes changed was adopted" in err.value.message

    adopt = next(i for i, d in enumerate(recs) if d["transition"] == "adopt")
    altered = dict(recs[adopt], digest="not-the-closed-bytes")
    with pytest.raises(TraceError) as err:
        validate_lines([*lines[:adopt], json.dumps(altered), *lines[adopt + 1 :]])
    assert err.value.line == adopt + 1
    assert "a page whose bytes changed was adopted" in err.value.message


def test_a_line_over_several_pages_is_checked_page_by_page() -> None:
    """A transition over several pages is one line (``pages``, and a list per per-page fact)
    that the validator replays as one spec step per page: the scenario's certification of two
    pages is valid as logged; with its second page's digest forged, or a page certified twice,
    it is rejected at that line, and lists that do not match the pages are malformed."""
    lines = scenario_trace()
    recs = _records(lines)
    i = next(i for i, d in enumerate(recs) if d["transition"] == "certify" and "pages" in d)
    first, second = recs[i]["pages"]
    assert validate_lines(lines).transitions == len(lines)

    def rejected(line: dict[str, Any]) -> str:
        with pytest.raises(TraceError) as err:
            validate_lines([*lines[:i], json.dumps(line), *lines[i + 1 :]])
        assert err.value.line == i + 1
        return err.value.message

    forged = dict(recs[i], digest=[recs[i]["digest"][0], "not-the-closed-bytes"])
    assert f"when page {second!r}'s writer closed" in rejected(forged)
    twice = {k: v + v[-1:] if isinstance(v, list) else v for k, v in recs[i].items()}
    assert twice["pages"] == [first, second, second]
    assert "certify" in rejected(twice) and "the spec does not allow it" in rejected(twice)
    short = dict(recs[i], position=recs[i]["position"][:1])
    assert rejected(short) == "'position' has 1 entries for 2 pages"
    assert "two or more page ids" in rejected(dict(recs[i], pages=[first]))


def test_missing_lines_unknown_ids_and_garbage_are_rejected() -> None:
    lines = scenario_trace()
    with pytest.raises(TraceError, match="seq jumps"):
        validate_lines([*lines[:5], *lines[6:]])
    with pytest.raises(TraceError, match="never opened"):
        validate_lines(_renumber(lines[2:]))
    with pytest.raises(TraceError) as err:
        validate_lines([lines[0], "{not json", *lines[1:]])
    assert err.value.line == 2
    forged = dict(_records(lines)[1], version=7)  # s1 opens at version 0, not 7
    with pytest.raises(TraceError, match="logged version 7"):
        validate_lines([lines[0], json.dumps(forged), *lines[2:]])


def test_validate_trace_cli_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = tmp_path / "good.jsonl"
    good.write_text("\n".join(scenario_trace()) + "\n", encoding="utf-8")
    assert main(["validate-trace", str(good)]) == 0
    assert "valid" in capsys.readouterr().out

    recs = _records(scenario_trace())
    i = next(
        n
        for n, d in enumerate(recs)
        if d["transition"] == "drop" and d.get("reason", "").startswith("retired")
    )
    recs[i]["transition"] = "publish"
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(json.dumps(d) + "\n" for d in recs), encoding="utf-8")
    assert main(["validate-trace", str(bad)]) == 1
    assert capsys.readouterr().out.startswith(f"{bad}:{i + 1}: ")

    assert main(["validate-trace", str(tmp_path / "missing.jsonl")]) == 2
