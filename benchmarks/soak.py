"""Load and soak: many live scopes revised in bursts against ``retire serve`` for a bounded time.

The driver is an asyncio client in this process (the real ``openai.AsyncOpenAI`` through
``arms.App``, the HTTP reader the replay benchmarks use), not ``locust``. What is measured is the
time between two events on *different* streams of one scope: a revision is sent on a new
connection and the old version's stream ends with its ``superseded`` terminal chunk on another.
One event loop sees both with one clock; locust (a gevent greenlet per user, with its own
statistics and no notion of two responses that belong together) would need a second timing
layer. One asyncio process also keeps hundreds of streams cheap, with the benchmarks' own code.

What the clients do: first every scope (``--scopes``, each with its tenant and its own prompt)
is opened with a one-token version, so that the load starts with all of them live (not timed).
Then ``--clients`` clients take the scopes one at a time from a round-robin queue until
``--seconds`` have passed. A visit is a *burst*: its first request revises the scope (whose
version ran to its end or was interrupted), then 1 to ``--max-revisions`` revisions follow, each
sent once the client has read a few tokens of the version before it (which the revision
supersedes: the old stream must end with ``superseded``). Each revision keeps the scope's prompt
prefix, so it inherits the certified blocks of the version before it. The burst's last version
then either runs to its end (``length``; the scope stays live and is revised again on a later
visit), is cancelled (``POST /v1/scopes/{scope}/cancel``: its stream ends ``cancelled``; the
slot's new scope, under a new id, is opened at once with a one-token version), or is closed
by the client (vLLM aborts it; the scope keeps its pages for the next visit's revision). The
server's idle expiry (``--ttl``, default the server's 900 s) cancels scopes not visited for that
long (clients that cycle through the scopes faster than that leave one idle past its expiry
every ``--rest-every`` bursts) and forgets cancelled ones that long after: a visit that finds
its scope expired gets 409 ``scope_cancelled`` and opens the slot's new scope, one that finds it
forgotten opens it again under the same id (version 0). Scope records therefore number the
live scopes plus those cancelled within the last ttl: flat only in a run longer than the ttl.

Measured: requests/s (generation requests answered), supersede latency (revision sent -> old
stream ended with ``superseded``), first-token latency (request sent -> first token; all
versions and revisions only), the resident memory of the API process and of the engine-core
process (psutil) every ``--sample-s`` seconds, with what the server says each of its
structures holds (``GET /v1/retire/leaks``: ``sizes``, ``api_sizes``). At the end every live
scope is cancelled, cancelled scopes are forgotten (``POST /v1/retire/expire``), and the server
must hold nothing: no block, pin, cached page, request, admission, scope record.

The verdict fails (exit status 1) on any of: a request or stream that ended other than in a
known way (``length``, ``superseded``, ``cancelled``, closed by the client, or 409
``scope_cancelled`` for an expired scope), a structure over its bound in any sample (the KV pool,
the core's ledger, the requests in flight, the live scopes, cancelled scopes not forgotten one
expiry period after their idle time), anything left at the end, and (``--max-rss-growth-mib``)
memory that grows: after the first quarter of the run (start-up), the median RSS of the last
half against the first half of what is left, per process.

``python -m retire_bench.soak [--scopes 1000] [--seconds 600] [--clients 48] [--ttl 900]
[--rest-every 0] [--json PATH]``
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs
import httpx
import openai

from retire_vllm.client import scoped
from retire_vllm.engine_config import BLOCK_SIZE

from .arms import App, Stream
from .metrics import percentile
from .servers import RetireServer, engine_core_pid, leak_problems, pool_options, rss_bytes

#: How a stream may end: its finish reasons, ``closed`` (by the client, on purpose), and the
#: refusals a visit may meet when its scope expired while idle: a request on it, or a cancel
#: after its last version ran to its end (a client under load reads late).
KNOWN_ENDS = frozenset(
    {"length", "superseded", "cancelled", "closed", "refused:scope_cancelled", "cancel:expired"}
)
#: The server's counters each sample keeps.
COUNTERS = ("submits", "supersedes", "cancels", "expired", "forgotten", "fences")
#: ``sizes`` that must be zero once every scope is cancelled and forgotten.
AT_REST_ZERO = (
    *("core_scopes", "core_participants", "core_pages", "core_index_scopes", "scope_infos"),
    *("scope_info_versions", "requests", "participants", "request_blocks", "admissions"),
    *("openings", "pipelined", "held_requests", "early_openings", "pending_work"),
    *("ledger_refs", "ledger_cached", "scheduler_requests"),
)
MIB = 1 << 20
#: The clients' connection pools: a connection per request, none kept alive. A kept one can be
#: closed by the server's keep-alive timeout (uvicorn's 5 s, counted from when the server sent
#: the response's end, which a client under load reads later) just as a request is sent on it:
#: the request fails with a read error before it reaches the server, and none is retried here
#: (a scoped request that did arrive would be a revision of its own).
LIMITS = httpx.Limits(max_connections=1000, max_keepalive_connections=0)
#: The same for the ``openai`` client, in the type of its own HTTP package (``httpx`` or, in
#: newer releases, ``httpx2``).
OPENAI_LIMITS = type(openai.DEFAULT_CONNECTION_LIMITS)(
    max_connections=1000, max_keepalive_connections=0
)


@attrs.define
class SoakConfig:
    scopes: int = 1000
    seconds: float = 600.0
    clients: int = 48
    max_revisions: int = 3  # revisions in one burst: 1 to this many
    prompt_blocks: int = 2  # full blocks a revision shares with the version before it
    read_tokens: int = 3  # a client reads 1 to this many tokens of a version before revising it
    long_tokens: int = 256  # asked of a version that will be revised, cancelled or closed
    finish_tokens: int = 8  # asked of a burst's last version when it runs to its end
    p_cancel: float = 0.15  # a burst ends with a cancel
    p_close: float = 0.1  # a burst ends with the client closing its stream
    tenants: int = 4
    sample_s: float = 5.0
    ttl_s: float = 900.0  # the server's --retire-scope-ttl (its default)
    rest_every: int = 0  # every this many bursts, one leaves its scope idle past its expiry
    timeout_s: float = 120.0  # the longest wait for any one thing (a token, a stream's end)
    warmup: bool = True  # open every scope before the load starts (``Soak.open_all``)
    seed: int = 0


@attrs.define
class Slot:
    """One of the ``scopes`` a client may visit; its id changes when its scope is cancelled."""

    index: int
    tenant: str
    base: list[int]
    generation: int = 0

    @property
    def name(self) -> str:
        return f"soak-{self.index}-g{self.generation}"


@attrs.define
class Tally:
    requests: int = 0  # generation requests answered (headers or a refusal)
    bursts: int = 0
    tokens: int = 0
    ends: Counter[str] = attrs.field(factory=Counter)
    errors: Counter[str] = attrs.field(factory=Counter)
    error_samples: list[str] = attrs.field(factory=list)
    supersede_s: list[float] = attrs.field(factory=list)
    first_token_s: list[float] = attrs.field(factory=list)
    first_token_revision_s: list[float] = attrs.field(factory=list)
    accept_s: list[float] = attrs.field(factory=list)
    not_superseded: int = 0  # revisions that found the old version already ended

    def error(self, kind: str, detail: str) -> None:
        self.errors[kind] += 1
        if len(self.error_samples) < 20:
            self.error_samples.append(f"{kind}: {detail}")


class Stall(Exception):
    """Nothing happened on a stream for ``timeout_s``."""


# --- the verdict (pure functions of what was recorded) ----------------------------------------


def growth(series: Sequence[tuple[float, float]], warmup: float = 0.25) -> dict[str, float] | None:
    """How much ``series`` (time, value) grows once start-up is over: the first ``warmup`` share
    of the samples is dropped, the rest split in halves; ``delta`` is the median of the second
    half minus the first's, ``slope_per_h`` the least-squares slope (per hour) of the rest.
    None with fewer than four samples left."""
    rest = list(series[int(len(series) * warmup) :])
    if len(rest) < 4:
        return None
    half = len(rest) // 2
    first = statistics.median(v for _, v in rest[:half])
    second = statistics.median(v for _, v in rest[half:])
    ts = [t for t, _ in rest]
    vs = [v for _, v in rest]
    mt, mv = statistics.fmean(ts), statistics.fmean(vs)
    var = sum((t - mt) ** 2 for t in ts)
    slope = sum((t - mt) * (v - mv) for t, v in zip(ts, vs, strict=True)) / var if var else 0.0
    return {
        "first": first,
        "second": second,
        "delta": second - first,
        "slope_per_h": slope * 3600.0,
        "samples": float(len(rest)),
    }


def sweep_period(ttl_s: float) -> float:
    """How often ``retire serve`` sweeps idle scopes (``RetireAsyncLLM.expire_idle_scopes``)."""
    return max(1.0, min(ttl_s / 4, 30.0))


def rest_s(ttl_s: float) -> float:
    """How long a resting scope stays idle: past its ttl and the sweep that expires it."""
    return ttl_s + sweep_period(ttl_s) + 1.0


def bound_problems(
    samples: Sequence[dict[str, Any]], bounds: dict[str, int], cfg: SoakConfig
) -> list[str]:
    """Every sample's structure sizes against their bounds: the KV pool (``bounds["blocks"]``),
    the core's ledger size, the requests in flight (each client has at most two versions
    running, and an aborted one may linger a moment: three per client; an aborted version's
    request record also stays while its scope keeps its pages: one per live scope), the live
    scopes (one per slot), and cancelled scopes (records of scopes not live) that should have
    been forgotten: one expiry sweep after ``ttl_s`` idle, with slack, every scope cancelled
    earlier must be gone."""
    blocks, flight = bounds["blocks"], 3 * cfg.clients
    limits = {
        "core_pages": blocks,
        "core_generations": blocks,
        "core_index_scopes": 2 * blocks,  # a scope in the page index owns a page
        "core_ledger": bounds["core_ledger"],
        "ledger_refs": blocks,
        "ledger_cached": blocks,
        "spy_generations": blocks,
        "spy_evicted": blocks,
        "spy_listeners": 1,
        "request_blocks": 3 * blocks,
        "admissions": flight,
        "openings": flight,
        "pipelined": flight,
        "held_requests": flight,
        "early_openings": flight,
        "pending_work": flight,
        "scheduler_requests": flight,
        "counters": 64,
        "api_streams": flight,
        "api_tasks": flight,
        "api_output_states": flight,
        "api_parent_requests": flight,
    }
    window = cfg.ttl_s + sweep_period(cfg.ttl_s) + 10.0 + cfg.sample_s
    problems = []
    for s in samples:
        sizes = {**s["sizes"], **{f"api_{k}": v for k, v in s["api_sizes"].items()}}
        at = f"t={s['t']:.0f}s"
        for key, limit in limits.items():
            if sizes.get(key, 0) > limit:
                problems.append(f"{at}: {key} = {sizes[key]} > {limit}")
        scopes, live = sizes["core_scopes"], s["live_scopes"]
        if live > cfg.scopes:
            problems.append(f"{at}: {live} live scopes > {cfg.scopes} slots")
        # a request stays while it runs, and after an abort while its scope keeps its pages
        for key in ("requests", "participants"):
            if sizes[key] > flight + live:
                problems.append(f"{at}: {key} = {sizes[key]} > {flight + live}")
        if sizes["scope_infos"] > scopes:
            problems.append(f"{at}: {sizes['scope_infos']} scope infos > {scopes} scope records")
        if sizes["core_participants"] > scopes + flight:
            problems.append(f"{at}: {sizes['core_participants']} participants > {scopes + flight}")
        if sizes["scope_info_versions"] > 2 * scopes + flight:
            problems.append(f"{at}: scope_info_versions = {sizes['scope_info_versions']}")
        # cancelled, not forgotten: no more than were cancelled within the window before
        earlier = [e for e in samples if e["t"] <= s["t"] - window]
        cancels = s["counters"]["cancels"] - (earlier[-1]["counters"]["cancels"] if earlier else 0)
        if scopes - live > cancels:
            problems.append(
                f"{at}: {scopes - live} cancelled scopes not forgotten, but only {cancels} "
                f"were cancelled in the last {window:.0f} s"
            )
    return problems


def end_problems(leaks: dict[str, Any]) -> dict[str, Any]:
    """What the server still holds once every scope was cancelled and forgotten: the leak check
    of every serving test (``servers.leak_problems``), scope records, and every structure that
    must then be empty."""
    problems = leak_problems(leaks)
    if leaks["scope_records"]:
        problems["scope_records"] = leaks["scope_records"]
    for key in AT_REST_ZERO:
        if leaks["sizes"].get(key, 0):
            problems[f"sizes.{key}"] = leaks["sizes"][key]
    return problems


def verdict(report: dict[str, Any], max_rss_growth_mib: float | None) -> list[str]:
    """Why the run fails (empty: it passes)."""
    problems = [f"{n} x {kind}" for kind, n in report["errors"].items()]
    problems += [f"unknown end {end!r}" for end in report["ends"] if end not in KNOWN_ENDS]
    problems += report["bound_problems"][:20]
    problems += [f"left at the end: {k} = {v}" for k, v in report["leaks_at_end"].items()]
    if not report["supersede_ms"]["n"]:
        problems.append("no revision superseded a running version")
    if max_rss_growth_mib is not None:
        for proc, g in report["rss_growth"].items():
            if g is None:
                problems.append(f"{proc}: too few memory samples to judge growth")
            elif g["delta"] > max_rss_growth_mib * MIB:
                problems.append(
                    f"{proc}: RSS grew {g['delta'] / MIB:.1f} MiB (median of the last half "
                    f"against the first, after start-up) > {max_rss_growth_mib} MiB"
                )
    return problems


# --- the load ---------------------------------------------------------------------------------


class Soak:
    def __init__(
        self,
        base: str,
        model: str,
        cfg: SoakConfig,
        *,
        api_pid: int | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.base = base
        self.cfg = cfg
        self.clock = clock
        self.api_pid = api_pid
        self.engine_pid = engine_core_pid(api_pid) if api_pid is not None else None
        self.client = openai.AsyncOpenAI(
            base_url=f"{base}/v1",
            api_key="none",
            max_retries=0,
            timeout=cfg.timeout_s,
            http_client=openai.DefaultAsyncHttpxClient(limits=OPENAI_LIMITS),
        )
        self.app = App(self.client, model, clock)
        self.tally = Tally()
        self.samples: list[dict[str, Any]] = []
        self.idle_sample: dict[str, Any] = {}
        self.warmup_s = 0.0
        self.bounds: dict[str, int] = {}
        self.http = httpx.AsyncClient(limits=LIMITS)  # the scope routes and the samples
        rng = random.Random(cfg.seed)
        n = cfg.prompt_blocks * BLOCK_SIZE + 8
        self.slots = [
            Slot(i, f"t{i % cfg.tenants}", [rng.randrange(10, 2000) for _ in range(n)])
            for i in range(cfg.scopes)
        ]

    # ---- one visit ----------------------------------------------------------------------

    def _prompt(self, slot: Slot, rng: random.Random) -> list[int]:
        keep = slot.base[: self.cfg.prompt_blocks * BLOCK_SIZE]
        return [*keep, *(rng.randrange(10, 2000) for _ in range(8))]

    async def _send(self, slot: Slot, prompt: list[int], max_tokens: int) -> Stream | None:
        """Send one version of ``slot``'s scope; None when refused (a refusal other than an
        expired scope is an error)."""
        name = slot.name
        self.app.open_scope(name)
        stream = Stream(name, -1, self.clock())
        try:
            await self.app.send(stream, prompt, max_tokens, scoped(name, slot.tenant))
        except openai.APIStatusError as err:
            self.tally.requests += 1
            code = getattr(err, "code", None)
            if err.status_code == 409 and code == "scope_cancelled":
                self.tally.ends["refused:scope_cancelled"] += 1
                self._retire_name(slot)
            else:
                self.tally.error(f"http {err.status_code} {code}", str(err)[:300])
            return None
        except (openai.APIError, httpx.HTTPError) as err:
            self.tally.error(type(err).__name__, f"{err!s:.200} (cause: {err.__cause__!r:.200})")
            return None
        self.tally.requests += 1
        return stream

    def _retire_name(self, slot: Slot) -> None:
        self.app.inbox.pop(slot.name, None)
        self.app.ready.pop(slot.name, None)
        slot.generation += 1

    async def _read(self, stream: Stream, tokens: int) -> None:
        """Wait until ``stream`` delivered ``tokens`` tokens or ended."""
        ready = self.app.ready[stream.scope]
        deadline = self.clock() + self.cfg.timeout_s
        assert stream.task is not None
        while stream.tokens_received < tokens and not stream.task.done():
            left = deadline - self.clock()
            if left <= 0:
                raise Stall(f"{stream.scope}: {stream.tokens_received} of {tokens} tokens")
            waiter = asyncio.ensure_future(ready.wait())
            await asyncio.wait(
                {waiter, stream.task}, timeout=left, return_when=asyncio.FIRST_COMPLETED
            )
            waiter.cancel()
            self.app.take(stream.scope)

    async def _ended(self, stream: Stream, *, revision: bool = False) -> None:
        """Wait for ``stream`` to end and file how it ended (``revision``: it was sent as a
        revision while the version before it streamed)."""
        if stream.task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(stream.task), self.cfg.timeout_s)
            except TimeoutError:
                await self.app.close_stream(stream)
                self.tally.error("stall", f"{stream.scope}: stream did not end")
                return
        self.tally.tokens += stream.tokens_received
        if stream.first_token_at is not None and stream.sent_at is not None:
            self.tally.first_token_s.append(stream.first_token_at - stream.sent_at)
            if revision:
                self.tally.first_token_revision_s.append(stream.first_token_at - stream.sent_at)
        if stream.error is not None:
            self.tally.error("stream broke", f"{stream.scope}: {stream.error[:300]}")
        elif stream.close_requested:
            self.tally.ends["closed"] += 1
        elif stream.finish_reason is None:
            self.tally.error("no finish reason", stream.scope)
        else:
            self.tally.ends[stream.finish_reason] += 1

    async def _visit(self, slot: Slot, rng: random.Random) -> None:
        cfg = self.cfg
        revisions = rng.randint(1, cfg.max_revisions)
        r = rng.random()
        end = "cancel" if r < cfg.p_cancel else "close" if r < cfg.p_cancel + cfg.p_close else "fin"
        prev: Stream | None = None
        stream: Stream | None = None
        revised: set[int] = set()  # ids of the streams sent while the one before streamed
        generation = slot.generation
        try:
            for i in range(revisions + 1):
                last = i == revisions
                budget = cfg.finish_tokens if last and end == "fin" else cfg.long_tokens
                if prev is not None:
                    self.app.discard(prev)  # the application reads the new version only
                stream = await self._send(slot, self._prompt(slot, rng), budget)
                if stream is None and i == 0 and slot.generation != generation:
                    # its scope expired while idle: the visit opens the slot's new scope
                    stream = await self._send(slot, self._prompt(slot, rng), budget)
                if stream is None:
                    if prev is not None:  # refused while a version runs: close it
                        await self.app.close_stream(prev)
                        await self._ended(prev, revision=id(prev) in revised)
                    return
                assert stream.sent_at is not None and stream.accepted_at is not None
                if prev is not None:
                    revised.add(id(stream))
                    self.tally.accept_s.append(stream.accepted_at - stream.sent_at)
                    await self._ended(prev, revision=id(prev) in revised)
                    if prev.finish_reason == "superseded" and prev.ended_at is not None:
                        self.tally.supersede_s.append(prev.ended_at - stream.sent_at)
                    else:
                        self.tally.not_superseded += 1
                if last:
                    break
                await self._read(stream, rng.randint(1, cfg.read_tokens))
                prev = stream
            assert stream is not None
            last_revised = id(stream) in revised
            if end == "fin":
                await self._ended(stream, revision=last_revised)
                return
            await self._read(stream, rng.randint(1, cfg.read_tokens))
            if end == "cancel":
                answer = await self.http.post(
                    f"{self.base}/v1/scopes/{slot.name}/cancel",
                    headers={"x-retire-tenant": slot.tenant},
                    timeout=cfg.timeout_s,
                )
                if answer.status_code == 409 and "scope_cancelled" in answer.text:
                    self.tally.ends["cancel:expired"] += 1
                elif answer.status_code != 200:
                    self.tally.error(f"cancel http {answer.status_code}", answer.text[:300])
                await self._ended(stream, revision=last_revised)
                self._retire_name(slot)
                # the slot's new scope opens at once (one token): every slot keeps a live scope
                fresh = await self._send(slot, self._prompt(slot, rng), 1)
                if fresh is not None:
                    await self._ended(fresh)
            else:
                await self.app.close_stream(stream)
                await self._ended(stream, revision=last_revised)
        except Stall as err:
            self.tally.error("stall", str(err))
            for s in (prev, stream):
                if s is not None and s.ended_at is None:
                    await self.app.close_stream(s)
        finally:
            if slot.name in self.app.inbox:
                self.app.take(slot.name)  # what the last version left unread

    async def _client(self, k: int, idle: asyncio.Queue[Slot], stop_at: float) -> None:
        rng = random.Random(self.cfg.seed * 7919 + k)
        while self.clock() < stop_at:
            slot = await idle.get()
            try:
                await self._visit(slot, rng)
                self.tally.bursts += 1
            except Exception as err:  # recorded: the verdict fails on it
                self.tally.error(f"client crashed: {type(err).__name__}", f"{err!r:.300}")
            finally:
                self._put_back(idle, slot)

    def _put_back(self, idle: asyncio.Queue[Slot], slot: Slot) -> None:
        """Back in the queue at once, or after its scope rested (idle past its expiry, every
        ``rest_every``-th burst): however fast the clients cycle through the scopes, the
        server's expiry then cancels idle ones while the load runs."""
        every = self.cfg.rest_every
        if every and self.tally.bursts % every == 0:
            asyncio.get_running_loop().call_later(rest_s(self.cfg.ttl_s), idle.put_nowait, slot)
        else:
            idle.put_nowait(slot)

    # ---- sampling ---------------------------------------------------------------------------

    async def sample(self, h: httpx.AsyncClient, t0: float) -> dict[str, Any]:
        leaks = (await h.get(f"{self.base}/v1/retire/leaks", timeout=self.cfg.timeout_s)).json()
        self.bounds = leaks["bounds"]
        s = {
            "t": self.clock() - t0,
            "rss_api": rss_bytes(self.api_pid),
            "rss_engine": rss_bytes(self.engine_pid),
            "sizes": leaks["sizes"],
            "api_sizes": leaks["api_sizes"],
            "live_scopes": len(leaks["live_scopes"]),
            "scope_records": leaks["scope_records"],
            "counters": {k: leaks["counters"].get(k, 0) for k in COUNTERS},
        }
        self.samples.append(s)
        return s

    async def _sampler(self, stop: asyncio.Event, t0: float) -> None:
        while not stop.is_set():
            try:
                await self.sample(self.http, t0)
            except (httpx.HTTPError, ValueError) as err:
                self.tally.error("sample failed", f"{type(err).__name__}: {err}")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.cfg.sample_s)

    async def open_all(self) -> float:
        """Open every scope with one short version (one token), ``clients`` requests at a time,
        so that the load starts with every scope live; returns the time it took. What it counts
        is dropped afterwards, except its errors."""
        todo = list(reversed(self.slots))
        rng = random.Random(self.cfg.seed)

        async def opener() -> None:
            while todo:
                slot = todo.pop()
                stream = await self._send(slot, self._prompt(slot, rng), 1)
                if stream is not None:
                    await self._ended(stream)

        started = self.clock()
        await asyncio.gather(*(opener() for _ in range(self.cfg.clients)))
        took = self.clock() - started
        opened = self.tally
        self.tally = Tally(errors=opened.errors, error_samples=opened.error_samples)
        return took

    async def run(self) -> float:
        """The load, for ``seconds`` (visits under way then finish), after ``open_all`` when
        ``warmup``; returns the load's wall time."""
        self.idle_sample = await self.sample(self.http, self.clock())  # the server at rest
        self.samples.clear()
        if self.cfg.warmup:
            self.warmup_s = await self.open_all()
        idle: asyncio.Queue[Slot] = asyncio.Queue()
        for slot in self.slots:
            idle.put_nowait(slot)
        t0 = self.clock()
        stop = asyncio.Event()
        sampler = asyncio.create_task(self._sampler(stop, t0))
        await asyncio.gather(
            *(self._client(k, idle, t0 + self.cfg.seconds) for k in range(self.cfg.clients))
        )
        wall = self.clock() - t0
        stop.set()
        await sampler
        await self.sample(self.http, t0)  # after the load: nothing in flight
        await self.http.aclose()
        await self.client.close()
        return wall


