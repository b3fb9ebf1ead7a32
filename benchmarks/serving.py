"""Serving overhead: stock vLLM's OpenAI server against ``retire serve``, one run, one machine.

Both servers run the same model with the same engine settings, side by side; rounds alternate
between them (each round starting with the next server) so that drift in the machine's speed
hits all. A round is a steady load of streaming completions from concurrent clients (the real
``openai`` client), without revisions, on prompts no earlier round sent (a repeat would be a
prefix cache hit for stock vLLM only: every Retire scope has its own cache salt): against
``retire serve`` every request opens its own scope (the scopes are cancelled after the round,
outside the timing). Two ``retire serve`` servers run: one writing the core's transition log
(``--retire-log``, validated at the end), one without it (``retire_nolog``). Reported per
server: time to first token and inter-token latency (p50, p99; a request's inter-token latency
is the time from its first token to its last over the tokens in between, as vLLM's own
benchmark defines it: chunks reach a client in bursts), completion tokens per second, each
round's ITL p50, and the server's CPU time per completion token by process (API process,
engine core, workers: the measure that counts Retire's work wherever it runs); Retire over stock
as ratios; and, for the Retire servers, each scoped request's opening (its ``Server-Timing``)
beside its time to first token, the engine core's own account of Retire's time during the
rounds (``retire_engine_*`` on ``/metrics``: its hooks inside the steps per step and as a share
of the step, the workers' digests within the steps) and the API process's (``retire_api_*``: its
per-output code, per output and per step). Then the revision
latency over HTTP, on each ``retire serve`` server: from sending a revision to the arrival of the
old stream's terminal (``superseded``) chunk at the client, and to the revision's response headers
(accepted), split into the revision's ``Server-Timing`` phases (``retire_vllm.serving.wire``)
and the rest of the close (HTTP in, the fence's terminal output back to the client);
``--step-digests off`` runs the Retire servers without the step digests' connector;
``--revisions-only`` runs just these trials, once with each reader of the old stream: ``raw``
(SSE lines, a reader that keeps up) and ``openai`` (the client's chunks), on two servers side by
side: one deciding a revision as it reaches the engine core's ``open`` socket (``early_opens``,
the default) and one with ``--retire-open-socket off`` (between steps, by the utility call
alone); ``--reader`` picks one for the full run. ``--apart`` puts the client on a CPU of its own
and the servers on the others, as a client on another machine. (Without it the client shares
the cores with the servers; until results.md 8.14 it was then starved for seconds at times,
by stock vLLM's server as by ``retire serve``: each server ran in a session of its own, which
Linux's per-session scheduling favoured over the client's. ``servers.Server`` now keeps them
in the client's session.) ``--model-size small`` runs both servers on a larger locally built
model, whose heavier step shows how Retire's per-step cost compares with a model step longer
than the tiny model's few milliseconds. The client reads every stream through
``retire_vllm.client.each_chunk``, so a long old stream does not hold up the revision sent
beside it.

``python -m retire_bench.serving [--clients 4] [--requests 12] [--rounds 3] [--trials 30]
[--revisions-only] [--reader openai|raw] [--apart] [--model-size tiny|small]
[--step-digests on|off] [--json PATH]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import httpx
import openai

from retire_vllm.client import each_chunk, read_stream, scoped
from retire_vllm.default_model import ensure_default_model
from retire_vllm.serving import wire

from .accounts import CPU_ROLES, engine_share, engine_time, spent_since, tree_cpu_seconds
from .servers import (
    CLIENT_TIMEOUT_S,
    RetireServer,
    Server,
    StockServer,
    model_options,
    ready_together,
)


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(v for v in values if v == v)  # NaN: the trial had no such phase
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _prompt(seed: int, n: int) -> list[int]:
    import random

    rng = random.Random(seed)
    return [rng.randrange(10, 2000) for _ in range(n)]


#: The prompt seeds of the revision trials: ``REVISION_SEEDS + trial`` (old version) and
#: ``REVISION_SEEDS + 1000 + trial`` (its revision).
REVISION_SEEDS = 5000


def load_seed(round_no: int, client: int, request: int) -> int:
    """The prompt seed of a load request: unique per (round, client, request) for up to 1,000
    clients and requests each, and apart from the revision trials' seeds."""
    if not (0 <= client < 1000 and 0 <= request < 1000 and round_no >= 0):
        raise ValueError(f"no load seed for round {round_no}, client {client}, request {request}")
    return 1_000_000 * (round_no + 1) + 1000 * client + request


