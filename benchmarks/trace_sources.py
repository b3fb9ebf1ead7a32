"""Where revision traces come from: the seeded generator of the paper's densest window and the
importer of recorded agent session logs, with densest-window selection.

`generate_bursty` draws a trace of `BurstyParams` (3 scopes, 24 revisions in 3 bursts, inter-arrival
CV 3.57 by default; `paper_params()` for the paper's 120 s and 8,192-token prompts);
`generate_sessions` draws many scopes at a lower density (`SessionParams`: the shape of the
paper's month, about 2.2 revisions per scope, revisions keeping half the context);
`import_agent_log` turns a JSON-lines agent log into a trace, and `window` keeps its densest window.
Both build contexts the same way (a full first context, then edits keeping a prefix). The format
itself, its loader and dumper, statistics and token expansion live in `traces`; nothing here
drives an engine.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import attrs

from retire_bench.traces import (
    _MAX_SCOPE_LEN,
    BURST_GAP_FACTOR,
    DEFAULT_SEED,
    VERSION_KINDS,
    ContextSpec,
    Contract,
    EditContext,
    EventKind,
    FullContext,
    ReusePolicy,
    Scalar,
    TokenSpec,
    Trace,
    TraceEvent,
    TraceFormatError,
    _parse_object,
    derive_seed,
    stats,
    version_numbers,
)

# --------------------------------------------------------------------------------------------------
# Contexts shared by the generator and the importer


def _first_context(seed: int, scope: str, prompt_tokens: int) -> FullContext:
    return FullContext(TokenSpec(derive_seed("ctx", seed, scope, 0), prompt_tokens))


def _next_context(
    seed: int, scope: str, version: int, previous_length: int, prompt_tokens: int, overlap: float
) -> EditContext:
    keep = min(previous_length, math.floor(overlap * previous_length))
    return EditContext(
        keep_prefix_tokens=keep,
        new_tokens=TokenSpec(
            derive_seed("ctx", seed, scope, version), max(prompt_tokens - keep, 0)
        ),
    )


def _check_overlap(prefix_overlap: float) -> None:
    if not 0.0 <= prefix_overlap <= 1.0:
        raise ValueError(f"prefix_overlap must be in [0, 1], got {prefix_overlap}")


# --------------------------------------------------------------------------------------------------
# Generator


def _header_params(generator: str, params: Any) -> dict[str, Scalar]:
    """A generator's parameters as the trace header's `generator` object."""
    out: dict[str, Scalar] = {"generator": generator}
    for key, value in attrs.asdict(params).items():
        out[key] = value.value if isinstance(value, ReusePolicy) else value
    return out


@attrs.frozen
class BurstyParams:
    """Parameters of `generate_bursty`: defaults fit the CPU tiny model; see `paper_params()`."""

    scopes: int = 3
    revisions: int = 24
    bursts: int = 3
    target_cv: float = 3.57
    duration_s: float = 12.0
    prompt_tokens: int = 512
    prefix_overlap: float = 0.0
    max_new_tokens: int = 64
    #: Mean gap between revisions inside a burst, as a fraction of `duration_s`.
    intra_gap_fraction: float = 0.003
    reuse: ReusePolicy = attrs.field(default=ReusePolicy.AUTO, converter=ReusePolicy)

    def to_params(self) -> dict[str, Scalar]:
        return _header_params("bursty", self)


def paper_params() -> BurstyParams:
    """The paper's densest window: 120 s and an 8192-token prompt."""
    return BurstyParams(duration_s=120.0, prompt_tokens=8192)


_MAX_ATTEMPTS: Final = 500