def settle(server: RetireServer, timeout_s: float = 60.0) -> tuple[dict[str, Any], dict[str, Any]]:
    """Cancel every live scope, forget the cancelled ones, and poll until nothing is left (or
    ``timeout_s``); returns the last leaks answer and what it says is left."""
    server.release_all()
    deadline = time.monotonic() + timeout_s
    while True:
        httpx.post(f"{server.base}/v1/retire/expire", json={"idle_seconds": 0}, timeout=60)
        leaks = server.leaks()
        problems = end_problems(leaks)
        if not problems or time.monotonic() > deadline:
            return leaks, problems
        time.sleep(0.5)


def _ms(values: list[float]) -> dict[str, float | int | None]:
    def q(p: float) -> float | None:
        v = percentile(values, p)
        return None if v is None else 1000.0 * v

    return {"p50": q(50), "p99": q(99), "max": q(100), "n": len(values)}


def soak(server: RetireServer, cfg: SoakConfig) -> dict[str, Any]:
    """Drive ``server`` with ``cfg`` and check it at the end; the report (``verdict`` judges)."""
    run = Soak(server.base, server.model, cfg, api_pid=server.proc.pid)
    wall = asyncio.run(run.run())
    busy = run.samples[-1]
    leaks, left = settle(server)
    t = run.tally
    rss = {
        proc: [(s["t"], float(s[key])) for s in run.samples if s[key] is not None]
        for proc, key in (("api", "rss_api"), ("engine_core", "rss_engine"))
    }
    return {
        "config": attrs.asdict(cfg),
        "warmup_seconds": run.warmup_s,
        "at_rest": run.idle_sample,
        "load_seconds": wall,
        "requests": t.requests,
        "requests_per_s": t.requests / wall,
        "bursts": t.bursts,
        "supersedes_per_s": len(t.supersede_s) / wall,
        "tokens_per_s": t.tokens / wall,
        "supersede_ms": _ms(t.supersede_s),
        "first_token_ms": _ms(t.first_token_s),
        "first_token_after_revision_ms": _ms(t.first_token_revision_s),
        "revision_accepted_ms": _ms(t.accept_s),
        "not_superseded": t.not_superseded,
        "ends": dict(t.ends),
        "errors": dict(t.errors),
        "error_samples": t.error_samples,
        "rss_mib": {
            proc: {
                "start": series[0][1] / MIB if series else None,
                "end": series[-1][1] / MIB if series else None,
                "max": max(v for _, v in series) / MIB if series else None,
            }
            for proc, series in rss.items()
        },
        "rss_growth": {proc: growth(series) for proc, series in rss.items()},
        "bounds": run.bounds,
        "bound_problems": bound_problems(run.samples, run.bounds, cfg),
        "sizes_max": {k: max(s["sizes"][k] for s in run.samples) for k in run.samples[-1]["sizes"]},
        "after_load": busy,
        "counters_at_end": leaks["counters"],
        "leaks_at_end": left,
        "samples": run.samples,
    }


