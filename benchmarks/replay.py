"""Replay a revision trace against native replacement and Retire, wall-clock driven.

One run = one fresh engine for one system. The harness fires the trace's events at their (scaled)
time offsets while it steps the engine itself, and plays one *slow consumer* per scope: when the
consumer is idle it reads whatever its scope's stream holds, then stays busy for
``consumer_delay_s`` while the engine keeps producing (outputs merge meanwhile, as in vLLM's
``RequestOutputCollector``). Everything it measures comes from its own clock and its own records:
when it asked for each version, when it retired it, what the consumer read and when, and when it
saw a retired version's last request leave vLLM's scheduler and output processor with nothing left
undelivered in its stream (``metrics.py`` has the definitions). Which vLLM requests belong to
which version is learnt by watching ``LLMEngine.add_request`` on the engine instance and matching
the prompt token ids against the trace's versions -- the harness does not ask the system.

:func:`replay` runs the systems interleaved (A/B/A/B...) for ``reps`` repetitions, checks every
run against a clean reference (``reference.py``), aggregates the figures and returns the JSON
document ``retire replay`` writes; its console table is ``replay_table``.
"""

from __future__ import annotations

import contextlib
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

import attrs

from retire_bench import metrics as M
from retire_bench.reference import Admission, admit, clean_reference
from retire_bench.systems import NATIVE_SYSTEMS, SYSTEMS, CoreTimer, make_system
from retire_bench.traces import (
    DEFAULT_TRACE_PATH,
    EventKind,
    Trace,
    final_versions,
    load_trace,
    materialize,
    stats,
    version_numbers,
)
from retire_core import IllegalTransitionError, ScopeState

SCHEMA: Final[str] = "retire-replay-results/1"
FIRST_ID: Final[int] = 1  # keep id 0 (EOS / BOS / pad of the tiny model) out of prompts
#: The paper's figures (DESIGN.md section 6) for the side-by-side table.
PAPER: Final[dict[str, dict[str, float]]] = {
    "native": {
        "obsolete_tokens": 40499,
        "peak_live_obsolete": 22,
        "final_versions_advanced": 3,
        "final_versions_total": 9,
        "goodput_tok_s": 9.77,
        "ttft_final_ms_median": 87000.0,
    },
    "retire": {
        "obsolete_tokens": 0,
        "cleanup_ms_median": 1.08,
        "final_versions_advanced": 9,
        "final_versions_total": 9,
        "goodput_tok_s": 54.0,
        "ttft_final_ms_median": 405.0,
    },
    "goodput_ratio": {"value": 5.53},
}
#: Keys every per-system object of the results JSON carries (a test pins them).
SYSTEM_KEYS: Final[tuple[str, ...]] = (
    "obsolete_tokens",
    "obsolete_frames",
    "peak_live_obsolete",
    "mean_live_obsolete",
    "cleanup_ms_median",
    "cleanup_ms_p99",
    "cleanup_ms_max",
    "cleanup_unclosed",
    "final_versions_advanced",
    "final_versions_completed",
    "final_versions_total",
    "goodput_tok_s",
    "current_tokens",
    "ttft_final_ms_median",
    "ttft_final_ms_p90",
    "obsolete_tokens_computed",
    "step_ms_median",
    "retire_core_share_of_step",
    "integration_share_of_step",
    "retire_core_us_per_step",
    "retire_core_us_per_step_warm",
    "retire_core_share_of_step_warm",
    "integration_us_per_step",
    "engine_api_us_per_step",
    "load_avg_1m",
    "cpu_probe_ms",
    "contended_runs",
    "admitted",
    "admission",
    "runs",
    "per_run",
)
TOP_KEYS: Final[tuple[str, ...]] = (
    "schema",
    "trace",
    "config",
    "machine",
    "systems",
    "goodput_ratio",
    "goodput_ratio_vs_stop_reading",
    "checker_admitted",
    "paper",
    "wall_s",
)


@attrs.frozen
class ReplayConfig:
    time_scale: float = 1.0
    consumer_delay_s: float = 0.2
    #: None: 1.5 x the scaled trace duration (the paper's 180 s limit on its 120 s window)
    cleanup_limit_s: float | None = None
    reps: int = 2
    engine_overrides: dict[str, Any] = attrs.field(factory=dict)
    model_path: str | None = None
    idle_sleep_s: float = 0.002
    #: write each Retire run's recorded core calls here (the last run's stay): see interleave.py
    core_calls_path: str | os.PathLike[str] | None = None

    def limit_for(self, trace: Trace) -> float:
        if self.cleanup_limit_s is not None:
            return self.cleanup_limit_s
        return max(5.0, 1.5 * float(stats(trace).duration_s) * self.time_scale)


