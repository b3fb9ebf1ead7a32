"""Replay metrics, computed by the harness from what the consumer received and when.

Nothing here trusts the engine under test. The inputs are (1) every consumer read -- the
:class:`~retire_vllm.api.Delivery` the engine handed over plus the harness's own clock reading at
the moment the consumer got it -- and (2) the harness's own record of each version's life: when it
asked for it (submit or revision), when it superseded or cancelled it, and when it *observed* that
the version had no request left in vLLM's scheduler or output processor and no undelivered output
in its stream. Pure functions on plain records, so every metric is unit-tested on synthetic data.

Definitions (``docs/results.md`` repeats them):

* a read of ``(scope, v)`` at harness time ``t`` is *current* iff ``started_at(v) <= t <
  retired_at(v)`` (``retired_at`` is the next revision or the cancel); otherwise its tokens are
  **obsolete tokens published**. A read of a version the harness never created is *invalid*.
* **live obsolete executions** at ``t``: versions with ``retired_at <= t < closed_at`` (an
  unclosed one counts until the end of the run); peak and time-weighted mean over the run.
* **cleanup latency** of a revision: ``closed_at - retired_at`` of the version it retired; a
  version never seen closed counts as ``min(cleanup_limit, end - retired_at)`` and is reported in
  ``cleanup_unclosed``.
* a final version **advanced** if at least one of its tokens was read while it was current;
  **TTFT** = first such read minus ``started_at``.
* **current-version goodput** = current tokens read during the window / window length; the window
  runs from the replay start to the read of the last final version's finishing frame (or to the
  end of the run if some final version never finished).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from typing import Any

import attrs

from retire_vllm.api import Delivery


@attrs.frozen
class Read:
    """One delivery as the consumer got it; ``at`` is the harness's clock, not the engine's."""

    delivery: Delivery
    at: float


@attrs.frozen
class VersionSpan:
    scope: str
    version: int
    started_at: float
    retired_at: float | None = None  # next revision or cancel, harness clock
    closed_at: float | None = None  # harness-observed: no request, no open stream
    final: bool = False
    prompt_tokens: int = 0
    max_tokens: int = 0


@attrs.frozen
class RunRecord:
    """Everything the harness saw in one run of one system."""

    system: str
    start: float
    end: float
    reads: tuple[Read, ...]
    versions: tuple[VersionSpan, ...]
    cleanup_limit_s: float = 180.0


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolation percentile (numpy's default), ``None`` for no values."""
    if not values:
        return None
    xs = sorted(values)
    if len(xs) == 1:
        return float(xs[0])
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return float(xs[lo] + (xs[hi] - xs[lo]) * (pos - lo))


def _spans(record: RunRecord) -> dict[tuple[str, int], VersionSpan]:
    return {(s.scope, s.version): s for s in record.versions}


@attrs.frozen
class Classified:
    current: tuple[Read, ...]
    obsolete: tuple[Read, ...]
    invalid: tuple[Read, ...]


def classify_reads(record: RunRecord) -> Classified:
    """Split reads into current, obsolete and invalid by the harness's own version timeline."""
    spans = _spans(record)
    current: list[Read] = []
    obsolete: list[Read] = []
    invalid: list[Read] = []
    for r in record.reads:
        span = spans.get((r.delivery.scope, r.delivery.version))
        if span is None or r.at < span.started_at:
            invalid.append(r)
        elif span.retired_at is None or r.at < span.retired_at:
            current.append(r)
        else:
            obsolete.append(r)
    return Classified(tuple(current), tuple(obsolete), tuple(invalid))


def live_obsolete_series(record: RunRecord) -> list[tuple[float, int]]:
    """Step function ``[(t, count), ...]`` of live obsolete executions, from start to end."""
    changes: list[tuple[float, int]] = []
    for s in record.versions:
        if s.retired_at is None:
            continue
        closed = s.closed_at if s.closed_at is not None else record.end
        if closed > s.retired_at:
            changes.append((s.retired_at, +1))
            changes.append((closed, -1))
    changes.sort(key=lambda c: (c[0], c[1]))  # a close and an open at the same t: close first
    series = [(record.start, 0)]
    count = 0
    for t, d in changes:
        count += d
        if series and series[-1][0] == t:
            series[-1] = (t, count)
        else:
            series.append((t, count))
    if series[-1][0] < record.end:
        series.append((record.end, count))
    return series