async def _one(
    c: openai.AsyncOpenAI, model: str, tokens: list[int], max_tokens: int, scope: str | None
) -> dict[str, Any]:
    body: dict[str, Any] = {"ignore_eos": True}
    if scope is not None:
        body.update(scoped(scope))
    t0 = time.perf_counter()
    raw = await c.completions.with_raw_response.create(
        model=model,
        prompt=tokens,
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        extra_body=body,
    )
    # a scoped request's opening, in the server (all its Server-Timing phases but the fence's,
    # which lies within the commands; none for stock or a request without a scope)
    phases = _server_timing(raw.headers.get("server-timing", ""))
    phases.pop("retire-fence", None)
    first = last = float("nan")
    async for chunk in each_chunk(raw.parse()):
        if chunk.choices and chunk.choices[0].text:
            last = time.perf_counter()
            if first != first:  # NaN: the first token
                first = last
    # Inter-token latency as vLLM's own benchmark defines it (time per output token after the
    # first): chunks reach the client in bursts, so gaps between chunks would say nothing.
    return {
        "ttft": first - t0,
        "itl": (last - first) / (max_tokens - 1),
        "opening": sum(phases.values()) / 1000 if phases else float("nan"),
        "opening_queue": phases.get("retire-queue", float("nan")) / 1000,
    }


async def _round(
    server: Server, scoped_requests: bool, args: Any, tag: str, round_no: int
) -> dict[str, Any]:
    """One round of load. Every round sends prompts no round sent before (to any server): a
    repeated prompt would be a prefix cache hit for stock vLLM, whereas each Retire scope has a
    cache salt of its own, so the two would not be doing the same work."""
    c = openai.AsyncOpenAI(base_url=f"{server.base}/v1", api_key="none", max_retries=0)
    scopes: list[str] = []

    async def client(k: int) -> list[dict[str, Any]]:
        out = []
        for i in range(args.requests):
            scope = f"bench-{tag}-{k}-{i}" if scoped_requests else None
            if scope:
                scopes.append(scope)
            prompt = _prompt(load_seed(round_no, k, i), 128)
            out.append(await _one(c, server.model, prompt, 64, scope))
        return out

    before = await engine_time(server) if scoped_requests else None
    cpu = tree_cpu_seconds(server.proc.pid)
    t0 = time.perf_counter()
    results = [
        r for rs in await asyncio.gather(*(client(k) for k in range(args.clients))) for r in rs
    ]
    wall = time.perf_counter() - t0
    cpu = spent_since(tree_cpu_seconds(server.proc.pid), cpu)
    engine = spent_since(await engine_time(server), before) if before is not None else None
    async with httpx.AsyncClient() as h:
        for scope in scopes:
            (await h.post(f"{server.base}/v1/scopes/{scope}/cancel")).raise_for_status()
    await c.close()
    return {
        "ttft": [r["ttft"] for r in results],
        "itl": [r["itl"] for r in results],
        "opening": [r["opening"] for r in results],
        "opening_queue": [r["opening_queue"] for r in results],
        "tokens": 64 * len(results),
        "wall": wall,
        "cpu_seconds": cpu,
        "engine_time": engine,
    }