def _inter_gap_weights(rng: random.Random, count: int, q: float) -> list[float] | None:
    """Positive weights summing to 1 whose squares sum to `q`, or None if out of reach."""
    if count == 1:
        return [1.0] if math.isclose(q, 1.0, rel_tol=1e-9) else None
    if not 1.0 / count < q < 1.0:
        return None
    raw = [rng.uniform(0.5, 1.5) for _ in range(count)]
    base = [r / sum(raw) for r in raw]
    q0 = sum(b * b for b in base)
    if q0 <= q:  # move toward the one-hot at the largest weight: sum of squares rises to 1
        k = max(range(count), key=base.__getitem__)
        target = [1.0 if i == k else 0.0 for i in range(count)]
    else:  # move toward the uniform weights: sum of squares falls to 1/count
        target = [1.0 / count] * count
    d = [t - b for t, b in zip(target, base, strict=True)]
    a = sum(x * x for x in d)
    b_ = 2.0 * sum(x * y for x, y in zip(base, d, strict=True))
    c = q0 - q
    disc = b_ * b_ - 4.0 * a * c
    if a == 0.0 or disc < 0.0:
        return None
    roots = [(-b_ - math.sqrt(disc)) / (2 * a), (-b_ + math.sqrt(disc)) / (2 * a)]
    lam = next((r for r in sorted(roots) if -1e-12 <= r <= 1.0 + 1e-12), None)
    if lam is None:
        return None
    weights = [x + lam * y for x, y in zip(base, d, strict=True)]
    return weights if min(weights) > 0.0 else None


def _attempt(params: BurstyParams, rng: random.Random) -> list[tuple[float, int]] | None:
    """One draw of (time, scope index) for every revision, or None if the draw misses the target."""
    p = params
    sizes = [p.scopes] * p.bursts
    for _ in range(p.revisions - p.scopes * p.bursts):
        sizes[rng.randrange(p.bursts)] += 1
    order: list[list[int]] = []
    for size in sizes:
        members = list(range(p.scopes)) + [rng.randrange(p.scopes) for _ in range(size - p.scopes)]
        rng.shuffle(members)
        order.append(members)
    mean_intra = p.intra_gap_fraction * p.duration_s
    intra = [[rng.expovariate(1.0 / mean_intra) for _ in range(size - 1)] for size in sizes]
    t_first = p.duration_s * rng.uniform(0.03, 0.08)
    t_last = p.duration_s * rng.uniform(0.85, 0.95)
    span = t_last - t_first
    flat = [g for gaps in intra for g in gaps]
    inter_total = span - sum(flat)
    if inter_total <= 0.0:
        return None
    n = p.revisions - 1
    want_sq = (p.target_cv**2 + 1.0) * span * span / n
    q = (want_sq - sum(g * g for g in flat)) / (inter_total * inter_total)
    weights = _inter_gap_weights(rng, p.bursts - 1, q)
    if weights is None:
        return None
    # Keep the intended bursts: every gap inside a burst clearly below the detection threshold
    # (`BURST_GAP_FACTOR` x mean gap), every gap between bursts clearly above it.
    threshold = BURST_GAP_FACTOR * span / n
    if (flat and max(flat) >= 0.9 * threshold) or min(weights) * inter_total <= 1.1 * threshold:
        return None
    out: list[tuple[float, int]] = []
    t = t_first
    for b, members in enumerate(order):
        if b > 0:
            t += weights[b - 1] * inter_total
        for i, scope in enumerate(members):
            if i > 0:
                t += intra[b][i - 1]
            out.append((round(t, 6), scope))
    return out


