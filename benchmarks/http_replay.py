"""One replay of a revision trace through one HTTP arm against a real server, wall-clock driven.

The asyncio twin of ``replay.run_once``: the same trace, the same slow consumer per scope (when
idle it takes everything in its scope's inbox, then stays busy for ``consumer_delay_s``), the same
records (``metrics.Read``, ``metrics.VersionSpan``) and therefore the same metrics
(``metrics.compute``) and the same admission (``reference.admit``: what the consumer read of a
version while it was current must be a prefix of its clean reference output). Events fire at
their scaled times as tasks, so a revision that waits (``let_run``) never delays the trace.

What only the HTTP arms add: a version is *closed* when the client saw its stream end (its last
chunk, or the client closing it); ``obsolete_tokens_computed`` counts the tokens the server
streamed for a version after it was retired, as the client received them (for ``http_abort`` the
server may compute a little more after the disconnect, which the client cannot see);
``EngineSampler`` polls the server's Prometheus ``/metrics`` for engine utilisation (the share of
samples with a running request), queued requests, vLLM's queue time and generated tokens.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable
from typing import Any

import attrs
import httpx
import openai

from retire_bench import metrics as M
from retire_bench.arms import App, Arm
from retire_bench.reference import Admission, admit
from retire_bench.traces import EventKind, Trace, final_versions, materialize, version_numbers
from retire_vllm.api import Delivery

FIRST_ID = 1  # as replay.FIRST_ID: keep token 0 out of prompts


def _metric(text: str, name: str) -> float:
    """Sum of every sample of ``name`` (all label sets) in a Prometheus exposition."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and (line[len(name)] in " {"):
            try:
                total += float(line.rsplit(" ", 1)[1])
            except ValueError:
                continue
    return total


class EngineSampler:
    """Polls ``/metrics``: running / waiting requests over time, and counters at both ends."""

    GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting")
    COUNTERS = (
        "vllm:request_queue_time_seconds_sum",
        "vllm:request_queue_time_seconds_count",
        "vllm:generation_tokens_total",
    )

    def __init__(
        self, base: str, period_s: float = 0.1, clock: Callable[[], float] = time.perf_counter
    ) -> None:
        self.url = f"{base}/metrics"
        self.period_s = period_s
        self.clock = clock
        self.samples: list[tuple[float, float, float]] = []  # (t, running, waiting)
        self.first: dict[str, float] = {}
        self.last: dict[str, float] = {}

    async def _get(self, h: httpx.AsyncClient) -> str | None:
        try:
            r = await h.get(self.url, timeout=5.0)
        except httpx.HTTPError:
            return None
        return r.text if r.status_code == 200 else None

    async def counters(self, h: httpx.AsyncClient) -> dict[str, float]:
        text = await self._get(h)
        return {} if text is None else {n: _metric(text, n) for n in self.COUNTERS}

    async def run(self, stop: asyncio.Event) -> None:
        async with httpx.AsyncClient() as h:
            self.first = await self.counters(h)
            while not stop.is_set():
                text = await self._get(h)
                if text is not None:
                    running, waiting = (_metric(text, g) for g in self.GAUGES)
                    self.samples.append((self.clock(), running, waiting))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.period_s)
            self.last = await self.counters(h)

    def summary(self, start: float, end: float) -> dict[str, Any]:
        inside = [s for s in self.samples if start <= s[0] <= end]
        n = len(inside)
        d = {k: self.last.get(k, 0.0) - self.first.get(k, 0.0) for k in self.COUNTERS}
        q_n = d["vllm:request_queue_time_seconds_count"]
        return {
            "engine_utilisation": sum(1 for s in inside if s[1] > 0) / n if n else None,
            "mean_running": sum(s[1] for s in inside) / n if n else None,
            "mean_waiting": sum(s[2] for s in inside) / n if n else None,
            "server_queue_ms_mean": 1000.0 * d["vllm:request_queue_time_seconds_sum"] / q_n
            if q_n
            else None,
            "server_generated_tokens": (
                int(d["vllm:generation_tokens_total"]) if self.last else None
            ),
            "metric_samples": n,
        }


@attrs.frozen
class HttpRunResult:
    arm: str
    record: M.RunRecord
    metrics: dict[str, Any]
    admission: Admission


