"""What the tests of ``retire serve`` share: prompts and requests through the real ``openai``
client, scope calls over ``httpx``, the long versions a test pauses or interrupts, the hunt for a
race's window, clients that leave at random moments, and the server's own account of how a
version ended (``expected_end``). The servers themselves are the fixtures of ``conftest``; no
test lives here."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections.abc import Callable
from typing import Any

import httpx
import openai

from retire_bench.servers import CLIENT_TIMEOUT_S, HTTP, RetireServer
from retire_vllm.client import read_stream, scoped, stamp

BLOCK = 32


def prompt(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(10, 2000) for _ in range(n)]


def complete(c: Any, model: str, tokens: list[int], max_tokens: int, **body: Any) -> Any:
    return c.completions.create(
        model=model,
        prompt=tokens,
        max_tokens=max_tokens,
        temperature=0,
        extra_body={"ignore_eos": True, **body},
    )


async def open_scoped_stream(
    c: openai.AsyncOpenAI, model: str, scope: str, tokens: list[int], max_tokens: int
) -> Any:
    """A greedy completion stream of ``tokens`` on ``scope`` that ignores EOS."""
    return await c.completions.create(
        model=model,
        prompt=tokens,
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        extra_body={"ignore_eos": True, **scoped(scope)},
    )


async def revise_mid_stream(
    server: RetireServer,
    scope: str,
    old: list[int],
    new: list[int],
    *,
    read: int = 1,
    old_max: int = 2000,
    new_max: int = 12,
) -> tuple[Any, Any, Any]:
    """Stream a version of ``scope`` for ``old``, read ``read`` of its chunks, revise the scope
    with ``new`` (not streamed) while the old stream is open, then read the old stream to its
    end: (the old stream's first chunk, its last chunk, the revision's response)."""
    c, model = server.openai(asynchronous=True), server.model
    stream = await open_scoped_stream(c, model, scope, old, old_max)
    chunks = []
    async for chunk in stream:
        chunks.append(chunk)
        if len(chunks) == read:
            break
    revised = await c.completions.create(
        model=model,
        prompt=new,
        max_tokens=new_max,
        temperature=0,
        extra_body={"ignore_eos": True, **scoped(scope)},
    )
    chunks += await read_stream(stream)
    await c.close()
    return chunks[0], chunks[-1], revised


def texts_streamed_at_once(
    server: RetireServer, prompts: list[list[int]], max_tokens: int, scope: str
) -> list[str]:
    """Each prompt as a greedy scoped stream (scope ``<scope><i>``), all at once over one async
    client; their texts. A stream that stalls fails after 120 s rather than hanging the test."""

    async def stream(client: Any, i: int) -> str:
        async with asyncio.timeout(120):
            chunks = await client.completions.create(
                model=server.model,
                prompt=prompts[i],
                max_tokens=max_tokens,
                temperature=0,
                stream=True,
                extra_body={"ignore_eos": True, **scoped(f"{scope}{i}")},
            )
            return "".join([c.text async for chunk in chunks for c in chunk.choices])

    async def all_at_once() -> list[str]:
        client = server.openai(asynchronous=True)
        try:
            return list(await asyncio.gather(*(stream(client, i) for i in range(len(prompts)))))
        finally:
            await client.close()

    return asyncio.run(all_at_once())


def texts_alone(server: RetireServer, prompts: list[list[int]], max_tokens: int) -> list[str]:
    """The greedy text of each prompt run alone, unscoped, one after another."""
    c = server.openai()
    try:
        return [complete(c, server.model, p, max_tokens).choices[0].text for p in prompts]
    finally:
        c.close()


def cancel(server: RetireServer, scope: str, tenant: str | None = None) -> httpx.Response:
    headers = {"x-retire-tenant": tenant} if tenant else {}
    return HTTP.post(f"{server.base}/v1/scopes/{scope}/cancel", headers=headers)


def status(server: RetireServer, scope: str, tenant: str | None = None) -> httpx.Response:
    headers = {"x-retire-tenant": tenant} if tenant else {}
    return HTTP.get(f"{server.base}/v1/scopes/{scope}", headers=headers)


#: How many times a helper starts its long version again when it ran to its end first: a loaded
#: machine can keep this client off the CPUs for as long as the engine needs for all of its tokens
#: (it did, in a session other than the server's: ``servers.Server`` keeps them in one).
ATTEMPTS = 5


def hunt_window(attempt: Callable[[float], str], tries: int = 12, hi: float = 0.25) -> list[Any]:
    """Calls ``attempt(delay)`` until it answers ``"hit"``, halving the interval of delays (0 to
    ``hi`` seconds) each time: an ``"early"`` answer moves the next delay up, a ``"late"`` one
    down, so the hunt follows the window wherever the machine's load puts it. Returns each
    attempt's ``(delay, answer)``; raises AssertionError with them when no attempt hit."""
    top, lo, outcomes = hi, 0.0, []
    for _ in range(tries):
        delay = (lo + hi) / 2
        answer = attempt(delay)
        outcomes.append((round(delay, 4), answer))
        if answer == "hit":
            return outcomes
        assert answer in ("early", "late"), answer
        if answer == "early":
            lo = delay
        else:
            hi = delay
        if hi - lo < 0.002:  # the window moved away from where the hunt closed in: start over
            lo, hi = 0.0, top
    raise AssertionError(f"no attempt hit the window: {outcomes}")


