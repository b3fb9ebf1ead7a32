"""Serving overhead: stock vLLM's OpenAI server against ``retire serve``, one run, one machine.

Both servers run the same model with the same engine settings, side by side; rounds alternate
between them so that drift in the machine's speed hits both. A round is a steady load of
streaming completions from concurrent clients (the real ``openai`` client), without revisions:
against ``retire serve`` every request opens its own scope (the scopes are cancelled after the
round, outside the timing). Two ``retire serve`` servers run: one writing the core's transition
log (``--retire-log``, validated at the end), one without it (``retire_nolog``). Reported per
server: time to first token and inter-token latency
(p50, p99; a request's inter-token latency is the time from its first token to its last over the
tokens in between, as vLLM's own benchmark defines it: chunks reach a client in bursts), completion
tokens per second; and Retire over stock as ratios. Then the revision
latency over HTTP, on each ``retire serve`` server: from sending a revision to the arrival of the
old stream's terminal (``superseded``) chunk at the client, and to the revision's response headers
(accepted). The client reads every stream through ``retire_vllm.client.each_chunk``, so a long old
stream does not hold up the revision sent beside it.

``python -m retire_bench.serving [--clients 4] [--requests 12] [--rounds 3] [--trials 30]
[--json PATH]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import openai

from retire_vllm.client import each_chunk, read_stream, scoped

from .servers import RetireServer, Server, StockServer


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _prompt(seed: int, n: int) -> list[int]:
    import random

    rng = random.Random(seed)
    return [rng.randrange(10, 2000) for _ in range(n)]


async def _one(
    c: openai.AsyncOpenAI, model: str, tokens: list[int], max_tokens: int, scope: str | None
) -> dict[str, Any]:
    body: dict[str, Any] = {"ignore_eos": True}
    if scope is not None:
        body.update(scoped(scope))
    t0 = time.perf_counter()
    stream = await c.completions.create(
        model=model,
        prompt=tokens,
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        extra_body=body,
    )
    first = last = float("nan")
    async for chunk in each_chunk(stream):
        if chunk.choices and chunk.choices[0].text:
            last = time.perf_counter()
            if first != first:  # NaN: the first token
                first = last
    # Inter-token latency as vLLM's own benchmark defines it (time per output token after the
    # first): chunks reach the client in bursts, so gaps between chunks would say nothing.
    return {"ttft": first - t0, "itl": (last - first) / (max_tokens - 1)}


async def _round(server: Server, scoped_requests: bool, args: Any, tag: str) -> dict[str, Any]:
    c = openai.AsyncOpenAI(base_url=f"{server.base}/v1", api_key="none", max_retries=0)
    scopes: list[str] = []

    async def client(k: int) -> list[dict[str, Any]]:
        out = []
        for i in range(args.requests):
            scope = f"bench-{tag}-{k}-{i}" if scoped_requests else None
            if scope:
                scopes.append(scope)
            out.append(await _one(c, server.model, _prompt(k * 1000 + i, 128), 64, scope))
        return out

    t0 = time.perf_counter()
    results = [
        r for rs in await asyncio.gather(*(client(k) for k in range(args.clients))) for r in rs
    ]
    wall = time.perf_counter() - t0
    async with httpx.AsyncClient() as h:
        for scope in scopes:
            (await h.post(f"{server.base}/v1/scopes/{scope}/cancel")).raise_for_status()
    await c.close()
    return {
        "ttft": [r["ttft"] for r in results],
        "itl": [r["itl"] for r in results],
        "tokens": 64 * len(results),
        "wall": wall,
    }


async def _revision_latency(server: RetireServer, trials: int) -> dict[str, list[float]]:
    c = openai.AsyncOpenAI(base_url=f"{server.base}/v1", api_key="none", max_retries=0)
    closed, accepted = [], []
    for t in range(trials):
        scope = f"rev-{t}"
        old = await c.completions.create(
            model=server.model,
            prompt=_prompt(5000 + t, 96),
            max_tokens=1500,
            temperature=0,
            stream=True,
            extra_body={"ignore_eos": True, **scoped(scope)},
        )
        end: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        started = asyncio.Event()

        async def read(
            stream: Any = old, done: asyncio.Future[float] = end, first: asyncio.Event = started
        ) -> None:
            n = 0
            async for chunk in each_chunk(stream):
                n += 1
                if n == 3:
                    first.set()
                if chunk.choices and chunk.choices[0].finish_reason is not None and not done.done():
                    done.set_result(time.perf_counter())
            if not done.done():
                done.set_result(float("nan"))

        reader = asyncio.create_task(read())
        await started.wait()
        sent = time.perf_counter()
        new = await c.completions.create(
            model=server.model,
            prompt=_prompt(6000 + t, 96),
            max_tokens=2,
            temperature=0,
            stream=True,
            extra_body={"ignore_eos": True, **scoped(scope)},
        )
        accepted.append(time.perf_counter() - sent)
        closed.append(await end - sent)
        await read_stream(new)
        await reader
        async with httpx.AsyncClient() as h:
            (await h.post(f"{server.base}/v1/scopes/{scope}/cancel")).raise_for_status()
    await c.close()
    return {"old_stream_closed": closed, "revision_accepted": accepted}


def _summary(rounds: list[dict[str, Any]]) -> dict[str, float]:
    ttft = [x for r in rounds for x in r["ttft"]]
    itl = [x for r in rounds for x in r["itl"]]
    return {
        "ttft_p50_ms": 1000 * _pct(ttft, 0.5),
        "ttft_p99_ms": 1000 * _pct(ttft, 0.99),
        "itl_p50_ms": 1000 * _pct(itl, 0.5),
        "itl_p99_ms": 1000 * _pct(itl, 0.99),
        "tokens_per_s": sum(r["tokens"] for r in rounds) / sum(r["wall"] for r in rounds),
    }


def run(args: Any) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="retire-serving-bench-"))
    retire = RetireServer(tmp / "retire")
    quiet = RetireServer(tmp / "retire-nolog", log=False)
    stock = StockServer(tmp / "stock", retire.model)
    try:
        by: dict[str, list[dict[str, Any]]] = {"stock": [], "retire": [], "retire_nolog": []}
        for r in range(args.rounds):
            by["stock"].append(asyncio.run(_round(stock, False, args, f"s{r}")))
            by["retire"].append(asyncio.run(_round(retire, True, args, f"r{r}")))
            by["retire_nolog"].append(asyncio.run(_round(quiet, True, args, f"q{r}")))
        revision = asyncio.run(_revision_latency(retire, args.trials))
        revision_nolog = asyncio.run(_revision_latency(quiet, args.trials))
        retire.check_clean()
        quiet.check_clean()
    finally:
        stock.stop()
        quiet.close()
        verdict = retire.close()
    s, t = _summary(by["stock"]), _summary(by["retire"])
    q = _summary(by["retire_nolog"])
    report = {
        "command": "python -m retire_bench.serving "
        + " ".join(f"--{k} {v}" for k, v in vars(args).items() if k != "json"),
        "stock": s,
        "retire": t,
        "retire_nolog": q,
        "ratio_retire_over_stock": {k: t[k] / s[k] for k in s},
        "ratio_retire_nolog_over_stock": {k: q[k] / s[k] for k in s},
        "added_itl_p50_percent": 100 * (t["itl_p50_ms"] / s["itl_p50_ms"] - 1),
        "revision_ms": _revision_summary(revision),
        "revision_nolog_ms": _revision_summary(revision_nolog),
        "core_log": verdict.strip(),
    }
    return report


def _revision_summary(revision: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    return {
        key: {"p50": 1000 * _pct(v, 0.5), "p99": 1000 * _pct(v, 0.99), "n": len(v)}
        for key, v in revision.items()
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m retire_bench.serving", description=__doc__)
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--requests", type=int, default=12, help="per client and round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--trials", type=int, default=30, help="revision-latency trials")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    if min(args.clients, args.requests, args.rounds, args.trials) < 1:
        p.error("--clients, --requests, --rounds and --trials must be at least 1")
    report = run(args)
    print(f"{'':>12} {'TTFT p50':>9} {'TTFT p99':>9} {'ITL p50':>8} {'ITL p99':>8} {'tok/s':>8}")
    for name in ("stock", "retire", "retire_nolog"):
        r = report[name]
        print(
            f"{name:>12} {r['ttft_p50_ms']:9.2f} {r['ttft_p99_ms']:9.2f} {r['itl_p50_ms']:8.2f} "
            f"{r['itl_p99_ms']:8.2f} {r['tokens_per_s']:8.1f}"
        )
    for key in ("ratio_retire_over_stock", "ratio_retire_nolog_over_stock"):
        ratio = report[key]
        print(f"{key}: " + ", ".join(f"{k} {v:.3f}" for k, v in ratio.items()))
    for server, summary in (("retire", "revision_ms"), ("retire_nolog", "revision_nolog_ms")):
        for key, v in report[summary].items():
            print(
                f"revision ({server}), {key}: p50 {v['p50']:.2f} ms, p99 {v['p99']:.2f} ms "
                f"({v['n']} trials)"
            )
    print(report["core_log"])
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