class _OldStream:
    """The stream a revision supersedes, as a trial watches it: ``started`` once its third chunk
    arrived (the revision is sent then), ``end`` (arrival time, finish reason) at its last."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.end: asyncio.Future[tuple[float, str]] = asyncio.get_running_loop().create_future()

    def saw(self, n: int, reason: str | None) -> None:
        """The ``n``-th chunk arrived, carrying ``reason`` (None: not the last)."""
        if n == 3:
            self.started.set()
        if reason is not None and not self.end.done():
            self.end.set_result((time.perf_counter(), reason))

    async def read(self, reading: Coroutine[Any, Any, None]) -> None:
        await reading
        if not self.end.done():
            self.end.set_result((float("nan"), "no finish reason"))


async def _read_openai(c: openai.AsyncOpenAI, body: dict[str, Any], old: _OldStream) -> None:
    """Read the old stream through the ``openai`` client's chunks, as an application does."""
    stream = await c.completions.create(**body)
    n = 0
    async for chunk in each_chunk(stream):
        n += 1
        old.saw(n, chunk.choices[0].finish_reason if chunk.choices else None)


async def _read_raw(h: httpx.AsyncClient, url: str, body: dict[str, Any], old: _OldStream) -> None:
    """Read the old stream as raw SSE lines, fast enough to keep its socket drained."""
    payload = {**{k: v for k, v in body.items() if k != "extra_body"}, **body["extra_body"]}
    async with h.stream("POST", url, json=payload) as response:
        n = 0
        async for line in response.aiter_lines():
            await asyncio.sleep(0)  # buffered lines are read without suspending
            if line.startswith("data: {"):
                n += 1
                ended = '"finish_reason":"' in line  # parse only the last chunk
                old.saw(n, json.loads(line[6:])["choices"][0]["finish_reason"] if ended else None)


async def _revision_latency(
    server: RetireServer, trials: int, reader_kind: str = "openai"
) -> dict[str, list[float]]:
    """``reader_kind`` reads the old stream: ``openai`` (the ``openai`` client's chunks, as an
    application reads them; a reader slower than the server leaves a backlog of chunks sent
    before the revision in its socket, and the terminal chunk arrives behind them) or ``raw``
    (SSE lines off the socket, fast enough to keep it drained: the server's own close).

    Per trial (seconds; NaN where a phase does not apply): ``old_stream_closed`` when the old
    stream ended ``superseded``; ``old_version_finished_first`` when it ended by itself before
    the revision reached the authority (nothing was superseded: a starved client can send its
    revision that late); ``revision_accepted``; the revision's Server-Timing phases; and the
    rest of the close beyond ``wire.CLOSE_PHASES`` (the revision's way in over HTTP, the
    terminal output's way from the engine core's output queue to the client)."""
    # a fresh connection per request: a kept-alive one the server times out (uvicorn: 5 s)
    # while a starved client reuses it fails the request
    fresh = {"Connection": "close"}
    # and the load's bound on every phase (the client's default gives a connect 5 s, which a
    # client sharing the servers' two cores exceeded: a run without --apart failed on it)
    c = openai.AsyncOpenAI(
        base_url=f"{server.base}/v1",
        api_key="none",
        max_retries=0,
        default_headers=fresh,
        timeout=CLIENT_TIMEOUT_S,
    )
    h = httpx.AsyncClient(timeout=CLIENT_TIMEOUT_S, headers=fresh)
    nan = float("nan")
    out: dict[str, list[float]] = {
        "old_stream_closed": [],
        "old_version_finished_first": [],
        "revision_accepted": [],
        "rest-to-old-stream-closed": [],
    }
    for t in range(trials):
        scope = f"rev-{reader_kind}-{t}"
        old = _OldStream()
        body = {
            "model": server.model,
            "prompt": _prompt(REVISION_SEEDS + t, 96),
            "max_tokens": 1500,
            "temperature": 0,
            "stream": True,
            "extra_body": {"ignore_eos": True, **scoped(scope)},
        }
        reading = (
            _read_raw(h, f"{server.base}/v1/completions", body, old)
            if reader_kind == "raw"
            else _read_openai(c, body, old)
        )
        reader = asyncio.create_task(old.read(reading))
        waiting = asyncio.create_task(old.started.wait())
        await asyncio.wait((reader, waiting), return_when=asyncio.FIRST_COMPLETED)
        if not old.started.is_set():  # the old stream failed or ended at once: say why
            waiting.cancel()
            await reader
            raise RuntimeError(f"trial {t}: the old stream ended before its third chunk")
        sent = time.perf_counter()
        raw = await c.completions.with_raw_response.create(
            model=server.model,
            prompt=_prompt(REVISION_SEEDS + 1000 + t, 96),
            max_tokens=2,
            temperature=0,
            stream=True,
            extra_body={"ignore_eos": True, **scoped(scope)},
        )
        new = raw.parse()
        out["revision_accepted"].append(time.perf_counter() - sent)
        phases = _server_timing(raw.headers.get("server-timing", ""))
        for name in wire.SERVER_TIMING_NAMES:
            out.setdefault(name, []).append(phases[name] / 1000 if name in phases else nan)
        ended_at, reason = await old.end
        superseded = reason == wire.FINISH_SUPERSEDED
        out["old_stream_closed"].append(ended_at - sent if superseded else nan)
        out["old_version_finished_first"].append(nan if superseded else ended_at - sent)
        before = sum(out[n][-1] for n in wire.CLOSE_PHASES)
        out["rest-to-old-stream-closed"].append(ended_at - sent - before if superseded else nan)
        await read_stream(new)
        await reader
        (await h.post(f"{server.base}/v1/scopes/{scope}/cancel")).raise_for_status()
    await c.close()
    await h.aclose()
    return out