#: The longest version a helper starts (the default server's context holds 4,096 tokens).
LONGEST = 3500


def long_stream(
    c: openai.OpenAI, server: RetireServer, tokens: list[int], scope: str, max_tokens: int = LONGEST
) -> Any:
    """A long streamed version of ``scope`` with its first chunk read."""
    stream = c.completions.create(
        model=server.model,
        prompt=tokens,
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        extra_body={"ignore_eos": True, **scoped(scope)},
    )
    next(iter(stream))
    return stream


def ran_to_its_end(server: RetireServer, scope: str, refused: httpx.Response | None = None) -> bool:
    """The scope's version finished on its own (only then may a helper try again); a refused
    pause must say so."""
    if status(server, scope).json()["state"] != "finished":
        return False
    if refused is not None:
        assert refused.status_code == 409
        assert refused.json()["error"]["code"] == "illegal_scope_transition"
    return True


def interrupt(
    c: openai.OpenAI, server: RetireServer, tokens: list[int], scope: str, *, paused: bool = False
) -> int:
    """Start a long streamed version of ``scope``, read one chunk, and go away (the user
    interrupts); return the version once vLLM's abort has closed it. With ``paused`` the version
    is paused before its client goes away and the scope resumed after, so the version cannot
    run to its end first however loaded the machine: for a test whose subject is what an
    interrupted version leaves behind, not the disconnect of a running one."""
    for _ in range(ATTEMPTS):
        if paused:
            old = pause_running(c, server, tokens, scope)
        else:
            old = long_stream(c, server, tokens, scope)
        old.close()
        deadline = time.monotonic() + 10
        while status(server, scope).json()["receipts_outstanding"] and time.monotonic() < deadline:
            time.sleep(0.05)
        if paused:
            assert HTTP.post(f"{server.base}/v1/scopes/{scope}/resume").json()["state"] == "active"
        if not ran_to_its_end(server, scope):
            return int(status(server, scope).json()["version"])
    raise AssertionError(f"every version of {scope} ran to its end before its client went away")


def pause_running(
    c: openai.OpenAI, server: RetireServer, tokens: list[int], scope: str, max_tokens: int = LONGEST
) -> Any:
    """A long streamed version of ``scope`` paused while it runs; returns its stream. (A test
    that reads it to its end asks for fewer tokens: the pause lands a few steps after the first
    chunk, and a version that ends before it is tried again, twice as long: how many steps the
    pause takes to land depends on the machine's load, 400 tokens' worth was not always enough.)"""
    for attempt in range(ATTEMPTS):
        stream = long_stream(c, server, tokens, scope, min(max_tokens << attempt, LONGEST))
        paused = HTTP.post(f"{server.base}/v1/scopes/{scope}/pause")
        if paused.status_code == 200:
            assert paused.json()["state"] == "paused"
            return stream
        assert ran_to_its_end(server, scope, paused), paused.json()
        assert [ch for ch in stream][-1].choices[0].finish_reason == "length"
    raise AssertionError(f"every version of {scope} ran to its end before the pause")


def pressure(c: openai.OpenAI, model: str, seed: int) -> None:
    """Other traffic: far more distinct blocks than the pool holds (1,023 usable blocks)."""
    for i in range(12):
        complete(c, model, prompt(seed + i, 3000), 1)


def fresh_connections() -> httpx.AsyncClient:
    """A client that opens a connection per request: a poll every few milliseconds on a kept-alive
    connection can meet the server closing it ("Server disconnected without sending a
    response", seen once in a full run), a race of the transport, not of what is tested."""
    return httpx.AsyncClient(
        timeout=CLIENT_TIMEOUT_S, limits=httpx.Limits(max_keepalive_connections=0)
    )


async def until_admitted(h: httpx.AsyncClient, scope_url: str) -> None:
    while (await h.get(scope_url)).status_code != 200:
        await asyncio.sleep(0.005)