def generate_bursty(seed: int = DEFAULT_SEED, params: BurstyParams | None = None) -> Trace:
    """The densest-window trace for `seed`: deterministic, shaped as `params` asks.

    Model (details in `docs/traces.md`): every scope is submitted at t = 0; revisions come in
    `bursts` bursts, each revising every scope at least once; gaps inside a burst are exponential
    with mean `intra_gap_fraction * duration_s`; the first revision falls in [3 %, 8 %] and the
    last in [85 %, 95 %] of `duration_s`; the gaps between bursts are then solved so the
    inter-arrival CV equals `target_cv`. Draws that miss (a gap breaking the burst structure, an
    unreachable CV) are redrawn from the next derived seed; the attempt used is recorded.
    """
    p = params or BurstyParams()
    if p.scopes < 1 or p.bursts < 2 or p.revisions < p.scopes * p.bursts:
        raise ValueError("need scopes >= 1, bursts >= 2 and revisions >= scopes * bursts")
    if p.duration_s <= 0.0 or p.intra_gap_fraction <= 0.0 or p.target_cv <= 0.0:
        raise ValueError("duration_s, intra_gap_fraction and target_cv must be positive")
    if p.prompt_tokens < 1 or p.max_new_tokens < 1:
        raise ValueError("prompt_tokens and max_new_tokens must be >= 1")
    _check_overlap(p.prefix_overlap)
    contract = Contract(reuse=p.reuse)
    scope_ids = [f"s{i}" for i in range(p.scopes)]
    for attempt in range(_MAX_ATTEMPTS):
        draws = _attempt(p, random.Random(derive_seed("bursty", seed, attempt)))
        if draws is None:
            continue
        events: list[TraceEvent] = []
        lengths: dict[str, int] = {}
        versions: dict[str, int] = {}
        for scope in scope_ids:
            ctx = _first_context(seed, scope, p.prompt_tokens)
            lengths[scope], versions[scope] = ctx.length, 0
            events.append(TraceEvent(scope, 0.0, EventKind.SUBMIT, ctx, p.max_new_tokens, contract))
        for t, index in draws:
            scope = scope_ids[index]
            versions[scope] += 1
            edit = _next_context(
                seed, scope, versions[scope], lengths[scope], p.prompt_tokens, p.prefix_overlap
            )
            lengths[scope] = edit.length_after(lengths[scope])
            events.append(
                TraceEvent(scope, t, EventKind.REVISION, edit, p.max_new_tokens, contract)
            )
        trace = Trace(
            name=f"bursty-seed{seed}",
            events=events,
            seed=seed,
            generator={**p.to_params(), "attempt": attempt},
        )
        s = stats(trace)
        if (
            s.bursts == p.bursts
            and s.finals == p.bursts * p.scopes
            and abs(s.cv - p.target_cv) <= 1e-3 * p.target_cv
        ):
            return trace
    raise ValueError(f"no draw in {_MAX_ATTEMPTS} attempts reaches these parameters: {p}")


@attrs.frozen
class SessionParams:
    """Parameters of `generate_sessions`: many agent sessions at a lower density, the shape of
    the paper's month (751 revisions across 345 scopes: about 2.2 per scope) at this machine's
    scale. Defaults: 32 scopes, 70 revisions, starts spread over the first 70 % of 40 s."""

    scopes: int = 32
    revisions: int = 70
    duration_s: float = 40.0
    #: Sessions start uniformly in the first `start_fraction` of `duration_s`.
    start_fraction: float = 0.7
    #: Mean gap from a version to its revision (exponential): a user interrupting a running call.
    revision_gap_s: float = 1.0
    prompt_tokens: int = 512
    prefix_overlap: float = 0.5
    max_new_tokens: int = 64
    reuse: ReusePolicy = attrs.field(default=ReusePolicy.AUTO, converter=ReusePolicy)

    def to_params(self) -> dict[str, Scalar]:
        return _header_params("sessions", self)


def generate_sessions(seed: int = DEFAULT_SEED, params: SessionParams | None = None) -> Trace:
    """Many scopes at a lower density, deterministic for `seed`.

    Every scope is one agent session: submitted at a uniform time in the first `start_fraction`
    of `duration_s`, then revised a number of times (the `revisions` assigned to uniformly random
    scopes, so some sessions are never revised and a few many times), each revision an
    exponential gap (mean `revision_gap_s`) after the previous version, keeping
    `floor(prefix_overlap * length)` tokens of its context; times past `duration_s` are clamped
    to it. Unlike `generate_bursty` no target CV is solved for: the bursts are whatever
    overlapping sessions make (the statistics say).
    """
    p = params or SessionParams()
    if p.scopes < 1 or p.revisions < 0:
        raise ValueError("need scopes >= 1 and revisions >= 0")
    if p.duration_s <= 0.0 or p.revision_gap_s <= 0.0 or not 0.0 <= p.start_fraction <= 1.0:
        raise ValueError("duration_s and revision_gap_s must be positive, start_fraction in [0, 1]")
    if p.prompt_tokens < 1 or p.max_new_tokens < 1:
        raise ValueError("prompt_tokens and max_new_tokens must be >= 1")
    _check_overlap(p.prefix_overlap)
    rng = random.Random(derive_seed("sessions", seed))
    contract = Contract(reuse=p.reuse)
    scope_ids = [f"s{i}" for i in range(p.scopes)]
    counts = [0] * p.scopes
    for _ in range(p.revisions):
        counts[rng.randrange(p.scopes)] += 1
    timed: list[tuple[float, int, TraceEvent]] = []
    for scope, count in zip(scope_ids, counts, strict=True):
        t = round(rng.uniform(0.0, p.start_fraction * p.duration_s), 6)
        ctx = _first_context(seed, scope, p.prompt_tokens)
        length = ctx.length
        timed.append(
            (t, 0, TraceEvent(scope, t, EventKind.SUBMIT, ctx, p.max_new_tokens, contract))
        )
        for version in range(1, count + 1):
            t = round(min(p.duration_s, t + rng.expovariate(1.0 / p.revision_gap_s)), 6)
            edit = _next_context(seed, scope, version, length, p.prompt_tokens, p.prefix_overlap)
            length = edit.length_after(length)
            event = TraceEvent(scope, t, EventKind.REVISION, edit, p.max_new_tokens, contract)
            timed.append((t, version, event))
    timed.sort(key=lambda x: (x[0], x[1]))  # stable: a scope's versions stay in order
    return Trace(
        name=f"sessions-seed{seed}",
        events=[event for _, _, event in timed],
        seed=seed,
        generator=p.to_params(),
    )