def _server_timing(header: str) -> dict[str, float]:
    """``Server-Timing`` metrics -> milliseconds."""
    metrics = (m.split(";") for m in header.split(",") if m.strip())
    return {
        m[0].strip(): float(d.strip().removeprefix("dur="))
        for m in metrics
        for d in m[1:]
        if d.strip().startswith("dur=")
    }


def _summary(rounds: list[dict[str, Any]]) -> dict[str, float]:
    """Percentiles over every request of ``rounds``; for scoped requests also their opening
    (``opening_p50_ms``: from the API process's arrival to the admitted version's answer, of
    which ``opening_queue_p50_ms`` waiting for the step in flight) and what the first token
    took beyond it (``ttft_after_opening_p50_ms``: the way in, adding the request, its wait for
    a step, the prefill and the first token's way out)."""
    ttft = [x for r in rounds for x in r["ttft"]]
    itl = [x for r in rounds for x in r["itl"]]
    summary = {
        "ttft_p50_ms": 1000 * _pct(ttft, 0.5),
        "ttft_p99_ms": 1000 * _pct(ttft, 0.99),
        "itl_p50_ms": 1000 * _pct(itl, 0.5),
        "itl_p99_ms": 1000 * _pct(itl, 0.99),
        "tokens_per_s": sum(r["tokens"] for r in rounds) / sum(r["wall"] for r in rounds),
    }
    tokens = sum(r["tokens"] for r in rounds)
    for role in CPU_ROLES:
        summary[f"cpu_ms_per_token_{role}"] = (
            1000 * sum(r["cpu_seconds"][role] for r in rounds) / tokens
        )
    summary["cpu_ms_per_token"] = sum(summary[f"cpu_ms_per_token_{r}"] for r in CPU_ROLES)
    openings = [
        (t, o, q)
        for r in rounds
        for t, o, q in zip(r["ttft"], r["opening"], r["opening_queue"], strict=True)
        if o == o  # NaN: not scoped
    ]
    if openings:
        summary["opening_p50_ms"] = 1000 * _pct([o for _, o, _ in openings], 0.5)
        summary["opening_queue_p50_ms"] = 1000 * _pct([q for _, _, q in openings], 0.5)
        summary["ttft_after_opening_p50_ms"] = 1000 * _pct([t - o for t, o, _ in openings], 0.5)
    return summary


def _command(args: Any) -> str:
    """The command line that repeats this run."""
    flags = []
    only_revisions = ("trials", "revisions_only", "apart", "model_size", "step_digests")
    for key, value in vars(args).items():
        flag = "--" + key.replace("_", "-")
        if key == "json" or value is False or (args.revisions_only and key not in only_revisions):
            continue
        flags.append(flag if value is True else f"{flag} {value}")
    return " ".join(["python -m retire_bench.serving", *flags])