def _time_weighted(series: Sequence[tuple[float, int]], start: float, end: float) -> float:
    if end <= start:
        return 0.0
    area = 0.0
    for (t0, c), (t1, _) in itertools.pairwise(series):
        lo, hi = max(t0, start), min(t1, end)
        if hi > lo:
            area += c * (hi - lo)
    return area / (end - start)


def cleanup_latencies(record: RunRecord) -> tuple[list[float], int]:
    """Seconds from each revision/cancel to the retired version's observed closure, and how
    many retired versions were never seen closed."""
    out: list[float] = []
    unclosed = 0
    for s in record.versions:
        if s.retired_at is None:
            continue
        if s.closed_at is None:
            unclosed += 1
            out.append(min(record.cleanup_limit_s, max(0.0, record.end - s.retired_at)))
        else:
            out.append(max(0.0, s.closed_at - s.retired_at))
    return out, unclosed


def per_version_tokens(record: RunRecord) -> dict[tuple[str, int], list[tuple[float, int, bool]]]:
    """Per version: ``[(t, cumulative tokens read, current?)]`` for the Figure 6 plot."""
    spans = _spans(record)
    out: dict[tuple[str, int], list[tuple[float, int, bool]]] = {}
    totals: dict[tuple[str, int], int] = {}
    for r in sorted(record.reads, key=lambda r: r.at):
        key = (r.delivery.scope, r.delivery.version)
        span = spans.get(key)
        is_current = span is not None and (span.retired_at is None or r.at < span.retired_at)
        totals[key] = totals.get(key, 0) + len(r.delivery.token_ids)
        out.setdefault(key, []).append((r.at, totals[key], is_current))
    return out


def compute(record: RunRecord) -> dict[str, Any]:
    """Every replay metric of one run (JSON-ready)."""
    cls = classify_reads(record)
    spans = _spans(record)
    finals = [s for s in record.versions if s.final]
    first_current: dict[tuple[str, int], float] = {}
    finished_current: dict[tuple[str, int], float] = {}
    for r in sorted(cls.current, key=lambda r: r.at):
        key = (r.delivery.scope, r.delivery.version)
        if r.delivery.token_ids:
            first_current.setdefault(key, r.at)
        if r.delivery.finished:
            finished_current.setdefault(key, r.at)
    ttft = [
        first_current[(s.scope, s.version)] - s.started_at
        for s in finals
        if (s.scope, s.version) in first_current
    ]
    advanced = sum((s.scope, s.version) in first_current for s in finals)
    completed = sum((s.scope, s.version) in finished_current for s in finals)
    if finals and completed == len(finals):
        window_end = max(finished_current[(s.scope, s.version)] for s in finals)
    else:
        window_end = record.end
    window = max(window_end - record.start, 1e-9)
    current_tokens = sum(len(r.delivery.token_ids) for r in cls.current)
    current_in_window = sum(len(r.delivery.token_ids) for r in cls.current if r.at <= window_end)
    obsolete_tokens = sum(len(r.delivery.token_ids) for r in cls.obsolete)
    series = live_obsolete_series(record)
    cleanup, unclosed = cleanup_latencies(record)
    ms = [c * 1000.0 for c in cleanup]
    ttft_ms = [t * 1000.0 for t in ttft]
    return {
        "obsolete_tokens": obsolete_tokens,
        "obsolete_frames": len(cls.obsolete),
        "invalid_reads": len(cls.invalid),
        "current_tokens": current_tokens,
        "peak_live_obsolete": max((c for _, c in series), default=0),
        "mean_live_obsolete": _time_weighted(series, record.start, record.end),
        "cleanup_ms_median": percentile(ms, 50),
        "cleanup_ms_p99": percentile(ms, 99),
        "cleanup_ms_max": max(ms) if ms else None,
        "cleanup_unclosed": unclosed,
        "revisions": len(cleanup),
        "final_versions_advanced": advanced,
        "final_versions_completed": completed,
        "final_versions_total": len(finals),
        "goodput_tok_s": current_in_window / window,
        "goodput_window_s": window,
        "ttft_final_ms_median": percentile(ttft_ms, 50),
        "ttft_final_ms_p90": percentile(ttft_ms, 90),
        "run_s": record.end - record.start,
        "versions": len(spans),
    }