# --------------------------------------------------------------------------------------------------
# Agent-log importer and window selection


def _timestamp(value: Any) -> float:
    if isinstance(value, bool):
        raise ValueError("timestamp must be ISO-8601 text or epoch seconds, not a bool")
    if isinstance(value, int | float):
        if not math.isfinite(value):
            raise ValueError("timestamp must be finite")
        return float(value)
    if isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError as exc:
            raise ValueError(f"timestamp {value!r} is not ISO-8601") from exc
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=UTC)
        return parsed.timestamp()
    raise ValueError(f"timestamp must be ISO-8601 text or epoch seconds, got {value!r}")


def _session(obj: Mapping[str, Any]) -> str:
    ids = {obj[k] for k in ("session_id", "scope") if k in obj}
    if not ids:
        raise ValueError("record needs a session_id or scope")
    if len(ids) > 1:
        raise ValueError("session_id and scope disagree")
    (value,) = ids
    if not isinstance(value, str) or not value or len(value) > _MAX_SCOPE_LEN:
        raise ValueError("session_id/scope must be a non-empty string")
    return value


def import_agent_log(
    path: str | Path,
    *,
    seed: int = DEFAULT_SEED,
    prompt_tokens: int = 512,
    prefix_overlap: float = 0.0,
    max_new_tokens: int = 64,
    contract: Contract | None = None,
    name: str | None = None,
) -> Trace:
    """A trace from a recorded agent session log (JSON lines).

    Each record needs `timestamp` (ISO-8601, naive = UTC, or epoch seconds), `session_id` or
    `scope`, and `type`. Per session, in time order: the first `task_started` is a `submit`; a
    `task_started` after one or more `turn_aborted` is one `revision` at the `task_started` time;
    every other record is ignored. Time offsets count from the earliest emitted event. Contexts are
    synthetic (the log has none): `prompt_tokens` tokens per version, the successor keeping
    `floor(prefix_overlap * length)` tokens of its predecessor.
    """
    path = Path(path)
    _check_overlap(prefix_overlap)
    contract = contract or Contract()
    records: list[tuple[float, int, str, str]] = []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                obj = _parse_object(line)
                if "timestamp" not in obj or "type" not in obj:
                    raise ValueError("record needs timestamp and type")
                if not isinstance(obj["type"], str):
                    raise ValueError("type must be a string")
                records.append((_timestamp(obj["timestamp"]), number, _session(obj), obj["type"]))
            except ValueError as exc:
                raise TraceFormatError(str(exc), line=number, source=str(path)) from exc
    records.sort()
    emitted: list[tuple[float, str, EventKind]] = []
    started: set[str] = set()
    aborted: set[str] = set()
    for ts, _number, session, kind in records:
        if kind == "turn_aborted" and session in started:
            aborted.add(session)
        elif kind == "task_started":
            if session not in started:
                started.add(session)
                emitted.append((ts, session, EventKind.SUBMIT))
            elif session in aborted:
                aborted.discard(session)
                emitted.append((ts, session, EventKind.REVISION))
    origin = emitted[0][0] if emitted else 0.0
    events: list[TraceEvent] = []
    lengths: dict[str, int] = {}
    versions: dict[str, int] = {}
    for ts, session, kind in emitted:
        t = round(ts - origin, 6)
        ctx: ContextSpec
        if kind is EventKind.SUBMIT:
            ctx = _first_context(seed, session, prompt_tokens)
            versions[session] = 0
        else:
            versions[session] += 1
            ctx = _next_context(
                seed, session, versions[session], lengths[session], prompt_tokens, prefix_overlap
            )
        lengths[session] = ctx.length_after(lengths.get(session))
        events.append(TraceEvent(session, t, kind, ctx, max_new_tokens, contract))
    return Trace(
        name=name or path.stem,
        events=events,
        seed=seed,
        generator={
            "generator": "agent-log",
            "log": path.name,
            "origin_epoch_s": origin,
            "prompt_tokens": prompt_tokens,
            "prefix_overlap": prefix_overlap,
            "max_new_tokens": max_new_tokens,
            "reuse": contract.reuse.value,
        },
    )