def place_apart() -> dict[str, list[int]]:
    """Pin this process to its first CPU and what it starts afterwards (the servers) to the
    others, as a client on another machine would be: on a small machine a client that shares
    the cores with the engine core and the API process can be starved for seconds (stock vLLM's
    server included). Returns the placement; call before starting the servers, then
    ``client_cpus`` once they are up."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit("--apart needs at least two CPUs")
    os.sched_setaffinity(0, cpus[1:])
    return {"client": cpus[:1], "servers": cpus[1:]}


def client_cpus(placement: dict[str, list[int]] | None) -> None:
    if placement is not None:
        os.sched_setaffinity(0, placement["client"])


def retire_server(
    tmp: Path,
    model_size: str,
    *,
    log: bool = True,
    step_digests: str = "on",
    open_socket: str = "on",
    wait: bool = True,
) -> RetireServer:
    """``retire serve`` with a locally built model (``tiny``: the embedded default) and the same
    engine options stock vLLM's server gets for it (``model_options``): left to its defaults,
    ``retire serve`` would run the default model without vLLM's stats logging, which stock's
    server does."""
    model = str(ensure_default_model(size=model_size))
    return RetireServer(
        tmp,
        ["--retire-step-digests", step_digests, "--retire-open-socket", open_socket],
        options=[model, *model_options(model, 1024)],
        log=log,
        wait=wait,
    )


def run_revisions(args: Any) -> dict[str, Any]:
    """Only the revision trials, on two ``retire serve`` without the core log, one deciding a
    revision as it arrives on the engine core's ``open`` socket (the default) and one with
    ``--retire-open-socket off`` (decided between steps, by the utility call), once with each
    reader of the old stream (alternating trial blocks would mix their backlogs: one after the
    other): where a revision's time goes (its Server-Timing phases), per trial, and the two
    servers' close side by side."""
    placement = place_apart() if args.apart else None
    tmp = Path(tempfile.mkdtemp(prefix="retire-serving-bench-"))
    servers = {
        "": retire_server(
            tmp / "retire-nolog",
            args.model_size,
            log=False,
            step_digests=args.step_digests,
            wait=False,
        ),
        "_between_steps": retire_server(
            tmp / "retire-between-steps",
            args.model_size,
            log=False,
            step_digests=args.step_digests,
            open_socket="off",
            wait=False,
        ),
    }
    ready_together(servers.values())
    client_cpus(placement)
    report: dict[str, Any] = {
        "command": _command(args),
        "placement": placement or "shared: client and servers on every CPU",
    }
    try:
        for reader in ("raw", "openai"):
            for suffix, server in servers.items():
                revision = asyncio.run(_revision_latency(server, args.trials, reader))
                report[f"revision_{reader}_reader{suffix}_ms"] = _revision_summary(revision)
                report[f"revision_{reader}_reader{suffix}_trials_ms"] = _per_trial(revision)
            on = report[f"revision_{reader}_reader_ms"]["old_stream_closed"]
            off = report[f"revision_{reader}_reader_between_steps_ms"]["old_stream_closed"]
            report[f"close_{reader}_reader_ratio_open_socket_over_between_steps"] = {
                q: on[q] / off[q] for q in ("p50", "p99") if off[q]
            }
        for server in servers.values():
            server.check_clean()
    finally:
        for server in servers.values():
            server.close()
    return report


