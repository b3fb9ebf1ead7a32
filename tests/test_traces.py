"""Tests of `retire_bench.traces` and `trace_sources`: format, generator, importer, statistics.

What lives here: the generator reproduces the paper's densest-window statistics (and mutants of it
fail that check), determinism and the shipped default trace, strict loading with line-numbered
errors, exact dump/load round trips (a Hypothesis property), the agent-log importer on the sample
log in `tests/data/`, window selection, token-spec expansion and the CLI. Nothing here drives vLLM;
the replay harness and its measurements are tested elsewhere.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from retire_bench.trace_cli import main
from retire_bench.trace_sources import (
    BurstyParams,
    SessionParams,
    generate_bursty,
    generate_sessions,
    import_agent_log,
    paper_params,
    window,
)
from retire_bench.traces import (
    DEFAULT_SEED,
    DEFAULT_TRACE_PATH,
    PAPER_TARGETS,
    Contract,
    EditContext,
    EventKind,
    FullContext,
    ReusePolicy,
    TokenSpec,
    Trace,
    TraceEvent,
    TraceFormatError,
    bursts_of,
    check_shape,
    dump_trace,
    dumps_trace,
    expand_tokens,
    final_versions,
    load_trace,
    loads_trace,
    materialize,
    materialize_context,
    stats,
    version_numbers,
)
from retire_vllm.identity import common_prefix_len

DATA = Path(__file__).parent / "data"
SAMPLE_LOG = DATA / "agent_log_sample.jsonl"
CONTRACT = Contract()


def _submit(scope: str, t: float, seed: int = 1, length: int = 8) -> TraceEvent:
    return TraceEvent(scope, t, "submit", FullContext(TokenSpec(seed, length)), 4, CONTRACT)


def _revise(scope: str, t: float, keep: int = 0, seed: int = 2, length: int = 8) -> TraceEvent:
    ctx = EditContext(keep, TokenSpec(seed, length))
    return TraceEvent(scope, t, "revision", ctx, 4, CONTRACT)


# --------------------------------------------------------------------------------------------------
# Generator statistics


def test_default_trace_has_the_papers_shape() -> None:
    s = stats(generate_bursty())
    assert (s.scopes, s.revisions, s.bursts, s.finals) == (3, 24, 3, 9)
    assert abs(s.cv - 3.57) <= 0.10 * 3.57
    assert s.submits == 3 and s.pauses == s.unpauses == s.cancels == 0
    assert check_shape(s) == []


@pytest.mark.parametrize("seed", range(30))
def test_every_seed_has_the_papers_shape(seed: int) -> None:
    trace = generate_bursty(seed)
    assert check_shape(stats(trace)) == []
    params = BurstyParams()
    # Each scope starts with a submit at t = 0; everything else is a revision inside the duration.
    assert [e.kind for e in trace.events[:3]] == [EventKind.SUBMIT] * 3
    assert all(e.t == 0.0 for e in trace.events[:3])
    assert all(e.kind is EventKind.REVISION for e in trace.events[3:])
    assert trace.events[3].t > 0.0 and trace.events[-1].t <= params.duration_s
    # Zero prefix overlap, constant prompt length.
    for event in trace.events[3:]:
        assert isinstance(event.context, EditContext)
        assert event.context.keep_prefix_tokens == 0
        assert event.context.new_tokens.length == params.prompt_tokens
    # Every scope is revised in every burst, so each burst contributes one final per scope.
    for burst in bursts_of(trace):
        assert {trace.events[i].scope for i in burst} == {"s0", "s1", "s2"}


def test_paper_scale_parameters() -> None:
    trace = generate_bursty(0, paper_params())
    s = stats(trace)
    assert check_shape(s) == []
    assert s.duration_s <= 120.0
    assert (
        trace.events[0].context is not None and trace.events[0].context.length_after(None) == 8192
    )
    assert trace.params["duration_s"] == 120.0 and trace.params["prompt_tokens"] == 8192


def test_cv_is_time_scale_invariant() -> None:
    small, large = generate_bursty(5), generate_bursty(5, paper_params())
    assert abs(stats(small).cv - stats(large).cv) < 1e-3


def test_prefix_overlap_parameter() -> None:
    trace = generate_bursty(1, attrs.evolve(BurstyParams(), prefix_overlap=0.5, prompt_tokens=64))
    for event in trace.events[3:]:
        assert isinstance(event.context, EditContext)
        assert event.context.keep_prefix_tokens == 32 and event.context.new_tokens.length == 32
    ids = materialize(trace, vocab_size=2048)
    for (scope, version), tokens in ids.items():
        assert len(tokens) == 64
        if version:
            assert common_prefix_len(ids[(scope, version - 1)], tokens) == 32


def test_contract_parameter_is_carried() -> None:
    trace = generate_bursty(2, attrs.evolve(BurstyParams(), reuse="never"))
    assert {e.contract for e in trace.events} == {Contract(reuse=ReusePolicy.NEVER)}


@pytest.mark.parametrize(
    "changes",
    [{"target_cv": 0.5}, {"bursts": 1}, {"revisions": 5}, {"prefix_overlap": 1.5}],
)
def test_unreachable_parameters_raise(changes: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        generate_bursty(0, attrs.evolve(BurstyParams(), **changes))


def test_final_versions_are_the_last_revision_per_scope_and_burst() -> None:
    trace = generate_bursty()
    finals = final_versions(trace)
    assert len(finals) == 9
    assert Counter(scope for scope, _ in finals) == {"s0": 3, "s1": 3, "s2": 3}
    versions = version_numbers(trace)
    for burst in bursts_of(trace):
        for scope in {"s0", "s1", "s2"}:
            last = max(i for i in burst if trace.events[i].scope == scope)
            assert (scope, versions[last]) in finals
    # The very last version of every scope is final.
    for scope in ("s0", "s1", "s2"):
        top = max(v for e, v in zip(trace.events, versions, strict=True) if e.scope == scope)
        assert (scope, top) in finals


# --------------------------------------------------------------------------------------------------
# The statistics check can fail (mutants of the generated trace)


def _mutant(trace: Trace, events: list[TraceEvent]) -> Trace:
    return Trace(name=trace.name, events=events, seed=trace.seed, generator=trace.generator)


def test_dropping_any_revision_fails_the_shape_check() -> None:
    trace = generate_bursty()
    for index, event in enumerate(trace.events):
        if event.kind is EventKind.REVISION:
            mutant = _mutant(trace, [e for i, e in enumerate(trace.events) if i != index])
            assert check_shape(stats(mutant)), f"dropping event {index} went unnoticed"


def test_merging_bursts_fails_the_shape_check() -> None:
    trace = generate_bursty()
    last_burst = bursts_of(trace)[-1]
    shift = trace.events[last_burst[0]].t - trace.events[last_burst[0] - 1].t - 0.01
    events = [
        attrs.evolve(e, t=round(e.t - shift, 6)) if i >= last_burst[0] else e
        for i, e in enumerate(trace.events)
    ]
    problems = check_shape(stats(_mutant(trace, events)))
    assert any(p.startswith("bursts") for p in problems)


def test_evenly_spaced_revisions_fail_the_cv_check() -> None:
    trace = generate_bursty()
    events = [
        attrs.evolve(e, t=0.5 * i) if e.kind is EventKind.REVISION else e
        for i, e in enumerate(trace.events)
    ]
    problems = check_shape(stats(_mutant(trace, events)))
    assert any(p.startswith("cv") for p in problems)


def test_a_dropped_line_in_a_trace_file_is_caught_on_load(tmp_path: Path) -> None:
    lines = dumps_trace(generate_bursty()).splitlines(keepends=True)
    path = tmp_path / "dropped.jsonl"
    path.write_text("".join(lines[:10] + lines[11:]))
    with pytest.raises(TraceFormatError) as info:
        load_trace(path)
    assert info.value.line == 1 and "stats do not match" in str(info.value)


# --------------------------------------------------------------------------------------------------
# Determinism and the shipped trace


def test_generator_is_deterministic() -> None:
    assert dumps_trace(generate_bursty(11)) == dumps_trace(generate_bursty(11))
    assert generate_bursty(11) != generate_bursty(12)


def test_shipped_default_trace_is_the_generated_one() -> None:
    shipped = load_trace(DEFAULT_TRACE_PATH)
    assert shipped == generate_bursty(DEFAULT_SEED)
    assert DEFAULT_TRACE_PATH.read_text() == dumps_trace(shipped)
    assert check_shape(stats(shipped)) == []


def test_session_traces_have_many_scopes_each_revised_in_order() -> None:
    p = SessionParams(scopes=20, revisions=45, duration_s=30.0, prefix_overlap=0.5)
    trace = generate_sessions(3, p)
    s = stats(trace)
    assert (s.scopes, s.submits, s.revisions) == (20, 20, 45)
    assert trace.events == tuple(sorted(trace.events, key=lambda e: e.t))
    assert all(0.0 <= e.t <= p.duration_s for e in trace.events)
    starts = [e.t for e in trace.events if e.kind is EventKind.SUBMIT]
    assert max(starts) <= p.start_fraction * p.duration_s and max(starts) > 0.0
    revisions = [e for e in trace.events if e.kind is EventKind.REVISION]
    assert all(
        isinstance(e.context, EditContext) and e.context.keep_prefix_tokens == 256
        for e in revisions
    )  # the first revision keeps half of 512; later ones half of 512 again (256 + 256 new)
    assert dumps_trace(trace) == dumps_trace(generate_sessions(3, p))
    assert trace != generate_sessions(4, p)


@pytest.mark.parametrize(
    "changes",
    [{"scopes": 0}, {"revisions": -1}, {"duration_s": 0.0}, {"start_fraction": 1.5}],
)
def test_session_parameters_out_of_range_raise(changes: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        generate_sessions(0, SessionParams(**changes))


def test_shipped_sessions_trace_is_the_generated_one(tmp_path: Path) -> None:
    shipped = DEFAULT_TRACE_PATH.parent / "sessions_trace.jsonl"
    assert shipped.read_text() == dumps_trace(generate_sessions(DEFAULT_SEED))
    out = tmp_path / "s.jsonl"
    assert main(["sessions", "--scopes", "5", "--revisions", "7", "--out", str(out)]) == 0
    assert load_trace(out) == generate_sessions(DEFAULT_SEED, SessionParams(scopes=5, revisions=7))


def test_token_expansion_is_pinned() -> None:
    # These ids are part of the format: a replay on another machine must see the same prompts.
    assert expand_tokens(TokenSpec(1, 20), vocab_size=2048) == [
        495, 236, 1264, 1906, 798, 1808, 1182, 532, 1634, 1327,
        1140, 541, 472, 420, 995, 137, 736, 831, 1044, 1762,
    ]  # fmt: skip
    assert expand_tokens(TokenSpec(2**63 - 1, 5), vocab_size=2048, first_id=4) == [
        767, 938, 917, 614, 1545,
    ]  # fmt: skip


def test_materialized_contexts_have_zero_overlap_in_the_default_trace() -> None:
    trace = generate_bursty()
    ids = materialize(trace, vocab_size=2048, first_id=3)
    assert len(ids) == 27
    for (scope, version), tokens in ids.items():
        assert len(tokens) == 512 and all(3 <= t < 2048 for t in tokens)
        if version:
            assert common_prefix_len(ids[(scope, version - 1)], tokens) == 0


@given(
    previous=st.lists(st.integers(0, 2), max_size=12),
    keep=st.integers(0, 12),
    seed=st.integers(0, 2**63 - 1),
    length=st.integers(0, 12),
)
def test_edit_diverges_exactly_after_the_kept_prefix(
    previous: list[int], keep: int, seed: int, length: int
) -> None:
    keep = min(keep, len(previous))
    ids = materialize_context(
        EditContext(keep, TokenSpec(seed, length)), previous, vocab_size=3, first_id=0
    )
    assert len(ids) == keep + length and ids[:keep] == previous[:keep]
    if length and keep < len(previous):
        assert common_prefix_len(previous, ids) == keep


# --------------------------------------------------------------------------------------------------
# Strict loading


def _header_and_events(trace: Trace) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    lines = dumps_trace(trace).splitlines()
    return json.loads(lines[0]), [json.loads(line) for line in lines[1:]]


def _small() -> Trace:
    return Trace(
        name="small",
        events=[_submit("a", 0.0), _submit("b", 0.5), _revise("a", 1.0, keep=3), _revise("b", 2.0)],
        seed=None,
    )


def _text(header: dict[str, Any], events: list[dict[str, Any]]) -> str:
    return "\n".join(json.dumps(x) for x in [header, *events]) + "\n"


Mutation = Callable[[dict[str, Any], list[dict[str, Any]]], str]


def _set(index: int, key: str, value: Any) -> Mutation:
    def mutate(header: dict[str, Any], events: list[dict[str, Any]]) -> str:
        events[index][key] = value
        return _text(header, events)

    return mutate


def _header_set(key: str, value: Any) -> Mutation:
    def mutate(header: dict[str, Any], events: list[dict[str, Any]]) -> str:
        header[key] = value
        return _text(header, events)

    return mutate


BAD_INPUTS: dict[str, tuple[Mutation, int, str]] = {
    "empty": (lambda h, e: "", 1, "header line is required"),
    "header not json": (lambda h, e: "{nope\n" + _text(h, e).split("\n", 1)[1], 1, "bad header"),
    "header is a list": (lambda h, e: "[]\n", 1, "expected a JSON object"),
    "wrong format": (_header_set("format", "other"), 1, "format must be"),
    "future version": (_header_set("format_version", 2), 1, "format_version"),
    "unknown header key": (_header_set("colour", "red"), 1, "unknown colour"),
    "nested generator param": (_header_set("generator", {"a": [1]}), 1, "JSON scalar"),
    "stats tampered": (
        lambda h, e: _text({**h, "stats": {**h["stats"], "revisions": 3}}, e),
        1,
        "stats do not match",
    ),
    "event not json": (
        lambda h, e: _text(h, e[:1]) + "{oops\n" + "".join(json.dumps(x) + "\n" for x in e[2:]),
        3,
        "bad event",
    ),
    "blank line": (
        lambda h, e: _text(h, e[:2]) + "\n" + "".join(json.dumps(x) + "\n" for x in e[2:]),
        4,
        "bad event",
    ),
    "unknown kind": (_set(2, "kind", "restart"), 4, "unknown event kind"),
    "unknown event key": (_set(1, "priority", 3), 3, "unknown priority"),
    "missing t": (
        lambda h, e: _text(h, [e[0], {k: v for k, v in e[1].items() if k != "t"}]),
        3,
        "missing t",
    ),
    "string t": (_set(3, "t", "2.0"), 5, "t must be a number"),
    "nan t": (lambda h, e: _text(h, e).replace('"t": 2.0', '"t": NaN'), 5, "NaN"),
    "negative t": (_set(0, "t", -1.0), 2, ">= 0"),
    "time goes back": (_set(3, "t", 0.25), 5, "before the previous event"),
    "revision before submit": (_set(2, "scope", "c"), 4, "before its submit"),
    "double submit": (_set(1, "scope", "a"), 3, "already submitted"),
    "empty scope": (_set(1, "scope", ""), 3, "non-empty"),
    "submit with edit": (
        _set(0, "context", {"keep_prefix_tokens": 0, "new_tokens": {"seed": 1, "length": 2}}),
        2,
        "full spec",
    ),
    "revision without contract": (
        lambda h, e: _text(h, [*e[:3], {k: v for k, v in e[3].items() if k != "contract"}]),
        5,
        "needs context, max_new_tokens and contract",
    ),
    "keep exceeds previous": (
        _set(2, "context", {"keep_prefix_tokens": 9, "new_tokens": {"seed": 1, "length": 2}}),
        4,
        "exceeds the previous context",
    ),
    "both context forms": (
        _set(2, "context", {"tokens": {"seed": 1, "length": 2}, "keep_prefix_tokens": 0}),
        4,
        "unknown keep_prefix_tokens",
    ),
    "negative length": (_set(0, "context", {"tokens": {"seed": 1, "length": -1}}), 2, ">= 0"),
    "seed too large": (_set(0, "context", {"tokens": {"seed": 2**63, "length": 1}}), 2, "seed"),
    "bool max_new_tokens": (_set(1, "max_new_tokens", True), 3, "must be an integer"),
    "zero max_new_tokens": (_set(1, "max_new_tokens", 0), 3, "max_new_tokens"),
    "approximate equivalence": (
        _set(
            1,
            "contract",
            {"reuse": "auto", "equivalence": "approx", "numerical_mode": "fp32-greedy"},
        ),
        3,
        "equivalence",
    ),
    "unknown reuse": (
        _set(
            1,
            "contract",
            {"reuse": "maybe", "equivalence": "exact", "numerical_mode": "fp32-greedy"},
        ),
        3,
        "maybe",
    ),
    "pause with context": (
        lambda h, e: _text(h, [*e[:2], {**e[2], "kind": "pause"}, *e[3:]]),
        4,
        "carries no context",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_raises_with_line_number(case: str, tmp_path: Path) -> None:
    mutate, line, fragment = BAD_INPUTS[case]
    header, events = _header_and_events(_small())
    path = tmp_path / "bad.jsonl"
    path.write_text(mutate(header, events))
    with pytest.raises(TraceFormatError) as info:
        load_trace(path)
    assert info.value.line == line, str(info.value)
    assert f"{path}:{line}: " in str(info.value)
    assert fragment in str(info.value)


LIFECYCLE_ERRORS: dict[str, tuple[list[TraceEvent], int, str]] = {
    "event after cancel": (
        [_submit("a", 0.0), TraceEvent("a", 1.0, "cancel"), _revise("a", 2.0)],
        4,
        "after its cancel",
    ),
    "unpause without pause": (
        [_submit("a", 0.0), TraceEvent("a", 1.0, "unpause")],
        3,
        "not paused",
    ),
    "double pause": (
        [_submit("a", 0.0), TraceEvent("a", 1.0, "pause"), TraceEvent("a", 1.0, "pause")],
        4,
        "already paused",
    ),
    "revision while paused": (
        [_submit("a", 0.0), TraceEvent("a", 1.0, "pause"), _revise("a", 2.0)],
        4,
        "unpause it first",
    ),
}


@pytest.mark.parametrize("case", sorted(LIFECYCLE_ERRORS))
def test_lifecycle_errors_carry_the_line_the_event_would_have(case: str) -> None:
    events, line, fragment = LIFECYCLE_ERRORS[case]
    with pytest.raises(TraceFormatError) as info:
        Trace(name="x", events=events)
    assert info.value.line == line and fragment in str(info.value)
    # The same events loaded from text fail at the same line.
    header = {
        "format": "retire-trace",
        "format_version": 1,
        "name": "x",
        "seed": None,
        "generator": {},
        "stats": {},
    }
    text = _text(header, [e.to_json() for e in events])
    with pytest.raises(TraceFormatError) as info:
        loads_trace(text)
    assert info.value.line == line


def test_pause_cancel_lifecycle_is_valid() -> None:
    events = [
        _submit("a", 0.0),
        TraceEvent("a", 1.0, "pause"),
        TraceEvent("a", 1.5, "unpause"),
        _revise("a", 2.0),
        TraceEvent("a", 2.5, "pause"),
        TraceEvent("a", 3.0, "cancel"),
    ]
    trace = Trace(name="life", events=events)
    assert loads_trace(dumps_trace(trace)) == trace
    assert version_numbers(trace) == [0, 0, 0, 1, 1, 1]


# --------------------------------------------------------------------------------------------------
# Round trips


SCOPE_TEXT = st.text(st.characters(codec="utf-8"), min_size=1, max_size=6)
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(st.characters(codec="utf-8"), max_size=6)
)


@st.composite
def valid_traces(draw: st.DrawFn) -> Trace:
    lengths: dict[str, int] = {}
    paused: set[str] = set()
    cancelled: set[str] = set()
    events: list[TraceEvent] = []
    t = 0.0
    for _ in range(draw(st.integers(0, 20))):
        t += draw(st.floats(0.0, 1e4, allow_nan=False, allow_infinity=False))
        live = sorted(s for s in lengths if s not in cancelled)
        scope = draw(st.sampled_from([None, *live]))
        contract = Contract(reuse=draw(st.sampled_from(list(ReusePolicy))))
        max_new = draw(st.integers(1, 4096))
        spec = TokenSpec(draw(st.integers(0, 2**63 - 1)), draw(st.integers(0, 9000)))
        if scope is None:
            scope = draw(SCOPE_TEXT.filter(lambda s: s not in lengths))
            lengths[scope] = spec.length
            events.append(TraceEvent(scope, t, "submit", FullContext(spec), max_new, contract))
            continue
        kinds = ["cancel", "unpause"] if scope in paused else ["revision", "pause", "cancel"]
        kind = draw(st.sampled_from(kinds))
        if kind == "revision":
            ctx: FullContext | EditContext
            if draw(st.booleans()):
                ctx = FullContext(spec)
            else:
                ctx = EditContext(draw(st.integers(0, lengths[scope])), spec)
            lengths[scope] = ctx.length_after(lengths[scope])
            events.append(TraceEvent(scope, t, kind, ctx, max_new, contract))
            continue
        events.append(TraceEvent(scope, t, kind))
        if kind == "pause":
            paused.add(scope)
        elif kind == "unpause":
            paused.discard(scope)
        else:
            cancelled.add(scope)
    return Trace(
        name=draw(st.text(st.characters(codec="utf-8"), max_size=10)),
        events=events,
        seed=draw(st.none() | st.integers(0, 2**63 - 1)),
        generator=draw(st.dictionaries(SCOPE_TEXT, SCALARS, max_size=4)),
    )


@settings(max_examples=200, deadline=None)
@given(valid_traces())
def test_dump_load_round_trip(trace: Trace) -> None:
    text = dumps_trace(trace)
    loaded = loads_trace(text)
    assert loaded == trace
    assert dumps_trace(loaded) == text
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.jsonl"
        dump_trace(trace, path)
        assert load_trace(path) == trace


def test_generated_trace_round_trips(tmp_path: Path) -> None:
    trace = generate_bursty(3, paper_params())
    dump_trace(trace, tmp_path / "t.jsonl")
    assert load_trace(tmp_path / "t.jsonl") == trace


# --------------------------------------------------------------------------------------------------
# Agent-log importer and windows


def test_sample_log_imports_and_round_trips(tmp_path: Path) -> None:
    trace = import_agent_log(SAMPLE_LOG)
    s = stats(trace)
    # 3 dense sessions (24 revisions in the window + 1 earlier), a sparse one with 2 revisions
    # (a doubled abort counts once) and one that never revises.
    assert (s.scopes, s.submits, s.revisions) == (5, 5, 27)
    assert trace.events[0].t == 0.0
    path = tmp_path / "imported.jsonl"
    dump_trace(trace, path)
    assert load_trace(path) == trace
    assert path.read_text() == dumps_trace(trace)


def test_densest_window_of_the_sample_has_the_papers_shape(tmp_path: Path) -> None:
    trace = window(import_agent_log(SAMPLE_LOG), 120.0)
    s = stats(trace)
    assert check_shape(s) == [], check_shape(s)
    assert set(trace.scopes) == {"sess-a", "sess-b", "sess-c"}
    assert all(0.0 <= e.t <= 120.0 for e in trace.events)
    assert [e.kind for e in trace.events[:3]] == [EventKind.SUBMIT] * 3
    dump_trace(trace, tmp_path / "w.jsonl")
    assert load_trace(tmp_path / "w.jsonl") == trace


def _log(tmp_path: Path, records: list[dict[str, Any] | str]) -> Path:
    path = tmp_path / "log.jsonl"
    lines = [r if isinstance(r, str) else json.dumps(r) for r in records]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_importer_semantics(tmp_path: Path) -> None:
    path = _log(
        tmp_path,
        [
            {"timestamp": 1000.0, "session_id": "x", "type": "turn_aborted"},  # before any task
            {"timestamp": "1970-01-01T00:16:50Z", "session_id": "x", "type": "task_started"},
            {"timestamp": 1012, "session_id": "x", "type": "task_started"},  # no abort: ignored
            {"timestamp": "1970-01-01T01:17:00+01:00", "session_id": "x", "type": "turn_aborted"},
            {"timestamp": 1021.0, "session_id": "x", "type": "turn_aborted"},
            {"timestamp": "1970-01-01T00:17:05", "session_id": "x", "type": "task_started"},
            {"timestamp": 1026.0, "scope": "y", "type": "task_started", "extra": [1, 2]},
            {"timestamp": 1027.0, "scope": "y", "type": "tool_call"},
            {"timestamp": 1030.0, "scope": "y", "type": "task_complete"},
            {"timestamp": 1029.0, "scope": "y", "type": "turn_aborted"},  # out of file order
        ],
    )
    trace = import_agent_log(path, prompt_tokens=16, prefix_overlap=0.25, max_new_tokens=8)
    got = [(e.scope, e.t, e.kind.value) for e in trace.events]
    assert got == [("x", 0.0, "submit"), ("x", 15.0, "revision"), ("y", 16.0, "submit")]
    revision = trace.events[1]
    assert revision.context == EditContext(4, revision.context.new_tokens)  # type: ignore[union-attr]
    assert revision.max_new_tokens == 8
    assert trace.params["generator"] == "agent-log"


@pytest.mark.parametrize(
    ("record", "fragment"),
    [
        ("{not json", "Expecting"),
        ('["a"]', "expected a JSON object"),
        ({"session_id": "x", "type": "task_started"}, "timestamp"),
        ({"timestamp": "yesterday", "session_id": "x", "type": "task_started"}, "ISO-8601"),
        ({"timestamp": True, "session_id": "x", "type": "task_started"}, "bool"),
        ({"timestamp": 1.0, "type": "task_started"}, "session_id"),
        ({"timestamp": 1.0, "session_id": "x", "scope": "y", "type": "task_started"}, "disagree"),
        ({"timestamp": 1.0, "session_id": "x", "type": 3}, "type must be a string"),
    ],
)
def test_importer_rejects_bad_records_with_line_numbers(
    tmp_path: Path, record: dict[str, Any] | str, fragment: str
) -> None:
    good = {"timestamp": 0.0, "session_id": "x", "type": "task_started"}
    path = _log(tmp_path, [good, good, record])
    with pytest.raises(TraceFormatError) as info:
        import_agent_log(path)
    assert info.value.line == 3 and fragment in str(info.value)


def test_window_keeps_pause_pairs_across_its_start() -> None:
    events = [
        _submit("a", 0.0),
        _submit("b", 0.0),
        _revise("b", 1.0),
        TraceEvent("a", 40.0, "pause"),
        TraceEvent("a", 55.0, "unpause"),
        _revise("a", 60.0, keep=4),
        _revise("b", 61.0),
        _revise("a", 62.0, keep=8),
        TraceEvent("b", 62.5, "cancel"),
        _revise("a", 200.0),
    ]
    trace = Trace(name="p", events=events, seed=9)
    w = window(trace, 10.0)
    assert stats(w).revisions == 3
    kinds = [(e.scope, e.kind.value) for e in w.events]
    assert kinds == [
        ("a", "submit"),
        ("b", "submit"),
        ("a", "pause"),
        ("a", "unpause"),
        ("a", "revision"),
        ("b", "revision"),
        ("a", "revision"),
        ("b", "cancel"),
    ]
    # Windowed times are rebased; the first version of "b" there was a revision, so re-seeded.
    assert w.events[1].context == FullContext(TokenSpec(w.events[1].context.tokens.seed, 8))  # type: ignore[union-attr]
    assert w.params["window_s"] == 10.0
    assert loads_trace(dumps_trace(w)) == w


def test_window_rejects_traces_without_revisions() -> None:
    with pytest.raises(ValueError):
        window(Trace(name="n", events=[_submit("a", 0.0)]), 5.0)


# --------------------------------------------------------------------------------------------------
# CLI


def test_cli_generate_and_stats(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "g.jsonl"
    assert main(["generate", "--seed", "4", "--out", str(out)]) == 0
    assert load_trace(out) == generate_bursty(4)
    capsys.readouterr()
    assert main(["stats", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["revisions"] == 24 and printed["shape_problems"] == []
    assert len(printed["final_versions"]) == 9


def test_cli_reports_bad_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{}\n")
    assert main(["stats", str(bad)]) == 1
    assert f"{bad}:1:" in capsys.readouterr().err


def test_cli_import_window(tmp_path: Path) -> None:
    out = tmp_path / "w.jsonl"
    assert main(["import", str(SAMPLE_LOG), "--window", "120", "--out", str(out)]) == 0
    assert check_shape(stats(load_trace(out))) == []


def test_module_entry_point(tmp_path: Path) -> None:
    out = tmp_path / "m.jsonl"
    result = subprocess.run(
        [sys.executable, "-m", "retire_bench.traces", "generate", "--paper", "--out", str(out)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert load_trace(out) == generate_bursty(DEFAULT_SEED, paper_params())
    assert PAPER_TARGETS["revisions"] == 24


def test_docs_example_loads() -> None:
    docs = Path(__file__).parent.parent / "docs" / "traces.md"
    text = docs.read_text().split("```json\n", 1)[1].split("```", 1)[0]
    trace = loads_trace(text, source="docs/traces.md")
    ids = materialize(trace, vocab_size=2048)
    assert common_prefix_len(ids[("s0", 0)], ids[("s0", 1)]) == 384
