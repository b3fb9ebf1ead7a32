"""Revision traces: the JSON-lines format, its loader and dumper, the bursty generator and importer.

This module defines what a replay *asks for*: which scope is submitted, revised, paused, unpaused or
cancelled at which time offset, with which context (as a deterministic token spec, not token ids),
how many tokens to generate and under which execution contract. It holds the frozen attrs types
(`Trace`, `TraceEvent`, `Contract`, context specs), strict loading with `TraceFormatError` carrying
the offending line number, exact-round-trip dumping, the seeded generator of the paper's densest
window (3 scopes, 24 revisions in 3 bursts, inter-arrival CV 3.57), the importer of recorded agent
session logs, densest-window selection, trace statistics, the expansion of token specs into token
ids, and a small CLI (`python -m retire_bench.traces`). It does not drive an engine, measure
anything or know about vLLM: the replay harness consumes these traces; the format is specified in
`docs/traces.md`.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import math
import random
import statistics
import sys
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any, Final, Literal, NoReturn, TypeAlias

import attrs

__all__ = [
    "BURST_GAP_FACTOR",
    "DEFAULT_SEED",
    "DEFAULT_TRACE_PATH",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "PAPER_TARGETS",
    "VERSION_KINDS",
    "BurstyParams",
    "Contract",
    "EditContext",
    "EventKind",
    "FullContext",
    "ReusePolicy",
    "TokenSpec",
    "Trace",
    "TraceEvent",
    "TraceFormatError",
    "TraceStats",
    "bursts_of",
    "check_shape",
    "derive_seed",
    "dump_trace",
    "dumps_trace",
    "expand_tokens",
    "final_versions",
    "generate_bursty",
    "import_agent_log",
    "load_trace",
    "loads_trace",
    "main",
    "materialize",
    "materialize_context",
    "paper_params",
    "stats",
    "version_numbers",
    "window",
]

FORMAT_NAME: Final = "retire-trace"
FORMAT_VERSION: Final = 1
#: A gap between consecutive revisions (all scopes, sorted by time) longer than this multiple of the
#: mean inter-arrival gap starts a new burst (unless an explicit threshold in seconds is given).
BURST_GAP_FACTOR: Final = 2.0
DEFAULT_SEED: Final = 0
DEFAULT_TRACE_PATH: Final = Path(__file__).resolve().parent / "data" / "default_trace.jsonl"
#: The densest window of the paper's replay: what `check_shape` compares statistics against.
PAPER_TARGETS: Final[Mapping[str, float]] = {
    "scopes": 3,
    "revisions": 24,
    "bursts": 3,
    "finals": 9,
    "cv": 3.57,
    "cv_rel_tol": 0.10,
}

_MAX_SEED: Final = 2**63
_MAX_SCOPE_LEN: Final = 256

Scalar: TypeAlias = str | int | float | bool | None


class TraceFormatError(ValueError):
    """Invalid trace or agent-log content; `line` is 1-based (header = line 1) when known."""

    def __init__(self, message: str, *, line: int | None = None, source: str | None = None) -> None:
        self.message = message
        self.line = line
        self.source = source
        where = source or "<trace>"
        if line is not None:
            where = f"{where}:{line}"
        super().__init__(f"{where}: {message}")


class EventKind(StrEnum):
    SUBMIT = "submit"
    REVISION = "revision"
    PAUSE = "pause"
    UNPAUSE = "unpause"
    CANCEL = "cancel"


#: Event kinds that create a version and therefore carry context, max_new_tokens and contract.
VERSION_KINDS: Final = frozenset({EventKind.SUBMIT, EventKind.REVISION})


class ReusePolicy(StrEnum):
    AUTO = "auto"
    NEVER = "never"
    ALWAYS = "always"


def _check_int(lo: int, hi: int | None = None) -> Any:
    def check(_inst: object, attr: attrs.Attribute[int], value: int) -> None:
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"{attr.name} must be an int, got {type(value).__name__}")
        if value < lo or (hi is not None and value >= hi):
            bound = f"[{lo}, {hi})" if hi is not None else f">= {lo}"
            raise ValueError(f"{attr.name} must be {bound}, got {value}")

    return check


@attrs.frozen
class TokenSpec:
    """`length` token ids drawn deterministically from `seed` (see `expand_tokens`)."""

    seed: int = attrs.field(validator=_check_int(0, _MAX_SEED))
    length: int = attrs.field(validator=_check_int(0))

    def to_json(self) -> dict[str, int]:
        return {"seed": self.seed, "length": self.length}


@attrs.frozen
class FullContext:
    """A context given in full: exactly the tokens of `tokens`."""

    tokens: TokenSpec

    @property
    def length(self) -> int:
        return self.tokens.length

    def length_after(self, previous_length: int | None) -> int:
        return self.tokens.length

    def to_json(self) -> dict[str, Any]:
        return {"tokens": self.tokens.to_json()}


@attrs.frozen
class EditContext:
    """The previous version's first `keep_prefix_tokens` tokens, then the tokens of `new_tokens`.

    The expansion guarantees that the longest common prefix with the previous context is exactly
    `keep_prefix_tokens` when both sides continue (see `materialize_context`).
    """

    keep_prefix_tokens: int = attrs.field(validator=_check_int(0))
    new_tokens: TokenSpec

    def length_after(self, previous_length: int | None) -> int:
        return self.keep_prefix_tokens + self.new_tokens.length

    def to_json(self) -> dict[str, Any]:
        return {
            "keep_prefix_tokens": self.keep_prefix_tokens,
            "new_tokens": self.new_tokens.to_json(),
        }


ContextSpec: TypeAlias = FullContext | EditContext


@attrs.frozen
class Contract:
    """What a successor requires of inherited state (DESIGN §2): reuse, equivalence, mode."""

    reuse: ReusePolicy = attrs.field(default=ReusePolicy.AUTO, converter=ReusePolicy)
    equivalence: Literal["exact"] = attrs.field(
        default="exact", validator=attrs.validators.in_(("exact",))
    )
    numerical_mode: Literal["fp32-greedy"] = attrs.field(
        default="fp32-greedy", validator=attrs.validators.in_(("fp32-greedy",))
    )

    def to_json(self) -> dict[str, str]:
        return {
            "reuse": self.reuse.value,
            "equivalence": self.equivalence,
            "numerical_mode": self.numerical_mode,
        }


def _check_time(_inst: object, attr: attrs.Attribute[float], value: float) -> None:
    if not isinstance(value, float) or not math.isfinite(value) or value < 0.0:
        raise ValueError(f"{attr.name} must be a finite float >= 0, got {value!r}")


def _check_scope(_inst: object, attr: attrs.Attribute[str], value: str) -> None:
    if not isinstance(value, str) or not value or len(value) > _MAX_SCOPE_LEN:
        raise ValueError(f"scope must be a non-empty string of at most {_MAX_SCOPE_LEN} characters")


def _to_time(value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"t must be a number, got {value!r}")
    return float(value)


@attrs.frozen
class TraceEvent:
    """One line of a trace after the header.

    `submit` and `revision` carry `context`, `max_new_tokens` and `contract`; `pause`, `unpause` and
    `cancel` carry none of them.
    """

    scope: str = attrs.field(validator=_check_scope)
    t: float = attrs.field(converter=_to_time, validator=_check_time)
    kind: EventKind = attrs.field(converter=EventKind)
    context: ContextSpec | None = None
    max_new_tokens: int | None = None
    contract: Contract | None = None

    def __attrs_post_init__(self) -> None:
        if self.kind in VERSION_KINDS:
            if self.context is None or self.max_new_tokens is None or self.contract is None:
                raise ValueError(f"a {self.kind} needs context, max_new_tokens and contract")
            if not isinstance(self.context, FullContext | EditContext):
                raise TypeError("context must be a FullContext or an EditContext")
            if not isinstance(self.contract, Contract):
                raise TypeError("contract must be a Contract")
            _check_int(1)(self, attrs.fields(TraceEvent).max_new_tokens, self.max_new_tokens)
            if self.kind is EventKind.SUBMIT and not isinstance(self.context, FullContext):
                raise ValueError(
                    "a submit has no previous context: its context must be a full spec"
                )
        elif (
            self.context is not None or self.max_new_tokens is not None or self.contract is not None
        ):
            raise ValueError(f"a {self.kind} carries no context, max_new_tokens or contract")

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"scope": self.scope, "t": self.t, "kind": self.kind.value}
        if self.context is not None:
            out["context"] = self.context.to_json()
        if self.max_new_tokens is not None:
            out["max_new_tokens"] = self.max_new_tokens
        if self.contract is not None:
            out["contract"] = self.contract.to_json()
        return out


def _params_converter(value: Mapping[str, Scalar] | Iterable[tuple[str, Scalar]]) -> Any:
    items = value.items() if isinstance(value, Mapping) else value
    pairs = tuple(sorted((str(k), v) for k, v in items))
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ValueError("duplicate generator parameter")
    for key, v in pairs:
        if v is not None and not isinstance(v, str | int | float | bool):
            raise ValueError(f"generator parameter {key!r} must be a JSON scalar")
        if isinstance(v, float) and not math.isfinite(v):
            raise ValueError(f"generator parameter {key!r} must be finite")
    return pairs


def _events_converter(events: Iterable[TraceEvent]) -> tuple[TraceEvent, ...]:
    return tuple(events)


def _seed_validator(inst: object, attr: attrs.Attribute[int | None], value: int | None) -> None:
    if value is not None:
        _check_int(0, _MAX_SEED)(inst, attr, value)


@attrs.frozen
class Trace:
    """A validated revision trace: header fields plus events ordered by non-decreasing `t`.

    Construction validates every event and the per-scope life cycle (see `docs/traces.md`) and
    raises `TraceFormatError` whose line number is the line the event has in a dumped file.
    """

    name: str
    events: tuple[TraceEvent, ...] = attrs.field(converter=_events_converter)
    seed: int | None = attrs.field(default=None, validator=_seed_validator)
    generator: tuple[tuple[str, Scalar], ...] = attrs.field(default=(), converter=_params_converter)
    format_version: int = FORMAT_VERSION

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise TraceFormatError("name must be a string", line=1)
        if self.format_version != FORMAT_VERSION:
            raise TraceFormatError(
                f"unsupported format_version {self.format_version} (expected {FORMAT_VERSION})",
                line=1,
            )
        _validate_events(self.events)

    @property
    def params(self) -> dict[str, Scalar]:
        return dict(self.generator)

    @property
    def scopes(self) -> tuple[str, ...]:
        """Scope ids in order of first appearance."""
        return tuple(dict.fromkeys(e.scope for e in self.events))

    def header_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT_NAME,
            "format_version": self.format_version,
            "name": self.name,
            "seed": self.seed,
            "generator": dict(self.generator),
            "stats": stats(self).to_json(),
        }


@attrs.define
class _ScopeState:
    version: int = 0
    length: int = 0
    paused: bool = False
    cancelled: bool = False


def _validate_events(events: Sequence[TraceEvent]) -> None:
    states: dict[str, _ScopeState] = {}
    last_t = 0.0
    for index, event in enumerate(events):
        line = index + 2

        def fail(message: str, line: int = line) -> NoReturn:
            raise TraceFormatError(message, line=line)

        if not isinstance(event, TraceEvent):
            fail(f"expected a TraceEvent, got {type(event).__name__}")
        if event.t < last_t:
            fail(f"time offset {event.t!r} is before the previous event's {last_t!r}")
        last_t = event.t
        state = states.get(event.scope)
        if event.kind is EventKind.SUBMIT:
            if state is not None:
                fail(f"scope {event.scope!r} is already submitted")
            assert event.context is not None
            states[event.scope] = _ScopeState(length=event.context.length_after(None))
            continue
        if state is None:
            fail(f"{event.kind} of scope {event.scope!r} before its submit")
        if state.cancelled:
            fail(f"{event.kind} of scope {event.scope!r} after its cancel")
        if event.kind is EventKind.REVISION:
            if state.paused:
                fail(f"revision of paused scope {event.scope!r} (unpause it first)")
            ctx = event.context
            if isinstance(ctx, EditContext) and ctx.keep_prefix_tokens > state.length:
                fail(
                    f"keep_prefix_tokens {ctx.keep_prefix_tokens} exceeds the previous context's "
                    f"{state.length} tokens"
                )
            assert ctx is not None
            state.length = ctx.length_after(state.length)
            state.version += 1
        elif event.kind is EventKind.PAUSE:
            if state.paused:
                fail(f"scope {event.scope!r} is already paused")
            state.paused = True
        elif event.kind is EventKind.UNPAUSE:
            if not state.paused:
                fail(f"unpause of scope {event.scope!r}, which is not paused")
            state.paused = False
        else:
            state.cancelled = True


# --------------------------------------------------------------------------------------------------
# Statistics


@attrs.frozen
class TraceStats:
    """Counts and burstiness of a trace; definitions in `docs/traces.md`."""

    scopes: int
    events: int
    submits: int
    revisions: int
    pauses: int
    unpauses: int
    cancels: int
    bursts: int
    finals: int
    cv: float
    burst_gap_s: float
    duration_s: float

    def to_json(self) -> dict[str, int | float]:
        return attrs.asdict(self)


def _revision_times(trace: Trace) -> list[float]:
    # Events are already sorted by time; the sort is stable, so ties keep file order.
    return [e.t for e in trace.events if e.kind is EventKind.REVISION]


def _gaps(times: Sequence[float]) -> list[float]:
    return [b - a for a, b in itertools.pairwise(times)]


def _burst_threshold(gaps: Sequence[float], burst_gap_s: float | None) -> float:
    if burst_gap_s is not None:
        return float(burst_gap_s)
    return BURST_GAP_FACTOR * statistics.fmean(gaps) if gaps else 0.0


def bursts_of(trace: Trace, burst_gap_s: float | None = None) -> list[list[int]]:
    """Revisions grouped into bursts: lists of event indices, in time order.

    A new burst starts after a gap (between consecutive revisions of any scope) strictly longer
    than `burst_gap_s`; by default `BURST_GAP_FACTOR` times the mean inter-arrival gap.
    """
    indices = [i for i, e in enumerate(trace.events) if e.kind is EventKind.REVISION]
    times = [trace.events[i].t for i in indices]
    threshold = _burst_threshold(_gaps(times), burst_gap_s)
    groups: list[list[int]] = []
    previous: float | None = None
    for index, t in zip(indices, times, strict=True):
        if previous is None or t - previous > threshold:
            groups.append([])
        groups[-1].append(index)
        previous = t
    return groups


def version_numbers(trace: Trace) -> list[int]:
    """For every event, the version of its scope once the event applies (submit = version 0)."""
    current: dict[str, int] = {}
    out: list[int] = []
    for event in trace.events:
        if event.kind is EventKind.SUBMIT:
            current[event.scope] = 0
        elif event.kind is EventKind.REVISION:
            current[event.scope] += 1
        out.append(current[event.scope])
    return out


def final_versions(trace: Trace, burst_gap_s: float | None = None) -> list[tuple[str, int]]:
    """The final versions: per burst, the last revision of each scope revised in it.

    Returns `(scope, version)` pairs ordered by burst, then by time.
    """
    versions = version_numbers(trace)
    out: list[tuple[str, int]] = []
    for burst in bursts_of(trace, burst_gap_s):
        last: dict[str, int] = {}
        for index in burst:
            last[trace.events[index].scope] = index
        out.extend((trace.events[i].scope, versions[i]) for i in sorted(last.values()))
    return out


def stats(trace: Trace, burst_gap_s: float | None = None) -> TraceStats:
    """Statistics of `trace`; the CV is population std / mean of the sorted revision gaps."""
    times = _revision_times(trace)
    gaps = _gaps(times)
    threshold = _burst_threshold(gaps, burst_gap_s)
    mean = statistics.fmean(gaps) if gaps else 0.0
    cv = statistics.pstdev(gaps) / mean if mean > 0.0 else 0.0
    kinds = [e.kind for e in trace.events]
    return TraceStats(
        scopes=len(trace.scopes),
        events=len(trace.events),
        submits=kinds.count(EventKind.SUBMIT),
        revisions=len(times),
        pauses=kinds.count(EventKind.PAUSE),
        unpauses=kinds.count(EventKind.UNPAUSE),
        cancels=kinds.count(EventKind.CANCEL),
        bursts=len(bursts_of(trace, burst_gap_s)),
        finals=len(final_versions(trace, burst_gap_s)),
        cv=cv,
        burst_gap_s=threshold,
        duration_s=trace.events[-1].t if trace.events else 0.0,
    )


def check_shape(trace_stats: TraceStats, targets: Mapping[str, float] = PAPER_TARGETS) -> list[str]:
    """Violations of the paper's densest-window shape (empty list: the trace has that shape)."""
    problems = [
        f"{key}: {getattr(trace_stats, key)} != {int(targets[key])}"
        for key in ("scopes", "revisions", "bursts", "finals")
        if getattr(trace_stats, key) != int(targets[key])
    ]
    cv, tol = targets["cv"], targets["cv_rel_tol"]
    if abs(trace_stats.cv - cv) > tol * cv:
        problems.append(f"cv: {trace_stats.cv:.4f} not within {tol:.0%} of {cv}")
    return problems