def window(trace: Trace, seconds: float) -> Trace:
    """The densest window of length `seconds`: the most revisions, the earliest such on ties.

    The window is centred on its revisions (the slack `seconds - span` split evenly) and rebased so
    that it starts at t = 0. Only scopes revised inside the window appear. Each gets a `submit`
    standing for the version current just before its first windowed revision, at that version's
    rebased time (clamped to 0); if that version was a revision, its context is re-seeded as a
    full spec of the same length. A scope paused at that point is paused again right after its
    submit. Later events of those scopes inside the window follow unchanged (rebased).
    """
    if not seconds > 0.0 or not math.isfinite(seconds):
        raise ValueError("seconds must be positive and finite")
    rev = [i for i, e in enumerate(trace.events) if e.kind is EventKind.REVISION]
    if not rev:
        raise ValueError("the trace has no revisions")
    times = [trace.events[i].t for i in rev]
    best, best_lo, hi = 0, 0, 0
    for lo in range(len(times)):
        hi = max(hi, lo)
        while hi + 1 < len(times) and times[hi + 1] - times[lo] <= seconds:
            hi += 1
        if hi - lo + 1 > best:
            best, best_lo = hi - lo + 1, lo
    first, last = times[best_lo], times[best_lo + best - 1]
    start = first - (seconds - (last - first)) / 2.0
    end = start + seconds
    chosen = rev[best_lo : best_lo + best]
    in_window = set(chosen)
    first_rev: dict[str, int] = {}
    for i in chosen:
        first_rev.setdefault(trace.events[i].scope, i)
    versions = version_numbers(trace)
    keyed: list[tuple[float, int, TraceEvent]] = []
    for scope, first_index in first_rev.items():
        base = max(
            i
            for i in range(first_index)
            if trace.events[i].scope == scope and trace.events[i].kind in VERSION_KINDS
        )
        base_event = trace.events[base]
        assert base_event.context is not None
        ctx = base_event.context
        if not isinstance(ctx, FullContext):
            length = _context_length(trace, scope, versions[base])
            ctx = FullContext(
                TokenSpec(derive_seed("window", trace.seed, scope, versions[base]), length)
            )
        t0 = round(max(0.0, base_event.t - start), 6)
        keyed.append((t0, base, attrs.evolve(base_event, t=t0, kind=EventKind.SUBMIT, context=ctx)))
        # The scope is unpaused at `first_index` (a revision needs that), so any pause/unpause
        # between `base` and the window start comes in pairs; clamped to 0 they stay valid.
        for i in range(base + 1, len(trace.events)):
            event = trace.events[i]
            if event.t > end:
                break
            if event.scope == scope and (event.kind is not EventKind.REVISION or i in in_window):
                t = round(max(0.0, event.t - start), 6)
                keyed.append((t, i, attrs.evolve(event, t=t)))
    keyed.sort(key=lambda item: (item[0], item[1]))
    return Trace(
        name=f"{trace.name}-window{seconds:g}s",
        events=[event for _, _, event in keyed],
        seed=trace.seed,
        generator={**trace.params, "window_s": float(seconds), "window_start_s": start},
    )


def _context_length(trace: Trace, scope: str, version: int) -> int:
    length: int | None = None
    current = -1
    for event in trace.events:
        if event.scope == scope and event.context is not None:
            current += 1
            length = event.context.length_after(length)
            if current == version:
                return length
    raise ValueError(f"scope {scope!r} has no version {version}")