def run(args: Any) -> dict[str, Any]:
    placement = place_apart() if args.apart else None
    tmp = Path(tempfile.mkdtemp(prefix="retire-serving-bench-"))
    retire = retire_server(
        tmp / "retire", args.model_size, step_digests=args.step_digests, wait=False
    )
    quiet = retire_server(
        tmp / "retire-nolog",
        args.model_size,
        log=False,
        step_digests=args.step_digests,
        wait=False,
    )
    stock = StockServer(tmp / "stock", str(ensure_default_model(size=args.model_size)), wait=False)
    ready_together((retire, quiet, stock))
    client_cpus(placement)
    try:
        by: dict[str, list[dict[str, Any]]] = {"stock": [], "retire": [], "retire_nolog": []}
        servers = [("stock", stock, False), ("retire", retire, True), ("retire_nolog", quiet, True)]
        for r in range(args.rounds):
            # the same prompts for the three servers in a round, new ones in the next; each
            # round starts with the next server, so none always runs first
            for name, server, scoped_requests in servers[r % 3 :] + servers[: r % 3]:
                by[name].append(asyncio.run(_round(server, scoped_requests, args, f"{name}{r}", r)))
        revision = asyncio.run(_revision_latency(retire, args.trials, args.reader))
        revision_nolog = asyncio.run(_revision_latency(quiet, args.trials, args.reader))
        retire.check_clean()
        quiet.check_clean()
    finally:
        stock.stop()
        quiet.close()
        verdict = retire.close()
    s, t = _summary(by["stock"]), _summary(by["retire"])
    q = _summary(by["retire_nolog"])
    report = {
        "command": _command(args),
        "placement": placement or "shared: client and servers on every CPU",
        "stock": s,
        "retire": t,
        "retire_nolog": q,
        "ratio_retire_over_stock": {k: t[k] / s[k] for k in s if s[k]},
        "ratio_retire_nolog_over_stock": {k: q[k] / s[k] for k in s if s[k]},
        "added_itl_p50_percent": 100 * (t["itl_p50_ms"] / s["itl_p50_ms"] - 1),
        # what the engine side measured of itself during the same rounds
        "engine_time_retire": engine_share(by["retire"]),
        "engine_time_retire_nolog": engine_share(by["retire_nolog"]),
        # the spread between rounds, beside the difference between servers
        "itl_p50_ms_per_round": {
            name: [_summary([x])["itl_p50_ms"] for x in by[name]] for name in by
        },
        "revision_ms": _revision_summary(revision),
        "revision_nolog_ms": _revision_summary(revision_nolog),
        "revision_nolog_trials_ms": _per_trial(revision_nolog),
        "core_log": verdict.strip(),
    }
    return report