@attrs.define
class _Span:
    scope: str
    version: int
    started_at: float
    final: bool
    prompt_tokens: int
    max_tokens: int
    retired_at: float | None = None
    closed_at: float | None = None

    def freeze(self) -> M.VersionSpan:
        return M.VersionSpan(
            self.scope,
            self.version,
            self.started_at,
            self.retired_at,
            self.closed_at,
            self.final,
            self.prompt_tokens,
            self.max_tokens,
        )


class RequestSpy:
    """Learns which internal vLLM request ids serve which version, by prompt token ids."""

    def __init__(
        self,
        engine: Any,
        prompts: dict[tuple[str, int], tuple[int, ...]],
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.by_prompt: dict[tuple[int, ...], list[tuple[str, int]]] = {}
        for key, ids in prompts.items():
            self.by_prompt.setdefault(tuple(ids), []).append(key)
        self.ids: dict[tuple[str, int], list[str]] = {}
        self.unmatched: list[str] = []
        #: every launch seen: (internal id, version or None, harness time)
        self.added: list[tuple[str, tuple[str, int] | None, float]] = []
        original = engine.add_request

        def add_request(request_id: Any, prompt: Any, *args: Any, **kwargs: Any) -> Any:
            at = clock()
            rid = original(request_id, prompt, *args, **kwargs)
            tokens = None
            if isinstance(prompt, dict):
                tokens = prompt.get("prompt_token_ids")
            elif hasattr(prompt, "prompt_token_ids"):
                tokens = prompt.prompt_token_ids
            keys = self.by_prompt.get(tuple(tokens)) if tokens is not None else None
            internal = rid if isinstance(rid, str) else str(request_id)
            if keys:
                for key in keys:
                    self.ids.setdefault(key, []).append(internal)
                self.added.append((internal, keys[0], at))
            else:
                self.unmatched.append(internal)
                self.added.append((internal, None, at))
            return rid

        engine.add_request = add_request


@attrs.frozen
class RunResult:
    system: str
    record: M.RunRecord
    metrics: dict[str, Any]
    admission: Admission
    step_ms: tuple[float, ...]
    core_s: float
    core_in_step_s: float
    core_events: int
    engine_s: float
    hooks_s: float
    load_avg: tuple[float, float]  # 1-minute load average before and after the run
    probe_ms: tuple[float, float]  # CPU probe before and after the run (see cpu_probe_ms)
    obsolete_tokens_computed: int | None
    version_details: tuple[dict[str, Any], ...]
    engine_api_s: float = 0.0  # vLLM's add/abort called inside harness steps (CoreTimer)
    # the same in-step core calls replayed back to back after the run (CoreTimer.warm_replay)
    core_warm_in_step_s: float | None = None


def _core_contract(contract: Any) -> Any:
    from retire_core import Contract, ReusePolicy

    return Contract(reuse=ReusePolicy(contract.reuse.value))


def run_once(
    trace: Trace,
    system_name: str,
    config: ReplayConfig,
    reference: dict[tuple[str, int], tuple[int, ...]],
    *,
    checker: Any = None,
    progress: Callable[[float, float], None] | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> RunResult:
    """One run of one system on a fresh engine. ``checker``: a ``retire_vllm.checker.Checker``
    whose references are already computed (used for the Retire arm, before ``close``)."""
    from retire_vllm import introspect
    from retire_vllm.default_model import VOCAB_SIZE

    prompts = materialize(trace, vocab_size=VOCAB_SIZE, first_id=FIRST_ID)
    numbers = version_numbers(trace)
    finals = set(final_versions(trace))
    limit = config.limit_for(trace)
    scale = config.time_scale
    system = make_system(
        system_name, config.model_path, clock=clock, engine_overrides=config.engine_overrides
    )
    engine = system.engine
    spy = RequestSpy(engine, prompts, clock)
    timer = CoreTimer(system, clock, record=True)
    sched_requests = introspect.scheduler(engine).requests
    states = engine.output_processor.request_states
    stream_open = getattr(system, "stream_open", None)
    problems: list[str] = []

    spans: dict[tuple[str, int], _Span] = {}
    current: dict[str, int] = {}
    cancelled: set[str] = set()
    reads: list[M.Read] = []
    busy_until: dict[str, float] = {}
    finished_current: set[tuple[str, int]] = set()
    open_retired: list[_Span] = []
    step_ms: list[float] = []
    events = list(trace.events)
    duration = (events[-1].t * scale) if events else 0.0

    def observe() -> None:
        if not open_retired:
            return
        now = None
        for span in list(open_retired):
            key = (span.scope, span.version)
            live = any(r in sched_requests or r in states for r in spy.ids.get(key, ()))
            if not live and stream_open is not None:
                live = bool(stream_open(*key))
            if not live:
                now = now if now is not None else clock()
                span.closed_at = now
                open_retired.remove(span)

    def retire(scope: str, at: float) -> None:
        span = spans[(scope, current[scope])]
        span.retired_at = at
        open_retired.append(span)

    def fire(index: int) -> None:
        ev = events[index]
        version = numbers[index]
        key = (ev.scope, version)
        now = clock()
        if ev.kind in (EventKind.SUBMIT, EventKind.REVISION):
            assert ev.max_new_tokens is not None and ev.contract is not None
            if ev.kind is EventKind.REVISION:
                retire(ev.scope, now)
            spans[key] = _Span(
                ev.scope, version, now, key in finals, len(prompts[key]), ev.max_new_tokens
            )
            current[ev.scope] = version
            busy_until.setdefault(ev.scope, 0.0)
            call = system.submit if ev.kind is EventKind.SUBMIT else system.supersede
            got = call(ev.scope, list(prompts[key]), _core_contract(ev.contract), ev.max_new_tokens)
            if got != version:
                problems.append(f"{ev.scope}: engine numbered version {version} as {got}")
        elif ev.kind in (EventKind.PAUSE, EventKind.UNPAUSE):
            try:
                (system.pause if ev.kind is EventKind.PAUSE else system.unpause)(ev.scope)
            except IllegalTransitionError as err:
                # the version ran to its end before the pause (or while paused): nothing runs
                # that the pause or resume could act on, in any system
                if err.state != ScopeState.FINISHED.value:
                    raise
        elif ev.kind is EventKind.CANCEL:
            retire(ev.scope, now)
            cancelled.add(ev.scope)
            system.cancel(ev.scope)
        observe()

    def done() -> bool:
        if next_event < len(events) or open_retired:
            return False
        return all(
            scope in cancelled or (scope, v) in finished_current for scope, v in current.items()
        )

    load_before = _loadavg()
    probe_before = cpu_probe_ms()
    start = clock()
    next_event = 0
    end = start
    try:
        while True:
            now = clock()
            t = now - start
            while next_event < len(events) and events[next_event].t * scale <= t:
                fire(next_event)
                next_event += 1
            for scope in list(current):
                if clock() < busy_until[scope]:
                    continue
                got_reads = system.consume(scope)
                at = clock()
                for d in got_reads:
                    reads.append(M.Read(d, at))
                    key = (d.scope, d.version)
                    span = spans.get(key)
                    if (
                        d.finished
                        and span is not None
                        and span.retired_at is None
                        and current.get(d.scope) == d.version
                    ):
                        finished_current.add(key)
                if got_reads:
                    busy_until[scope] = at + config.consumer_delay_s
                observe()
            if system.has_unfinished():
                timer.stepping(True)
                t0 = clock()
                system.step()
                step_ms.append((clock() - t0) * 1000.0)
                timer.stepping(False)
                observe()
            else:
                observe()
                wake = [start + events[next_event].t * scale] if next_event < len(events) else []
                wake += [b for b in busy_until.values() if b > clock()]
                pause = min(wake) - clock() if wake else config.idle_sleep_s
                time.sleep(min(max(pause, 0.0), config.idle_sleep_s))
            if progress is not None:
                progress(clock() - start, duration)
            if done():
                break
            last_event_t = events[-1].t * scale if events else 0.0
            if next_event >= len(events) and clock() - start > last_event_t + limit:
                problems_note = [f"{s.scope}@{s.version}" for s in open_retired]
                if problems_note:
                    problems.append(f"cleanup limit reached with open: {problems_note}")
                break
    finally:
        end = clock()
    for rid, launched, at in spy.added:
        span = spans.get(launched) if launched is not None else None
        if span is not None and span.retired_at is not None and at >= span.retired_at:
            problems.append(
                f"request {rid} launched for {span.scope}@{span.version} after it was retired"
            )
    tokens_computed, details = _system_details(system)
    verdict = None
    needs_verdict = system_name not in NATIVE_SYSTEMS
    if needs_verdict:
        verdict = facade_verdict(system, checker)
    close_error = None
    try:
        system.close()
    except Exception as err:
        close_error = f"{type(err).__name__}: {err}"
    shutdown = getattr(getattr(engine, "engine_core", None), "shutdown", None)
    if callable(shutdown):
        with contextlib.suppress(Exception):
            shutdown()
    core_warm = timer.warm_replay() if timer.calls is not None else None
    if config.core_calls_path is not None and timer.calls is not None and timer.active:
        timer.save_calls(config.core_calls_path)
    record = M.RunRecord(
        system_name,
        start,
        end,
        tuple(reads),
        tuple(s.freeze() for s in spans.values()),
        limit,
    )
    admission = admit(
        record,
        reference,
        close_error=close_error,
        harness_problems=problems,
        facade_verdict=verdict,
        needs_facade_verdict=needs_verdict,
    )
    result = RunResult(
        system_name,
        record,
        M.compute(record),
        admission,
        tuple(step_ms),
        timer.total_s,
        timer.in_step_s,
        timer.events,
        timer.engine_s,
        timer.hooks_s,
        (load_before, _loadavg()),
        (probe_before, cpu_probe_ms()),
        tokens_computed,
        tuple(details),
        timer.engine_api_s,
        core_warm,
    )
    return result


def _system_details(system: Any) -> tuple[int | None, list[dict[str, Any]]]:
    """Per-version diagnostics from the system's own records (not used for headline metrics):
    native ``NativeVersion`` records, or the facade's ``records[scope].versions``. Also the
    tokens the engine produced for versions after they were retired: native counts what entered
    the collector after the revision; for Retire, the tokens its engine-boundary gate dropped."""
    recs: list[Any] = []
    versions_fn = getattr(system, "versions", None)
    if callable(versions_fn):
        recs = list(versions_fn())
    elif isinstance(getattr(system, "records", None), dict):
        recs = [r for log in system.records.values() for r in getattr(log, "versions", [])]
    computed: int | None = None
    if recs and hasattr(recs[0], "tokens_after_retire"):
        computed = sum(r.tokens_after_retire for r in recs)
    elif recs and hasattr(recs[0], "dropped_engine_tokens"):
        computed = sum(r.dropped_engine_tokens for r in recs)
    return computed, [_version_detail(r) for r in recs]


def _version_detail(rec: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in (
        "scope",
        "version",
        "request_id",
        "request_ids",
        "num_cached_tokens",
        "adopted_blocks",
        "tokens_generated",
        "tokens_after_retire",
        "dropped_engine_tokens",
        "dropped_consumer_tokens",
        "commits_dropped",
        "cold",
        "fenced",
    ):
        if hasattr(rec, name):
            value = getattr(rec, name)
            out[name] = list(value) if isinstance(value, tuple | list) else value
    return out


def facade_verdict(system: Any, checker: Any = None) -> Any:
    """``retire_vllm.checker.check_run`` on a finished, not yet closed Retire run: current-version
    output against its clean reference, adopted pages (generation, digests, bytes), receipts of
    every retired version, and publication. ``None`` if the checker is not installed; a failure
    of the checker itself is returned as a rejecting verdict."""
    try:
        from retire_vllm.checker import check_run
    except ImportError:
        return None
    try:
        return check_run(system, checker)
    except Exception as err:  # the checker could not judge the run: it is not admitted
        return {"admitted": False, "problems": [f"checker raised {type(err).__name__}: {err}"]}


def make_checker(
    prompts: dict[tuple[str, int], tuple[int, ...]],
    max_tokens: dict[tuple[str, int], int],
    config: ReplayConfig,
) -> Any:
    """A ``Checker`` on its own reference engine, with every version's reference computed now
    (the reference engine is then shut down: later verdicts only read the cache)."""
    try:
        from retire_vllm.checker import Checker
    except ImportError:
        return None
    from retire_vllm.engine_config import build_engine

    engine = build_engine(config.model_path, **config.engine_overrides)
    checker = Checker(engine)
    checker.references([(prompts[k], max_tokens[k]) for k in sorted(prompts)])
    shutdown = getattr(engine.engine_core, "shutdown", None)
    if callable(shutdown):
        shutdown()
    return checker


def replay(
    trace: Trace,
    systems: Sequence[str],
    config: ReplayConfig,
    *,
    trace_path: str | None = None,
    progress_factory: Callable[[str], Any] | None = None,
    log: Callable[[str], None] = lambda s: print(s, file=sys.stderr),
) -> tuple[dict[str, Any], dict[str, list[RunResult]]]:
    """Run ``systems`` interleaved for ``config.reps`` repetitions; return (JSON, raw results)."""
    from retire_vllm.default_model import VOCAB_SIZE

    t_all = time.perf_counter()
    for name in systems:
        if name not in SYSTEMS:
            raise ValueError(f"unknown system {name!r}")
    prompts = materialize(trace, vocab_size=VOCAB_SIZE, first_id=FIRST_ID)
    max_tokens = {}
    for ev, v in zip(trace.events, version_numbers(trace), strict=True):
        if ev.max_new_tokens is not None:
            max_tokens[(ev.scope, v)] = ev.max_new_tokens
    log(f"clean reference: {len(prompts)} versions, cold, prefix caching off")
    reference = clean_reference(
        prompts,
        max_tokens,
        model_path=config.model_path,
        engine_overrides=config.engine_overrides,
    )
    checker = None
    if "retire" in systems:
        log("checker references: every version, on a separate reference engine")
        checker = make_checker(prompts, max_tokens, config)
    results: dict[str, list[RunResult]] = {name: [] for name in systems}
    for rep in range(config.reps):
        for name in systems:  # A/B/A/B: every repetition runs every system once, same order
            bar = (
                progress_factory(f"{name} run {rep + 1}/{config.reps}")
                if progress_factory
                else None
            )
            res = run_once(
                trace,
                name,
                config,
                reference,
                checker=checker,
                progress=bar.update if bar else None,
            )
            if bar is not None:
                bar.close()
            results[name].append(res)
            m = res.metrics
            log(
                f"  {name} run {rep + 1}: obsolete {m['obsolete_tokens']}, peak live obsolete "
                f"{m['peak_live_obsolete']}, finals {m['final_versions_advanced']}/"
                f"{m['final_versions_total']}, goodput {m['goodput_tok_s']:.1f} tok/s, "
                f"{'admitted' if res.admission.admitted else 'NOT admitted'}"
            )
            for problem in res.admission.problems[:5]:
                log(f"    {problem}")
    doc = results_json(trace, config, results, trace_path=trace_path)
    doc["wall_s"] = time.perf_counter() - t_all
    return doc, results


def system_json(runs: Sequence[RunResult]) -> dict[str, Any]:
    agg: dict[str, Any] = M.aggregate([r.metrics for r in runs], [r.record for r in runs])
    steps = [x for r in runs for x in r.step_ms]
    step_total = sum(steps) / 1000.0
    core_in_step = sum(r.core_in_step_s for r in runs)
    core_total = sum(r.core_s for r in runs)
    computed = [r.obsolete_tokens_computed for r in runs if r.obsolete_tokens_computed is not None]
    is_retire = bool(runs) and runs[0].system == "retire"
    # integration work during steps: what step() did besides LLMEngine.step and vLLM's own
    # add/abort work, plus the hooks that run inside LLMEngine.step (the facade's scheduler
    # hooks; none for the native baselines)
    engine_api = sum(r.engine_api_s for r in runs)
    # the same in-step core calls replayed back to back after each run (no model kernels in
    # between to evict the CPU caches): the core's cost on its own, beside the in-run figure
    warm = [r.core_warm_in_step_s for r in runs]
    core_warm = sum(w for w in warm if w is not None) if is_retire and None not in warm else None
    glue = sum(s / 1000.0 for r in runs for s in r.step_ms) - sum(r.engine_s for r in runs)
    glue += sum(r.hooks_s for r in runs) - engine_api
    agg.update(
        {
            "obsolete_tokens_computed": max(computed) if computed else None,
            "step_ms_median": M.percentile(steps, 50),
            "steps": len(steps),
            "retire_core_s": core_total,
            "retire_core_events": sum(r.core_events for r in runs),
            "retire_core_share_of_step": (core_in_step / step_total)
            if is_retire and step_total > 0
            else None,
            "retire_core_share_of_run": (
                core_total / sum(r.record.end - r.record.start for r in runs)
            )
            if is_retire
            else None,
            "integration_share_of_step": glue / step_total if step_total > 0 else None,
            # per-step costs in microseconds: unlike the shares, these barely move when other
            # processes slow the model's kernels down
            "retire_core_us_per_step": core_in_step / len(steps) * 1e6
            if is_retire and steps
            else None,
            "retire_core_us_per_step_warm": core_warm / len(steps) * 1e6
            if core_warm is not None and steps
            else None,
            "retire_core_share_of_step_warm": core_warm / step_total
            if core_warm is not None and step_total > 0
            else None,
            "integration_us_per_step": glue / len(steps) * 1e6 if steps else None,
            # left out of the integration's figures: vLLM's add_request / abort_request work
            # that the facade calls inside its step() (admitting a successor, a deferred fence)
            "engine_api_us_per_step": engine_api / len(steps) * 1e6 if steps else None,
            "load_avg_1m": [list(r.load_avg) for r in runs],
            "cpu_probe_ms": [list(r.probe_ms) for r in runs],
            "contended_runs": sum(max(r.probe_ms) > CONTENDED_PROBE_MS for r in runs),
            "admitted": all(r.admission.admitted for r in runs),
            "admission": [r.admission.to_json() for r in runs],
        }
    )
    return agg


def results_json(
    trace: Trace,
    config: ReplayConfig,
    results: dict[str, list[RunResult]],
    *,
    trace_path: str | None = None,
) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "trace": {
            "name": trace.name,
            "path": trace_path,
            "stats": stats(trace).to_json(),
            "final_versions": [list(k) for k in final_versions(trace)],
            "time_scale": config.time_scale,
        },
        "config": {
            "reps": config.reps,
            "consumer_delay_s": config.consumer_delay_s,
            "cleanup_limit_s": config.limit_for(trace),
            "engine_overrides": dict(config.engine_overrides),
            "model": config.model_path or "default tiny model (retire_vllm.default_model)",
            "order": "interleaved: every repetition runs every system once, in a fixed order",
        },
        "machine": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cpus": _cpus(),
        },
        "systems": list(results),
    }
    for name, runs in results.items():
        doc[name] = system_json(runs)
    ratio = None
    ratio_sr = None
    if "retire" in results and "native" in results:
        a, b = doc["retire"]["goodput_tok_s"], doc["native"]["goodput_tok_s"]
        ratio = a / b if a is not None and b else None
    if "retire" in results and "native_stop_reading" in results:
        a, b = doc["retire"]["goodput_tok_s"], doc["native_stop_reading"]["goodput_tok_s"]
        ratio_sr = a / b if a is not None and b else None
    doc["goodput_ratio"] = ratio
    doc["goodput_ratio_vs_stop_reading"] = ratio_sr
    doc["checker_admitted"] = bool(results) and all(doc[name]["admitted"] for name in results)
    doc["paper"] = PAPER
    doc["wall_s"] = None
    return doc


#: A run whose CPU probe exceeds this is flagged ``contended`` (unloaded: well under 1 ms).
CONTENDED_PROBE_MS: Final[float] = 20.0


def cpu_probe_ms() -> float:
    """Milliseconds for 50 small float32 matmuls on torch's (vLLM-bound) threads.

    Independent of the system under test. On this 2-core machine it takes well under a
    millisecond when the CPUs are free and 100-700 ms while another process's OpenMP threads
    compete for the same cores; the runs record it before and after, so contended runs are
    visible in the results instead of silently skewing them."""
    import torch

    a = torch.ones(64, 128)
    b = torch.ones(128, 128)
    t0 = time.perf_counter()
    for _ in range(50):
        a @ b
    return (time.perf_counter() - t0) * 1000.0


def _loadavg() -> float:
    try:
        return float(os.getloadavg()[0])
    except OSError:  # pragma: no cover - not on Linux
        return float("nan")


def _cpus() -> int | None:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count()


def load(path: str | Path | None) -> tuple[Trace, str]:
    p = Path(path) if path is not None else DEFAULT_TRACE_PATH
    return load_trace(p), str(p)