async def stream_to_end(
    c: openai.AsyncOpenAI, model: str, scope: str, tokens: list[int], n: int
) -> Any:
    chunks = await read_stream(await open_scoped_stream(c, model, scope, tokens, n))
    return stamp(chunks[-1]), chunks[-1].choices[0].finish_reason


def expected_end(server: RetireServer, scope: str, version: int) -> str:
    """How ``version`` of ``scope`` must have ended once the next version was accepted: as
    ``superseded``, unless the server's core logs (one per engine, on disk up to the revision's
    utility call) show it finishing on its own before the next version was opened -- a starved
    machine can hold a revision back until the old version ran to its end -- and then as
    ``length``."""
    logs = [log for log in server.core_logs() if log.exists()]  # (an engine yet to log: none)
    lines = [json.loads(line) for log in logs for line in log.read_text().splitlines()]
    mine = [(t["transition"], t["version"]) for t in lines if t.get("scope") == scope]
    revised = mine.index(("supersede", version + 1))
    return "length" if ("finish", version) in mine[:revised] else "superseded"


#: A client of ``client_that_may_leave``: its scope, when it starts (s), whether it streams,
#: when it leaves (s after its start; None: it reads to the end), its tokens past the shared prefix.
Client = tuple[str, float, bool, float | None, int]


def random_clients(rng: random.Random, scopes: list[str], n: int, stays: float) -> list[Client]:
    return [
        (
            rng.choice(scopes),
            rng.uniform(0, 0.6),
            rng.random() < 0.5,
            None if rng.random() < stays else rng.uniform(0, 0.15),
            rng.randrange(0, 40),
        )
        for _ in range(n)
    ]


async def client_that_may_leave(
    c: openai.AsyncOpenAI, model: str, plan: Client, tokens: list[int]
) -> None:
    """One client of ``plan`` (its tokens: ``tokens``), streamed or not, that leaves at its
    moment by closing its connection; raises what its request raised, but for its leaving."""
    scope, start, streamed, leave, _ = plan
    await asyncio.sleep(start)

    async def run() -> None:
        if streamed:
            await read_stream(await open_scoped_stream(c, model, scope, tokens, 24))
        else:
            await complete(c, model, tokens, 8, **scoped(scope))

    task = asyncio.create_task(run())
    if leave is not None:
        await asyncio.sleep(leave)
        task.cancel()  # the client is gone: its connection closes
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def long_prefills(c: openai.AsyncOpenAI, model: str, seed: int, tokens: int) -> None:
    """Unscoped requests whose prefill is the step in flight now and then (about 130 ms for 3,000
    tokens here): versions are opened behind them."""
    for k in range(4):
        await asyncio.sleep(0.15)
        await complete(c, model, prompt(5000 + 10 * seed + k, tokens), 1)


def leave_at_random(server: RetireServer, seed: int, *, load_tokens: int = 3000) -> None:
    """Thirty clients on three scopes of ``server``, each a version (a revision once its scope
    is live), streamed or not, leaving at a random moment -- before the server answers, while
    the version is opened behind an unscoped request's long prefill (``load_tokens``), after
    some chunks -- or reading to the end. No request may fail on the server's side (a 5xx: the
    engine core stopped), and every scope is still served afterwards; then every scope is
    cancelled (the caller checks that nothing is left)."""
    model = server.model
    bases = {f"chaos-{seed}-{i}": prompt(200 + 10 * seed + i, 100) for i in range(3)}
    plan = random_clients(random.Random(seed), sorted(bases), 30, stays=0.3)

    async def run_all() -> list[Any]:
        c = server.openai(asynchronous=True)
        clients = [
            client_that_may_leave(c, model, p, [*bases[p[0]], *prompt(1000 * seed + k, p[4])])
            for k, p in enumerate(plan)
        ]
        ends = await asyncio.gather(
            long_prefills(c, model, seed, load_tokens), *clients, return_exceptions=True
        )
        await c.close()
        return [end for end in ends if isinstance(end, BaseException)]

    failures = asyncio.run(run_all())
    assert not failures, failures
    assert HTTP.get(f"{server.base}/health").status_code == 200
    with server.openai() as c:
        for scope, base in bases.items():
            if status(server, scope).status_code == 404:  # every client of it left early
                continue
            last = complete(c, model, [*base, 1, 2, 3], 2, **scoped(scope))
            assert stamp(last) is not None and last.choices[0].finish_reason == "length"
            assert cancel(server, scope).status_code == 200


def retire_metrics(server: RetireServer) -> dict[str, float]:
    text = HTTP.get(f"{server.base}/metrics").text
    return {
        line.split(" ")[0]: float(line.split(" ")[1])
        for line in text.splitlines()
        if line.startswith("retire_")
    }