def output_problems(
    record: RunRecord, reference: dict[tuple[str, int], Sequence[int]]
) -> list[str]:
    """Current-version output against the clean reference: what the consumer read while a
    version was current must be a prefix of that version's clean output, all of it once the
    version's finishing frame was read while current. Invalid reads are problems too."""
    cls = classify_reads(record)
    problems = [
        f"read of unknown or not-yet-created version {r.delivery.scope}@{r.delivery.version}"
        for r in cls.invalid
    ]
    got: dict[tuple[str, int], list[int]] = {}
    done: set[tuple[str, int]] = set()
    for r in sorted(cls.current, key=lambda r: r.at):
        key = (r.delivery.scope, r.delivery.version)
        if key in done and r.delivery.token_ids:
            problems.append(f"{key[0]}@{key[1]}: tokens read after its finishing frame")
        got.setdefault(key, []).extend(r.delivery.token_ids)
        if r.delivery.finished:
            done.add(key)
    for key, tokens in sorted(got.items()):
        ref = reference.get(key)
        if ref is None:
            problems.append(f"{key[0]}@{key[1]}: no clean reference")
            continue
        ref = list(ref)
        if tokens != ref[: len(tokens)]:
            first = next(
                (i for i, (a, b) in enumerate(zip(tokens, ref, strict=False)) if a != b),
                min(len(tokens), len(ref)),
            )
            problems.append(
                f"{key[0]}@{key[1]}: current output differs from the clean reference at token "
                f"{first} ({len(tokens)} read, {len(ref)} expected)"
            )
        elif key in done and len(tokens) != len(ref):
            problems.append(f"{key[0]}@{key[1]}: finished after {len(tokens)} of {len(ref)} tokens")
    return problems


def retire_target_misses(m: dict[str, Any]) -> list[str]:
    """Issue 5's hard targets for a Retire run (ratio and cleanup are reported, not gated here)."""
    misses = []
    if m["obsolete_tokens"] != 0:
        misses.append(f"published {m['obsolete_tokens']} obsolete tokens (target 0)")
    if m["invalid_reads"]:
        misses.append(f"{m['invalid_reads']} reads of versions the harness never created")
    if m["final_versions_advanced"] != m["final_versions_total"]:
        misses.append(
            f"advanced {m['final_versions_advanced']}/{m['final_versions_total']} final versions"
        )
    return misses


def aggregate(runs: Iterable[dict[str, Any]], records: Sequence[RunRecord]) -> dict[str, Any]:
    """One system's figures over its repetitions.

    Safety counts take the worst run (max obsolete tokens, max peak, min finals advanced);
    latency distributions pool every revision / final of every run; rates take the median run.
    """
    runs = list(runs)
    cleanup: list[float] = []
    ttft: list[float] = []
    unclosed = 0
    for rec in records:
        c, u = cleanup_latencies(rec)
        cleanup.extend(x * 1000.0 for x in c)
        unclosed += u
    for rec in records:
        cls = classify_reads(rec)
        first: dict[tuple[str, int], float] = {}
        for r in sorted(cls.current, key=lambda r: r.at):
            if r.delivery.token_ids:
                first.setdefault((r.delivery.scope, r.delivery.version), r.at)
        ttft.extend(
            (first[(s.scope, s.version)] - s.started_at) * 1000.0
            for s in rec.versions
            if s.final and (s.scope, s.version) in first
        )

    def med(key: str) -> float | None:
        return percentile([r[key] for r in runs if r[key] is not None], 50)

    return {
        "obsolete_tokens": max(r["obsolete_tokens"] for r in runs),
        "obsolete_frames": max(r["obsolete_frames"] for r in runs),
        "invalid_reads": max(r["invalid_reads"] for r in runs),
        "peak_live_obsolete": max(r["peak_live_obsolete"] for r in runs),
        "mean_live_obsolete": med("mean_live_obsolete"),
        "cleanup_ms_median": percentile(cleanup, 50),
        "cleanup_ms_p99": percentile(cleanup, 99),
        "cleanup_ms_max": max(cleanup) if cleanup else None,
        "cleanup_unclosed": unclosed,
        "final_versions_advanced": min(r["final_versions_advanced"] for r in runs),
        "final_versions_completed": min(r["final_versions_completed"] for r in runs),
        "final_versions_total": runs[0]["final_versions_total"],
        "goodput_tok_s": med("goodput_tok_s"),
        "current_tokens": med("current_tokens"),
        "ttft_final_ms_median": percentile(ttft, 50),
        "ttft_final_ms_p90": percentile(ttft, 90),
        "runs": len(runs),
        "per_run": runs,
    }