def start_server(tmp: Path, cfg: SoakConfig, blocks: int, *, log: bool) -> RetireServer:
    """``retire serve`` with a pool of ``blocks`` KV blocks and ``cfg.ttl_s`` expiry."""
    options = pool_options(blocks)
    return RetireServer(tmp, ["--retire-scope-ttl", str(cfg.ttl_s)], options, log=log)


def _mib(n: int | None) -> str:
    return "-" if n is None else f"{n / MIB:.1f}"


def table(report: dict[str, Any], problems: list[str]) -> str:
    c = report["config"]

    def ms(key: str) -> str:
        m = report[key]
        if not m["n"]:
            return "-"
        return f"p50 {m['p50']:8.1f}   p99 {m['p99']:8.1f}   max {m['max']:8.1f}   (n={m['n']})"

    lines = [
        f"soak: {c['scopes']} scopes, {c['clients']} clients, {report['load_seconds']:.0f} s of "
        f"load, pool {report['bounds'].get('blocks')} blocks, scope ttl {c['ttl_s']:.0f} s",
        f"warm-up               {report['warmup_seconds']:8.1f} s (every scope opened); at rest "
        f"before it: RSS api {_mib(report['at_rest'].get('rss_api'))}, engine core "
        f"{_mib(report['at_rest'].get('rss_engine'))} MiB",
        f"requests/s            {report['requests_per_s']:8.1f}   ({report['requests']} requests, "
        f"{report['bursts']} bursts, {report['supersede_ms']['n']} supersedes, "
        f"{report['tokens_per_s']:.0f} tokens/s)",
        f"supersede ms          {ms('supersede_ms')}",
        f"first token ms        {ms('first_token_ms')}",
        f"  after a revision    {ms('first_token_after_revision_ms')}",
        f"revision accepted ms  {ms('revision_accepted_ms')}",
    ]
    for proc, r in report["rss_mib"].items():
        g = report["rss_growth"][proc]
        if r["start"] is None:
            lines.append(f"RSS {proc:<12}      -")
            continue
        trend = (
            f"growth {g['delta'] / MIB:+.1f} MiB (halves), slope {g['slope_per_h'] / MIB:+.1f} "
            "MiB/h"
            if g
            else "growth -"
        )
        lines.append(
            f"RSS {proc:<12} MiB  start {r['start']:7.1f}  end {r['end']:7.1f}  "
            f"max {r['max']:7.1f}  {trend}"
        )
    ends = ", ".join(f"{k} {v}" for k, v in sorted(report["ends"].items()))
    lines.append(f"ends                  {ends}")
    lines.append(f"errors                {sum(report['errors'].values())}")
    left = report["leaks_at_end"]
    lines.append(f"left at the end       {left or 'nothing (0 blocks, pins, requests, scopes)'}")
    lines.append("verdict               " + ("PASS" if not problems else "FAIL"))
    lines += [f"  - {p}" for p in problems]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m retire_bench.soak", description=__doc__)
    d = SoakConfig()
    p.add_argument("--scopes", type=int, default=d.scopes)
    p.add_argument("--seconds", type=float, default=d.seconds, help="of load")
    p.add_argument("--clients", type=int, default=d.clients)
    p.add_argument("--max-revisions", type=int, default=d.max_revisions)
    p.add_argument("--ttl", type=float, default=d.ttl_s, help="the server's scope expiry")
    p.add_argument("--sample-s", type=float, default=d.sample_s)
    p.add_argument(
        "--rest-every",
        type=int,
        default=d.rest_every,
        help="every this many bursts, one leaves its scope idle until it expires (0: never)",
    )
    p.add_argument("--blocks", type=int, default=2048, help="KV pool of the server")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--no-log", action="store_true", help="no core log (none validated)")
    p.add_argument(
        "--max-rss-growth-mib",
        type=float,
        default=64.0,
        help="fail when a process's RSS grows more than this (negative: do not judge)",
    )
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    if min(args.scopes, args.clients, args.max_revisions) < 1 or args.seconds <= 0:
        p.error("--scopes, --clients, --max-revisions and --seconds must be positive")
    if args.rest_every < 0:
        p.error("--rest-every must be 0 or positive")
    cfg = SoakConfig(
        scopes=args.scopes,
        seconds=args.seconds,
        clients=args.clients,
        max_revisions=args.max_revisions,
        ttl_s=args.ttl,
        rest_every=args.rest_every,
        sample_s=args.sample_s,
        seed=args.seed,
    )
    tmp = Path(tempfile.mkdtemp(prefix="retire-soak-"))
    server = start_server(tmp, cfg, args.blocks, log=not args.no_log)
    try:
        report = soak(server, cfg)
    finally:
        validated = server.close()
    report["core_log"] = validated.strip()
    report["command"] = "python -m retire_bench.soak " + " ".join(argv or sys.argv[1:])
    limit = args.max_rss_growth_mib if args.max_rss_growth_mib >= 0 else None
    problems = verdict(report, limit)
    report["verdict"] = {"pass": not problems, "problems": problems}
    print(table(report, problems))
    print(report["core_log"])
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2))
    return 0 if not problems else 1


if __name__ == "__main__":
    raise SystemExit(main())