def _revision_summary(revision: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    return {
        key: {"p50": 1000 * _pct(v, 0.5), "p99": 1000 * _pct(v, 0.99), "n": sum(x == x for x in v)}
        for key, v in revision.items()
    }


def _per_trial(revision: dict[str, list[float]]) -> list[dict[str, float | None]]:
    """Trial by trial, in ms (None: no such phase in that trial)."""
    n = len(revision["revision_accepted"])
    return [
        {k: round(1000 * v[i], 3) if v[i] == v[i] else None for k, v in revision.items()}
        for i in range(n)
    ]


def _print_revisions(report: dict[str, Any]) -> None:
    for server, summary in (
        ("retire", "revision_ms"),
        ("retire_nolog", "revision_nolog_ms"),
        ("retire_nolog, raw reader", "revision_raw_reader_ms"),
        ("retire_nolog, raw reader, between steps", "revision_raw_reader_between_steps_ms"),
        ("retire_nolog, openai reader", "revision_openai_reader_ms"),
        ("retire_nolog, openai reader, between steps", "revision_openai_reader_between_steps_ms"),
    ):
        for key, v in report.get(summary, {}).items():
            print(
                f"revision ({server}), {key}: p50 {v['p50']:.2f} ms, p99 {v['p99']:.2f} ms "
                f"({v['n']} trials)"
            )


def _print_close_ratios(report: dict[str, Any]) -> None:
    for reader in ("raw", "openai"):
        ratio = report.get(f"close_{reader}_reader_ratio_open_socket_over_between_steps")
        if ratio:
            print(
                f"old stream closed, {reader} reader, open socket / between steps: "
                + ", ".join(f"{q} {v:.2f}x" for q, v in ratio.items())
            )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m retire_bench.serving", description=__doc__)
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--requests", type=int, default=12, help="per client and round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--trials", type=int, default=30, help="revision-latency trials")
    p.add_argument(
        "--revisions-only",
        action="store_true",
        help="only the revision trials (retire serve without the core log, with and without its "
        "open socket), with their phases",
    )
    p.add_argument(
        "--reader",
        choices=("openai", "raw"),
        default="openai",
        help="how the revision trials read the old stream: the openai client's chunks, or raw "
        "SSE lines fast enough to keep the socket drained (--revisions-only runs both)",
    )
    p.add_argument(
        "--apart",
        action="store_true",
        help="the client on a CPU of its own, the servers on the others (a client on another "
        "machine); default: all share every CPU",
    )
    p.add_argument(
        "--model-size",
        choices=("tiny", "small"),
        default="tiny",
        help="the locally built model both servers run: tiny (the default model, steps of a few "
        "ms here) or small (hidden 512, 4 layers: a heavier step)",
    )
    p.add_argument(
        "--step-digests",
        choices=("on", "off"),
        default="on",
        help="retire serve's --retire-step-digests: the workers digest a step's blocks within "
        "the step through a KV connector (on), or the engine side reads them after it (off)",
    )
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    if min(args.clients, args.requests, args.rounds, args.trials) < 1:
        p.error("--clients, --requests, --rounds and --trials must be at least 1")
    if max(args.clients, args.requests, args.trials) > 1000:
        p.error("--clients, --requests and --trials must be at most 1,000 (distinct prompts)")
    if args.revisions_only:
        report = run_revisions(args)
        _print_revisions(report)
        _print_close_ratios(report)
        if args.json is not None:
            args.json.write_text(json.dumps(report, indent=2))
        return 0
    report = run(args)
    print(
        f"{'':>12} {'TTFT p50':>9} {'TTFT p99':>9} {'ITL p50':>8} {'ITL p99':>8} {'tok/s':>8} "
        f"{'CPU ms/token':>12}"
    )
    for name in ("stock", "retire", "retire_nolog"):
        r = report[name]
        print(
            f"{name:>12} {r['ttft_p50_ms']:9.2f} {r['ttft_p99_ms']:9.2f} {r['itl_p50_ms']:8.2f} "
            f"{r['itl_p99_ms']:8.2f} {r['tokens_per_s']:8.1f} {r['cpu_ms_per_token']:12.3f}"
        )
    for name in ("stock", "retire", "retire_nolog"):
        r = report[name]
        print(
            f"{name} CPU ms per token: "
            + ", ".join(f"{role} {r[f'cpu_ms_per_token_{role}']:.3f}" for role in CPU_ROLES)
        )
    for name in ("retire", "retire_nolog"):
        r = report[name]
        print(
            f"{name} TTFT p50: opening {r['opening_p50_ms']:.2f} ms (of which waiting for the "
            f"step in flight {r['opening_queue_p50_ms']:.2f}), after it "
            f"{r['ttft_after_opening_p50_ms']:.2f} ms"
        )
    for key in ("ratio_retire_over_stock", "ratio_retire_nolog_over_stock"):
        ratio = report[key]
        print(f"{key}: " + ", ".join(f"{k} {v:.3f}" for k, v in ratio.items()))
    for name in ("retire", "retire_nolog"):
        e = report[f"engine_time_{name}"]
        print(
            f"{name} engine core: step {e['step_ms']:.2f} ms, Retire inside steps "
            f"{e['in_step_us_per_step']:.0f} us/step ({100 * e['in_step_share']:.1f}%; workers' "
            f"digests {e['worker_wait_us_per_step']:.0f}), "
            f"between steps {e['between_steps_us_per_step']:.0f} us/step; API process "
            f"{e['api_us_per_output']:.1f} us/output, {e['api_us_per_step']:.0f} us/step "
            f"({100 * e['api_share']:.1f}%); the workers' digests within the steps "
            f"{e['worker_digest_us_per_step']:.0f} us/step ({100 * e['worker_digest_share']:.1f}%)"
            f"; Retire in all {100 * e['retire_share']:.1f}% of the step"
        )
    _print_revisions(report)
    print(report["core_log"])
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
