"""``retire serve`` under races: revisions that reach the engine core while a step is in flight or
in bursts, versions revoked between their admission and their request, clients that leave at
any moment (also while their revision opens), and pause, resume and cancel racing them. Each
test ends with nothing left on the server (``check_clean``)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
from typing import Any

import httpx
import openai
import pytest

from retire_bench.servers import CLIENT_TIMEOUT_S, RetireServer
from retire_vllm.client import scoped, stamp
from tests.vllm.serving_support import (
    ATTEMPTS,
    BLOCK,
    cancel,
    client_that_may_leave,
    complete,
    expected_end,
    fresh_connections,
    hunt_window,
    leave_at_random,
    long_prefills,
    prompt,
    random_clients,
    status,
    stream_to_end,
    until_admitted,
)

pytestmark = pytest.mark.vllm


def test_five_revisions_within_50_ms_and_concurrent_scopes(
    client: openai.OpenAI, retire_server: RetireServer
) -> None:
    async def run() -> list[Any]:
        c = retire_server.openai(asynchronous=True)
        tasks = []
        for i in range(5):  # one scope, five versions in quick succession
            tasks.append(
                asyncio.create_task(
                    # none can reach its end within the burst, whatever order they arrive in
                    stream_to_end(c, retire_server.model, "burst", prompt(10 + i, 80), 3000)
                )
            )
            await asyncio.sleep(0.01)
        for s in range(3):  # three more scopes, two revisions each, interleaved
            for v in range(2):
                tasks.append(
                    asyncio.create_task(
                        stream_to_end(
                            c,
                            retire_server.model,
                            f"conc-{s}",
                            prompt(20 + 2 * s + v, 70),
                            3000,
                        )
                    )
                )
        results = await asyncio.gather(*tasks)
        await c.close()
        return list(results)

    results = asyncio.run(run())
    for scope, versions in [("burst", 5), ("conc-0", 2), ("conc-1", 2), ("conc-2", 2)]:
        ends = dict(sorted((v, reason) for (name, v), reason in results if name == scope))
        assert list(ends) == list(range(versions))
        assert ends[versions - 1] == "length"  # the last version runs to its end
        # Every other version is superseded while it runs -- unless its revision reached the
        # authority only after it had run to its end (a starved machine can hold a request back
        # for that long): then, and only then, the core log shows it finishing first.
        for v in range(versions - 1):
            assert ends[v] == expected_end(retire_server, scope, v), (scope, ends)
    for scope in ["burst", "conc-0", "conc-1", "conc-2"]:
        assert cancel(retire_server, scope).status_code == 200


def test_a_revision_that_arrives_while_a_step_is_in_flight(
    client: openai.OpenAI, retire_server: RetireServer
) -> None:
    """The old version's long prefill is the step in flight: the revision waits in vLLM's input
    queue for the step boundary, and the old stream still publishes nothing after it."""

    async def run(scope: str) -> tuple[Any, Any]:
        c = retire_server.openai(asynchronous=True)
        old = asyncio.create_task(
            stream_to_end(c, retire_server.model, scope, prompt(80, 3000), 1000)
        )
        async with fresh_connections() as h:  # version 0 is admitted: its prefill is starting
            await until_admitted(h, f"{retire_server.base}/v1/scopes/{scope}")
        new = await stream_to_end(c, retire_server.model, scope, prompt(81, 40), 8)
        result = await old, new
        await c.close()
        return result

    for attempt in range(ATTEMPTS):
        scope = f"inflight-{attempt}"
        (old_mark, old_reason), (new_mark, new_reason) = asyncio.run(run(scope))
        assert new_mark == (scope, 1) and new_reason == "length"
        assert cancel(retire_server, scope).status_code == 200
        assert old_mark == (scope, 0)
        if old_reason == "length":  # a starved client: the old version ended before the revision
            continue
        assert old_reason == "superseded"
        return
    raise AssertionError("every old version ran to its end before its revision arrived")


def test_a_client_that_leaves_while_its_revision_opens_leaves_no_admission(
    client: openai.OpenAI, retire_server: RetireServer
) -> None:
    """The client leaves while its revision's open call waits behind another request's long
    prefill (the step in flight): its request, sent right behind the open, is aborted by vLLM
    (the engine side drops it if it is still held, the version's participants close if it
    started) and the API process tells the engine side to forget an admission nobody used
    (``abandon``, which gives back the handoff pins of the blocks it adopted); nothing is left
    behind (the fixture's leak check includes admissions, pins, pipelined and held requests),
    and the next revision still inherits the prefix. (Before the pins were given back, that
    revision's end stopped the engine core: a finished version's block was still pinned.)"""
    model = retire_server.model
    base = prompt(90, 130)
    complete(client, model, base, 4, **scoped("left"))

    def abandoned() -> int:
        from prometheus_client.parser import text_string_to_metric_families

        text = httpx.get(f"{retire_server.base}/metrics", timeout=CLIENT_TIMEOUT_S).text
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "retire_api_openings_left_total":
                    return int(sample.value)
        raise AssertionError("no retire_api_openings_left on /metrics")

    async def leave_while_opening(attempt: int, delay: float) -> None:
        c = retire_server.openai(asynchronous=True)
        # unscoped, so added at once: its prefill (about 130 ms here) is the step in flight
        load = prompt(95 + attempt, 3000)
        busy = asyncio.create_task(complete(c, model, load, 1))
        await asyncio.sleep(0.01)
        revision = asyncio.create_task(complete(c, model, [*base, attempt], 4, **scoped("left")))
        await asyncio.sleep(delay)
        revision.cancel()  # closes its connection: the client is gone
        with contextlib.suppress(asyncio.CancelledError):
            await revision
        await busy
        await c.close()

    tries = itertools.count()

    def attempt(delay: float) -> str:
        """``hit``: the client left while its revision was being opened; ``late``: after it was
        opened (the version's request ran and was aborted); ``early``: before its open was
        sent (no version was made)."""
        before, version = abandoned(), status(retire_server, "left").json()["version"]
        asyncio.run(leave_while_opening(next(tries), delay))
        if abandoned() > before:
            return "hit"
        return "late" if status(retire_server, "left").json()["version"] > version else "early"

    hunt_window(attempt)
    info = status(retire_server, "left").json()
    assert info["state"] == "active" and info["receipts_outstanding"] == 0, info
    after = complete(client, model, [*base, 7, 8, 9], 4, **scoped("left"))
    assert after.usage.prompt_tokens_details.cached_tokens == (len(base) // BLOCK) * BLOCK
    assert cancel(retire_server, "left").status_code == 200


@pytest.mark.parametrize("action", ["cancel", "revise"])
def test_a_version_revoked_between_its_admission_and_its_request(
    client: openai.OpenAI, retire_server: RetireServer, action: str
) -> None:
    """A revision's open call (its request right behind it) and, just behind them, a cancel (or
    a revision with another prefix) wait in the engine core's input queue for another request's
    long prefill (the open's copy on the open socket is decided during that prefill); the
    engine core then admits the first revision -- its adopted blocks pinned for its request --
    and takes its request and the cancel before any step runs it. The request ends
    with the fence's reason having run nothing, and the cancel frees the adopted blocks (nothing
    left: the fixture). Before the request was sent right behind its open, it came after the
    cancel, and the admission's pins had to go first (``revoked_admissions``; without that, "the
    core freed block N while it is pinned", a 500): that path stays for a request that another
    request's call overtakes in the API process, between its open and its own sending."""
    model = retire_server.model

    async def race(scope: str, base: list[int], load: list[int], delay: float) -> tuple[Any, Any]:
        c = retire_server.openai(asynchronous=True)
        busy = asyncio.create_task(complete(c, model, load, 1))  # new tokens: no prefix hit
        await asyncio.sleep(0.01)
        first = asyncio.create_task(complete(c, model, [*base, 5], 4, **scoped(scope)))
        await asyncio.sleep(delay)
        if action == "cancel":
            async with fresh_connections() as h:
                second: Any = await h.post(retire_server.scope_url(scope) + "/cancel")
        else:
            second = await complete(c, model, prompt(91, 70), 4, **scoped(scope))
        try:
            return await first, second
        finally:
            await busy
            await c.close()

    expected = "cancelled" if action == "cancel" else "superseded"
    tries = itertools.count()

    def attempt(delay: float) -> str:
        """``hit``: the first revision was admitted and then revoked before its request ran a
        step; ``late``: its request had run; ``early``: the cancel (or the second revision)
        reached the authority before the first revision's open did."""
        n = next(tries)
        scope, base = f"revoked-{action}-{n}", prompt(92 + n, 130)
        complete(client, model, base, 4, **scoped(scope))  # four blocks to adopt
        load = prompt(7000 + 10 * n + (action == "revise"), 3000)
        try:
            first, second = asyncio.run(race(scope, base, load, delay))
        except openai.APIStatusError as refused:  # the first revision's open found it cancelled
            assert action == "cancel" and refused.status_code == 409, refused
            return "early"
        if action == "cancel":
            assert second.status_code == 200, second.text
        else:
            assert cancel(retire_server, scope).status_code == 200
            if stamp(second) == (scope, 1):  # the second revision came first
                assert stamp(first) == (scope, 2)
                return "early"
            assert stamp(second) == (scope, 2) and second.choices[0].finish_reason == "length"
        assert stamp(first) == (scope, 1)
        if first.choices[0].finish_reason == expected and first.choices[0].text == "":
            return "hit"
        return "late"

    hunt_window(attempt, hi=0.1)


@pytest.mark.parametrize("seed", [1, 2])
def test_clients_that_leave_at_any_moment_leave_nothing_behind(
    client: openai.OpenAI, retire_server: RetireServer, seed: int
) -> None:
    """``leave_at_random``; the fixture checks that nothing is left, and the module's core log
    is validated at its end. (With the abandoned admission's pins kept, the engine core
    stopped in both seeds; with them given back, 5 and 2 admissions were abandoned.)"""
    leave_at_random(retire_server, seed)


#: The refusals a client racing pause, resume and cancel can meet: nothing else may fail.
RACE_REFUSALS = {"scope_not_found", "scope_cancelled", "illegal_scope_transition"}


@pytest.mark.parametrize("seed", [3, 4])
def test_pause_resume_and_cancel_race_revisions_and_clients_that_leave(
    client: openai.OpenAI, retire_server: RetireServer, seed: int
) -> None:
    """As above, with pause, resume and cancel of the same scopes at random moments among the
    requests. Every request or call either succeeds or is refused with one of
    ``RACE_REFUSALS`` in OpenAI's error format (a request on a cancelled scope, pausing a paused
    one); then every scope is resumed, the requests still open reach their end, and nothing is
    left once the scopes are cancelled."""
    rng = random.Random(seed)
    model = retire_server.model
    bases = {f"race-{seed}-{i}": prompt(300 + 10 * seed + i, 100) for i in range(2)}
    plan = random_clients(rng, sorted(bases), 20, stays=0.5)
    controls = [
        (rng.choice(sorted(bases)), rng.uniform(0, 0.6), rng.choice(["pause", "resume"]))
        for _ in range(12)
    ]
    controls.append((rng.choice(sorted(bases)), rng.uniform(0.2, 0.6), "cancel"))
    failures: list[BaseException | str] = []

    def refused(err: openai.APIStatusError | httpx.HTTPStatusError) -> None:
        body = err.response.json()
        if err.response.status_code >= 500 or body["error"]["code"] not in RACE_REFUSALS:
            failures.append(f"{err.response.status_code}: {body}")

    async def one(c: openai.AsyncOpenAI, k: int) -> None:
        tokens = [*bases[plan[k][0]], *prompt(2000 * seed + k, plan[k][4])]
        try:
            await client_that_may_leave(c, model, plan[k], tokens)
        except openai.APIStatusError as err:
            refused(err)

    async def control(h: httpx.AsyncClient, scope: str, start: float, action: str) -> None:
        await asyncio.sleep(start)
        try:
            (await h.post(retire_server.scope_url(scope) + f"/{action}")).raise_for_status()
        except httpx.HTTPStatusError as err:
            refused(err)

    async def run_all() -> None:
        c = retire_server.openai(asynchronous=True)
        clients = [asyncio.create_task(one(c, k)) for k in range(len(plan))]
        busy = asyncio.create_task(long_prefills(c, model, seed, 3000))
        async with fresh_connections() as h:
            await asyncio.gather(*(control(h, *op) for op in controls))
            for scope in bases:  # whatever is paused now runs to its end
                await h.post(retire_server.scope_url(scope) + "/resume")
        ends = await asyncio.gather(busy, *clients, return_exceptions=True)
        failures.extend(end for end in ends if isinstance(end, BaseException))
        await c.close()

    asyncio.run(run_all())
    assert not failures, failures
    for scope in bases:
        if status(retire_server, scope).status_code == 200:
            cancel(retire_server, scope)  # a cancelled scope answers 409 again: not checked
