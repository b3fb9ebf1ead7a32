"""Revision traces: the JSON-lines format, its loader and dumper, statistics, token expansion.

This module defines what a replay *asks for*: which scope is submitted, revised, paused, unpaused or
cancelled at which time offset, with which context (as a deterministic token spec, not token ids),
how many tokens to generate and under which execution contract. It holds the frozen attrs types
(`Trace`, `TraceEvent`, `Contract`, context specs), strict loading with `TraceFormatError` carrying
the offending line number, exact-round-trip dumping, trace statistics and the expansion of token
specs into token ids. Where traces come from (the bursty and session generators, the agent-log
importer, densest-window selection) lives in `trace_sources`, the CLI in `trace_cli`. It
does not drive an engine, measure anything or know about vLLM: the replay harness consumes these
traces; the format is specified in `docs/traces.md`.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
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
    "load_trace",
    "loads_trace",
    "materialize",
    "materialize_context",
    "stats",
    "version_numbers",
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


if __name__ == "__main__":
    # `python -m retire_bench.traces`: the CLI lives in `trace_cli`
    from retire_bench.trace_cli import main

    raise SystemExit(main())