# --------------------------------------------------------------------------------------------------
# Loading and dumping


def _dumps_line(obj: Mapping[str, Any]) -> str:
    return json.dumps(obj, ensure_ascii=False, allow_nan=False, separators=(", ", ": "))


def dumps_trace(trace: Trace) -> str:
    """The canonical JSON-lines text of `trace` (header line, then one line per event)."""
    lines = [_dumps_line(trace.header_json())]
    lines.extend(_dumps_line(e.to_json()) for e in trace.events)
    return "\n".join(lines) + "\n"


def dump_trace(trace: Trace, path: str | Path) -> None:
    Path(path).write_text(dumps_trace(trace), encoding="utf-8")


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _parse_object(text: str) -> dict[str, Any]:
    obj = json.loads(text, parse_constant=_reject_constant)
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    return obj


def _keys(obj: Mapping[str, Any], required: set[str], optional: set[str], what: str) -> None:
    missing = required - obj.keys()
    if missing:
        raise ValueError(f"{what}: missing {', '.join(sorted(missing))}")
    extra = obj.keys() - required - optional
    if extra:
        raise ValueError(f"{what}: unknown {', '.join(sorted(extra))}")


def _int(value: Any, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{what} must be an integer, got {value!r}")
    return value


def _token_spec(obj: Any, what: str) -> TokenSpec:
    if not isinstance(obj, dict):
        raise ValueError(f"{what} must be an object")
    _keys(obj, {"seed", "length"}, set(), what)
    return TokenSpec(
        seed=_int(obj["seed"], f"{what}.seed"), length=_int(obj["length"], f"{what}.length")
    )


def _context(obj: Any) -> ContextSpec:
    if not isinstance(obj, dict):
        raise ValueError("context must be an object")
    if "tokens" in obj:
        _keys(obj, {"tokens"}, set(), "context")
        return FullContext(_token_spec(obj["tokens"], "context.tokens"))
    _keys(obj, {"keep_prefix_tokens", "new_tokens"}, set(), "context")
    return EditContext(
        keep_prefix_tokens=_int(obj["keep_prefix_tokens"], "context.keep_prefix_tokens"),
        new_tokens=_token_spec(obj["new_tokens"], "context.new_tokens"),
    )


def _contract(obj: Any) -> Contract:
    if not isinstance(obj, dict):
        raise ValueError("contract must be an object")
    _keys(obj, {"reuse", "equivalence", "numerical_mode"}, set(), "contract")
    for key in ("reuse", "equivalence", "numerical_mode"):
        if not isinstance(obj[key], str):
            raise ValueError(f"contract.{key} must be a string")
    return Contract(
        reuse=obj["reuse"], equivalence=obj["equivalence"], numerical_mode=obj["numerical_mode"]
    )


def _event(obj: dict[str, Any]) -> TraceEvent:
    _keys(obj, {"scope", "t", "kind"}, {"context", "max_new_tokens", "contract"}, "event")
    if not isinstance(obj["scope"], str):
        raise ValueError("scope must be a string")
    t = obj["t"]
    if not isinstance(t, int | float) or isinstance(t, bool):
        raise ValueError(f"t must be a number, got {t!r}")
    if obj["kind"] not in {k.value for k in EventKind}:
        raise ValueError(f"unknown event kind {obj['kind']!r}")
    return TraceEvent(
        scope=obj["scope"],
        t=float(t),
        kind=EventKind(obj["kind"]),
        context=_context(obj["context"]) if "context" in obj else None,
        max_new_tokens=(
            _int(obj["max_new_tokens"], "max_new_tokens") if "max_new_tokens" in obj else None
        ),
        contract=_contract(obj["contract"]) if "contract" in obj else None,
    )


def _header(obj: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    _keys(obj, {"format", "format_version", "name", "seed", "generator", "stats"}, set(), "header")
    if obj["format"] != FORMAT_NAME:
        raise ValueError(f"format must be {FORMAT_NAME!r}, got {obj['format']!r}")
    if _int(obj["format_version"], "format_version") != FORMAT_VERSION:
        raise ValueError(
            f"unsupported format_version {obj['format_version']} (expected {FORMAT_VERSION})"
        )
    if not isinstance(obj["name"], str):
        raise ValueError("name must be a string")
    if obj["seed"] is not None:
        _int(obj["seed"], "seed")
    if not isinstance(obj["generator"], dict):
        raise ValueError("generator must be an object of scalar parameters")
    if not isinstance(obj["stats"], dict):
        raise ValueError("stats must be an object")
    return obj, obj["stats"]


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return (
            isinstance(a, int | float)
            and not isinstance(a, bool)
            and math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-12)
        )
    return type(a) is type(b) and a == b


def loads_trace(text: str, source: str = "<string>") -> Trace:
    """Parse and validate trace text; every problem raises `TraceFormatError` with its line."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if not lines:
        raise TraceFormatError("empty trace: a header line is required", line=1, source=source)
    try:
        header, claimed = _header(_parse_object(lines[0]))
    except (ValueError, TypeError) as exc:
        raise TraceFormatError(f"bad header: {exc}", line=1, source=source) from exc
    events: list[TraceEvent] = []
    for number, line in enumerate(lines[1:], start=2):
        try:
            events.append(_event(_parse_object(line)))
        except (ValueError, TypeError) as exc:
            raise TraceFormatError(f"bad event: {exc}", line=number, source=source) from exc
    try:
        trace = Trace(
            name=header["name"],
            events=events,
            seed=header["seed"],
            generator=header["generator"],
            format_version=header["format_version"],
        )
    except TraceFormatError as exc:
        raise TraceFormatError(exc.message, line=exc.line, source=source) from exc
    except (ValueError, TypeError) as exc:
        raise TraceFormatError(f"bad header: {exc}", line=1, source=source) from exc
    actual = stats(trace).to_json()
    if claimed.keys() != actual.keys() or not all(_same(claimed[k], actual[k]) for k in actual):
        diff = {
            k: (claimed.get(k), actual[k]) for k in actual if not _same(claimed.get(k), actual[k])
        }
        extra = sorted(claimed.keys() - actual.keys())
        raise TraceFormatError(
            f"header stats do not match the events (claimed, actual): {diff}"
            + (f"; unknown stats {extra}" if extra else ""),
            line=1,
            source=source,
        )
    return trace


def load_trace(path: str | Path) -> Trace:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise TraceFormatError(f"not UTF-8: {exc}", source=str(path)) from exc
    return loads_trace(text, source=str(path))


# --------------------------------------------------------------------------------------------------
# Token specs → token ids


def derive_seed(*parts: object) -> int:
    """A 63-bit seed from `parts`, stable across Python versions and platforms."""
    digest = hashlib.blake2b("/".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def expand_tokens(spec: TokenSpec, *, vocab_size: int, first_id: int = 0) -> list[int]:
    """The `spec.length` token ids of `spec`, each in `[first_id, vocab_size)`.

    Token `i` comes from BLAKE2b over the seed and a block counter (16 ids per 64-byte block, each
    a little-endian uint32 reduced modulo the id range), so it is platform- and version-independent.
    """
    span = vocab_size - first_id
    if first_id < 0 or span < 2:
        raise ValueError("need 0 <= first_id and at least 2 token ids in [first_id, vocab_size)")
    out: list[int] = []
    block = 0
    while len(out) < spec.length:
        digest = hashlib.blake2b(
            f"retire-trace-tokens/{spec.seed}/{block}".encode(), digest_size=64
        ).digest()
        out.extend(
            first_id + int.from_bytes(digest[k : k + 4], "little") % span for k in range(0, 64, 4)
        )
        block += 1
    return out[: spec.length]


def materialize_context(
    context: ContextSpec,
    previous: Sequence[int] | None,
    *,
    vocab_size: int,
    first_id: int = 0,
) -> list[int]:
    """Token ids of `context`; an edit needs the previous version's ids in `previous`.

    Divergence rule: for an edit, if the first new token equals `previous[keep_prefix_tokens]`, it
    is replaced by the next id in the range (wrapping), so the longest common prefix with the
    previous context is exactly `keep_prefix_tokens` (when both continue past it).
    """
    if isinstance(context, FullContext):
        return expand_tokens(context.tokens, vocab_size=vocab_size, first_id=first_id)
    if previous is None:
        raise ValueError("an edit context needs the previous context's token ids")
    keep = context.keep_prefix_tokens
    if keep > len(previous):
        raise ValueError(f"keep_prefix_tokens {keep} exceeds the previous {len(previous)} tokens")
    new = expand_tokens(context.new_tokens, vocab_size=vocab_size, first_id=first_id)
    if new and keep < len(previous) and new[0] == previous[keep]:
        new[0] = first_id + (new[0] - first_id + 1) % (vocab_size - first_id)
    return [*previous[:keep], *new]


def materialize(
    trace: Trace, *, vocab_size: int, first_id: int = 0
) -> dict[tuple[str, int], tuple[int, ...]]:
    """Token ids of every version's context, keyed by `(scope, version)`."""
    out: dict[tuple[str, int], tuple[int, ...]] = {}
    for event, version in zip(trace.events, version_numbers(trace), strict=True):
        if event.context is None:
            continue
        previous = out.get((event.scope, version - 1))
        out[(event.scope, version)] = tuple(
            materialize_context(event.context, previous, vocab_size=vocab_size, first_id=first_id)
        )
    return out


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
        out: dict[str, Scalar] = {"generator": "bursty"}
        for key, value in attrs.asdict(self).items():
            out[key] = value.value if isinstance(value, ReusePolicy) else value
        return out


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


# --------------------------------------------------------------------------------------------------
# CLI


def _print_stats(trace: Trace) -> None:
    s = stats(trace)
    out = {
        "name": trace.name,
        **s.to_json(),
        "shape_problems": check_shape(s),
        "final_versions": [list(pair) for pair in final_versions(trace)],
    }
    print(json.dumps(out, indent=2))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m retire_bench.traces", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="generate the bursty densest-window trace")
    gen.add_argument("--seed", type=int, default=DEFAULT_SEED)
    gen.add_argument("--out", type=Path, required=True)
    gen.add_argument("--paper", action="store_true", help="paper scale: 120 s, 8192-token prompt")
    defaults = BurstyParams()
    for field in ("duration_s", "prompt_tokens", "prefix_overlap", "max_new_tokens", "target_cv"):
        value = getattr(defaults, field)
        gen.add_argument(f"--{field.replace('_', '-')}", type=type(value), default=None)
    gen.add_argument("--reuse", choices=[r.value for r in ReusePolicy], default=None)
    st = sub.add_parser("stats", help="print a trace's statistics as JSON")
    st.add_argument("path", type=Path)
    imp = sub.add_parser("import", help="import an agent session log")
    imp.add_argument("log", type=Path)
    imp.add_argument("--out", type=Path, required=True)
    imp.add_argument("--window", type=float, default=None, help="keep the densest window (s)")
    imp.add_argument("--seed", type=int, default=DEFAULT_SEED)
    imp.add_argument("--prompt-tokens", type=int, default=512)
    imp.add_argument("--prefix-overlap", type=float, default=0.0)
    imp.add_argument("--max-new-tokens", type=int, default=64)
    args = parser.parse_args(argv)
    try:
        if args.command == "generate":
            base = paper_params() if args.paper else BurstyParams()
            changes = {
                k: getattr(args, k)
                for k in (
                    "duration_s",
                    "prompt_tokens",
                    "prefix_overlap",
                    "max_new_tokens",
                    "target_cv",
                    "reuse",
                )
                if getattr(args, k) is not None
            }
            trace = generate_bursty(args.seed, attrs.evolve(base, **changes))
            dump_trace(trace, args.out)
        elif args.command == "import":
            trace = import_agent_log(
                args.log,
                seed=args.seed,
                prompt_tokens=args.prompt_tokens,
                prefix_overlap=args.prefix_overlap,
                max_new_tokens=args.max_new_tokens,
            )
            if args.window is not None:
                trace = window(trace, args.window)
            dump_trace(trace, args.out)
        else:
            trace = load_trace(args.path)
        _print_stats(trace)
    except (TraceFormatError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