async def run_http(
    arm_cls: type[Arm],
    base: str,
    model: str,
    trace: Trace,
    *,
    time_scale: float,
    consumer_delay_s: float,
    cleanup_limit_s: float,
    reference: dict[tuple[str, int], tuple[int, ...]],
    vocab_size: int,
    tag: str,
    clock: Callable[[], float] = time.perf_counter,
) -> HttpRunResult:
    """One run of ``arm_cls`` against the server at ``base``; scopes and the cache salt carry
    ``tag`` so that runs on the same long-lived server share nothing."""
    prompts = materialize(trace, vocab_size=vocab_size, first_id=FIRST_ID)
    numbers = version_numbers(trace)
    finals = set(final_versions(trace))
    client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0, timeout=600.0)
    app = App(client, model, clock, cache_salt=tag, prefix=f"{tag}-")
    arm = arm_cls(app)
    spans: dict[tuple[str, int], M.VersionSpan] = {}
    current: dict[str, int] = {}
    cancelled: set[str] = set()
    reads: list[M.Read] = []
    finished_current: set[tuple[str, int]] = set()
    problems: list[str] = []
    tasks: list[asyncio.Task[None]] = []
    all_done = asyncio.Event()
    fired = asyncio.Event()
    for ev in trace.events:
        app.open_scope(ev.scope)
    sampler = EngineSampler(base, clock=clock)
    stop_sampling = asyncio.Event()
    sampling = asyncio.create_task(sampler.run(stop_sampling))
    await asyncio.sleep(0)

    def check_done() -> None:
        if fired.is_set() and all(
            s in cancelled or (s, v) in finished_current for s, v in current.items()
        ):
            all_done.set()

    load_before = _loadavg()
    start = clock()

    async def fire_all() -> None:
        for i, ev in enumerate(trace.events):
            delay = start + ev.t * time_scale - clock()
            if delay > 0:
                await asyncio.sleep(delay)
            now = clock()
            key = (ev.scope, numbers[i])
            if ev.kind in (EventKind.SUBMIT, EventKind.REVISION):
                assert ev.max_new_tokens is not None
                if ev.kind is EventKind.REVISION:
                    old = (ev.scope, current[ev.scope])
                    spans[old] = attrs.evolve(spans[old], retired_at=now)
                spans[key] = M.VersionSpan(
                    ev.scope,
                    key[1],
                    now,
                    None,
                    None,
                    key in finals,
                    len(prompts[key]),
                    ev.max_new_tokens,
                )
                current[ev.scope] = key[1]
                if ev.kind is EventKind.REVISION:
                    arm.retiring(ev.scope)  # the application's reaction, before anything runs
                call = arm.submit if ev.kind is EventKind.SUBMIT else arm.revise
                coro = call(ev.scope, key[1], prompts[key], ev.max_new_tokens)
            elif ev.kind is EventKind.CANCEL:
                old = (ev.scope, current[ev.scope])
                spans[old] = attrs.evolve(spans[old], retired_at=now)
                cancelled.add(ev.scope)
                arm.retiring(ev.scope)
                coro = arm.cancel(ev.scope)
            else:
                raise ValueError(f"the HTTP arms do not replay {ev.kind} events")
            tasks.append(asyncio.create_task(coro))
        fired.set()
        check_done()

    async def consume(scope: str) -> None:
        while True:
            await app.ready[scope].wait()
            got = app.take(scope)
            at = clock()
            for ch in got:
                if not arm.admit(ch):
                    continue
                d = Delivery(scope, ch.version, ch.token_ids, ch.finish_reason is not None, at)
                reads.append(M.Read(d, at))
                span = spans.get((scope, ch.version))
                if d.finished and span is not None and span.retired_at is None:
                    finished_current.add((scope, ch.version))
            check_done()
            await asyncio.sleep(consumer_delay_s)

    consumers = [asyncio.create_task(consume(s)) for s in app.inbox]
    firing = asyncio.create_task(fire_all())
    last_t = trace.events[-1].t * time_scale if trace.events else 0.0
    try:
        await asyncio.wait_for(all_done.wait(), last_t + cleanup_limit_s)
    except TimeoutError:
        problems.append("not every current version finished within the cleanup limit")
    window_end = clock()
    await firing
    for res in await asyncio.gather(*tasks, return_exceptions=True):
        if isinstance(res, BaseException):
            problems.append(f"request task failed: {type(res).__name__}: {res}")
    await app.drain(max(1.0, cleanup_limit_s - (window_end - start - last_t)))
    end = clock()
    for c in consumers:
        c.cancel()
    stop_sampling.set()
    await sampling
    try:
        await arm.finish()
    except Exception as err:  # reported: the run is not admitted
        problems.append(f"finish failed: {type(err).__name__}: {err}")
    await client.close()
    problems.extend(app.problems)
    closed = {k: s.ended_at for k, s in app.streams.items()}
    record = M.RunRecord(
        arm.name,
        start,
        end,
        tuple(reads),
        tuple(
            attrs.evolve(s, closed_at=closed.get(k)) if s.retired_at else s
            for k, s in spans.items()
        ),
        cleanup_limit_s,
    )
    m = M.compute(record)
    m.update(sampler.summary(start, window_end))
    m["obsolete_tokens_computed"] = sum(s.tokens_after_retire for s in app.streams.values())
    m.update(_accept_split(record, app))
    waits = [
        (s.sent_at - s.asked_at) * 1000.0
        for k, s in app.streams.items()
        if k in finals and s.sent_at is not None
    ]
    m["client_wait_ms_median"] = M.percentile(waits, 50)
    m["load_avg_1m"] = [load_before, _loadavg()]  # other work on the machine, around the run
    m["versions_not_sent"] = sum(s.sent_at is None for s in app.streams.values())
    headers = [
        (s.accepted_at - s.sent_at) * 1000.0
        for k, s in app.streams.items()
        if k in finals and s.sent_at is not None and s.accepted_at is not None
    ]
    m["headers_ms_median"] = M.percentile(headers, 50)
    return HttpRunResult(arm.name, record, m, admit(record, reference, harness_problems=problems))


def _loadavg() -> float:
    try:
        return float(os.getloadavg()[0])
    except OSError:  # pragma: no cover - not on Linux
        return float("nan")


def _accept_split(record: M.RunRecord, app: App) -> dict[str, int]:
    """Obsolete tokens read after the successor's response headers arrived (for Retire: after
    the revision was accepted) and before (between asking and acceptance)."""
    after = 0
    for r in M.classify_reads(record).obsolete:
        nxt = app.streams.get((r.delivery.scope, r.delivery.version + 1))
        if nxt is not None and nxt.accepted_at is not None and r.at >= nxt.accepted_at:
            after += len(r.delivery.token_ids)
    total = sum(len(r.delivery.token_ids) for r in M.classify_reads(record).obsolete)
    return {"obsolete_tokens_after_accept": after, "obsolete_tokens_before_accept": total - after}
