"""``retire serve``: vLLM's own OpenAI server with Retire, driven by the real ``openai`` client.

One ``retire serve`` and one stock vLLM server (same model and engine settings) run as real
processes on 127.0.0.1 (this package's ``conftest``, shared with ``test_races`` and
``test_scope_api``). Every test cancels its scopes and then asks the server what is left
(``check_clean``); closing the server validates its whole core log against the spec. Here:
requests without a scope, the handoff, and the publication trials, which run the same
slow-reader application against both servers: against stock vLLM the application revises by
closing the old stream (vLLM aborts it) and the count of old tokens it still reads is reported;
against Retire it must read none after the revision was accepted.
"""

from __future__ import annotations

import asyncio
import queue
import random
import threading
import time
from typing import Any

import openai
import pytest

from retire_bench.servers import HTTP, RetireServer, StockServer
from retire_bench.serving import _server_timing
from retire_vllm import identity
from retire_vllm.client import ScopeReader, read_stream, scoped, stamp
from tests.vllm.serving_support import (
    BLOCK,
    cancel,
    complete,
    expected_end,
    fresh_connections,
    interrupt,
    open_scoped_stream,
    pressure,
    prompt,
    revise_mid_stream,
    status,
    until_admitted,
)

pytestmark = pytest.mark.vllm


# --- requests without a scope, and the handoff ----------------------------------------------------


def test_unscoped_requests_are_served_as_stock_vllm_serves_them(
    client: openai.OpenAI, retire_server: RetireServer, stock_server: StockServer
) -> None:
    stock = stock_server.openai()
    tokens = prompt(1, 100)
    ours = complete(client, retire_server.model, tokens, 12)
    theirs = complete(stock, stock_server.model, tokens, 12)
    assert ours.choices[0].text == theirs.choices[0].text
    assert stamp(ours) is None  # nothing of Retire's in an unscoped response
    assert ours.choices[0].finish_reason == "length"


def test_revision_inherits_the_certified_prefix_and_equals_a_cold_run(
    client: openai.OpenAI, retire_server: RetireServer, stock_server: StockServer
) -> None:
    stock = stock_server.openai()
    base = prompt(2, 200)
    first = complete(client, retire_server.model, base, 8, **scoped("handoff"))
    assert stamp(first) == ("handoff", 0)
    revised = [*base[:170], *prompt(3, 40)]  # shares 170 tokens: 5 full blocks
    second = complete(client, retire_server.model, revised, 16, **scoped("handoff"))
    assert stamp(second) == ("handoff", 1)
    cold = complete(stock, stock_server.model, revised, 16)
    assert second.choices[0].text == cold.choices[0].text
    assert second.usage.prompt_tokens_details.cached_tokens == 5 * BLOCK
    info = status(retire_server, "handoff").json()
    assert info["version"] == 1 and info["adopted_blocks"] == 5
    assert cancel(retire_server, "handoff").status_code == 200


def test_the_next_turn_inherits_the_previous_turns_output(
    client: openai.OpenAI, retire_server: RetireServer, stock_server: StockServer
) -> None:
    """A conversation's next turn continues the previous prompt and its output: the previous
    version named the prefix identity of each block past its context (its own output) when the
    block's writer closed, so the next turn adopts every full block it wrote, not only those of
    the previous prompt's context, and still equals a cold run."""
    model = retire_server.model
    first_prompt = prompt(80, 3 * BLOCK + 5)  # a context of 3 blocks
    first = complete(
        client, model, first_prompt, 2 * BLOCK + 8, return_token_ids=True, **scoped("turns")
    )
    output = list((first.choices[0].model_extra or {})["token_ids"])
    assert stamp(first) == ("turns", 0) and len(output) == 2 * BLOCK + 8
    history = [*first_prompt, *output]
    written = (len(history) - 1) // BLOCK  # the last sampled token's KV is never written: 5
    assert written == 5 > identity.adoptable_blocks(len(first_prompt), BLOCK) == 3
    second_prompt = [*history, *prompt(81, 7)]
    second = complete(client, model, second_prompt, 8, **scoped("turns"))
    assert stamp(second) == ("turns", 1)
    assert second.usage.prompt_tokens_details.cached_tokens == written * BLOCK
    assert status(retire_server, "turns").json()["adopted_blocks"] == written
    cold = complete(stock_server.openai(), stock_server.model, second_prompt, 8)
    assert second.choices[0].text == cold.choices[0].text
    assert cancel(retire_server, "turns").status_code == 200


def test_handoff_survives_cache_pressure_from_other_requests(
    client: openai.OpenAI, retire_server: RetireServer
) -> None:
    """An interrupted version keeps its pages (the revision usually follows): other requests
    cannot evict them, and the revision inherits them. (Paused before its client goes away: the
    disconnect of a running version is ``test_scope_api``'s.)"""
    base = prompt(4, 256)
    interrupt(client, retire_server, base, "pressure", paused=True)
    pressure(client, retire_server.model, 100)
    revised = [*base[:224], *prompt(5, 20)]
    after = complete(client, retire_server.model, revised, 4, **scoped("pressure"))
    assert after.usage.prompt_tokens_details.cached_tokens == 7 * BLOCK
    assert cancel(retire_server, "pressure").status_code == 200


def test_a_finished_version_goes_back_to_the_prefix_cache(
    client: openai.OpenAI, retire_server: RetireServer, stock_server: StockServer
) -> None:
    """A version that ran to its end keeps no reference to its blocks: they sit in vLLM's prefix
    cache, where a revision still finds them certified, and where other traffic may evict them;
    each eviction is reported and the revision after it recomputes, equal to a cold run."""
    model = retire_server.model
    base = prompt(6, 200)
    complete(client, model, base, 8, **scoped("fin"))
    info = status(retire_server, "fin").json()
    assert info["state"] == "finished" and len(info["pages"]) == 6
    assert info["cached_pages"] == info["pages"]
    leaks = retire_server.leaks()
    assert not set(info["pages"]) & set(leaks["ledger_blocks"])  # no reference held
    assert set(info["pages"]) <= set(leaks["ledger_cached"])
    assert leaks["free_blocks"] == leaks["initial_free_blocks"]  # vLLM counts them free
    revised = [*base[:170], *prompt(7, 40)]
    second = complete(client, model, revised, 16, **scoped("fin"))
    assert second.usage.prompt_tokens_details.cached_tokens == 5 * BLOCK
    assert status(retire_server, "fin").json()["adopted_blocks"] == 5
    evicted = retire_server.leaks()["counters"].get("cached_blocks_evicted", 0)
    pressure(client, model, 300)
    info = status(retire_server, "fin").json()
    assert info["pages"] == [] and info["state"] == "finished"
    assert retire_server.leaks()["counters"]["cached_blocks_evicted"] >= evicted + 6
    third_prompt = [*revised, 1, 2]
    third = complete(client, model, third_prompt, 8, **scoped("fin"))
    assert third.usage.prompt_tokens_details.cached_tokens == 0
    stock = stock_server.openai()
    assert third.choices[0].text == complete(stock, model, third_prompt, 8).choices[0].text
    assert cancel(retire_server, "fin").status_code == 200


# --- the publication trials -----------------------------------------------------------------------


def _reader(stream: Any, out: queue.Queue[Any]) -> None:
    """A reader task feeding the application's queue, as agent UIs have it."""
    try:
        for chunk in stream:
            out.put(chunk)
    except Exception:  # the stream was closed under it (stock arm)
        pass
    out.put(None)


def _trial(
    server: RetireServer | StockServer, seed: int, trial: int, with_retire: bool
) -> dict[str, int]:
    """One slow-reader trial: the application reads the old stream through a queue, revises
    after ``k`` chunks, and keeps reading what it has. Returns the old tokens it read after the
    revision was accepted, and (Retire) what the reader dropped."""
    rng = random.Random(seed * 1000 + trial)
    c, model = server.openai(), server.model
    scope = f"trial-{seed}-{trial}"
    tokens = prompt(seed * 1000 + trial, 96)
    body: dict[str, Any] = {"ignore_eos": True}
    if with_retire:
        body.update(scoped(scope))
    old = c.completions.create(
        model=model, prompt=tokens, max_tokens=1500, temperature=0, stream=True, extra_body=body
    )
    q: queue.Queue[Any] = queue.Queue()
    reader = threading.Thread(target=_reader, args=(old, q), daemon=True)
    reader.start()
    app = ScopeReader()
    if with_retire:
        app.accept_response(scope, old)
    k = rng.randrange(2, 7)
    for _ in range(k):
        chunk = q.get(timeout=60)
        assert chunk is not None
        time.sleep(0.02)  # the slow consumer
    revised = [*tokens, *prompt(seed * 1000 + trial + 1, 8)]
    if not with_retire:
        old.close()  # what users do today: close the old stream, submit the new request
    new = c.completions.create(
        model=model, prompt=revised, max_tokens=4, temperature=0, stream=True, extra_body=body
    )
    if with_retire:
        assert app.accept_response(scope, new) == 1  # accepted: headers come after admission
    read_after = 0
    while True:
        try:  # Retire: up to the old stream's end; stock: what the reader still hands on
            chunk = q.get(timeout=60 if with_retire else 1.0)
        except queue.Empty:
            break
        if chunk is None:
            break
        if app.admit(chunk):
            read_after += len(chunk.choices[0].text) if chunk.choices else 0
    finals = [ch for ch in new if ch.choices]
    assert finals[-1].choices[0].finish_reason == "length"
    if with_retire:
        assert all(stamp(ch) == (scope, 1) for ch in finals)
        HTTP.post(f"{server.base}/v1/scopes/{scope}/cancel").raise_for_status()
    c.close()
    return {"old_chars_read_after": read_after, "dropped": app.dropped}


@pytest.mark.parametrize("seed", [0, 1])
def test_no_old_token_is_read_after_the_revision_is_accepted(
    seed: int, retire_server: RetireServer, stock_server: StockServer
) -> None:
    retire = [_trial(retire_server, seed, t, True) for t in range(9)]
    stock = [_trial(stock_server, seed, t, False) for t in range(9)]
    assert sum(r["old_chars_read_after"] for r in retire) == 0
    print(
        f"seed {seed}: stock vLLM (client closes the old stream): "
        f"{sum(r['old_chars_read_after'] for r in stock)} old characters read after the "
        f"revision in 9 trials; Retire: 0 (the reader dropped {sum(r['dropped'] for r in retire)} "
        "chunks already on the wire)"
    )
    retire_server.check_clean()


def test_the_old_stream_ends_at_once_with_superseded(
    client: openai.OpenAI, retire_server: RetireServer
) -> None:
    base = retire_server.base

    async def run() -> tuple[bool, list[Any]]:
        c = retire_server.openai(asynchronous=True)

        async def old_stream() -> list[Any]:
            s = await open_scoped_stream(c, retire_server.model, "ends", prompt(6, 64), 3500)
            return await read_stream(s)

        old = asyncio.create_task(old_stream())
        async with fresh_connections() as h:
            # Paused as soon as its version exists, the old version cannot reach its end.
            await until_admitted(h, f"{base}/v1/scopes/ends")
            paused = await h.post(f"{base}/v1/scopes/ends/pause")
            info = (await h.get(f"{base}/v1/scopes/ends")).json()
        if paused.status_code == 409:  # a client stalled until the old version ran to its end
            assert paused.json()["error"]["code"] == "illegal_scope_transition", paused.text
            assert info["state"] == "finished", info
        else:
            paused.raise_for_status()
        revision = await c.completions.with_raw_response.create(
            model=retire_server.model,
            prompt=prompt(7, 64),
            max_tokens=2,
            temperature=0,
            extra_body={"ignore_eos": True, **scoped("ends")},
        )
        timing.update(_server_timing(revision.headers["server-timing"]))
        chunks = await old
        await c.close()
        return info["receipts_outstanding"] > 0, chunks

    timing: dict[str, float] = {}
    running, rest = asyncio.run(run())
    # a fence's terminal output leaves first among the revision's commands
    assert ("retire-fence" in timing) == running, timing
    assert 0 <= timing.get("retire-fence", 0) <= timing["retire-commands"], timing
    assert {stamp(ch) for ch in rest} == {("ends", 0)}
    # Only a machine that stalled this client for seconds lets the old version finish first.
    assert rest[-1].choices[0].finish_reason == ("superseded" if running else "length")
    if running:
        assert rest[-1].choices[0].text == ""
    assert cancel(retire_server, "ends").status_code == 200


def test_a_revision_is_decided_while_the_old_versions_step_runs(
    client: openai.OpenAI, retire_server: RetireServer
) -> None:
    """Every ``open`` also reaches the engine core's ``open`` socket (``early_opens``), whose
    thread decides it while a step runs and ends the old stream at once; its utility call then
    answers with that decision. Revisions of running streams until one is decided during a
    step (a decode step runs most of the time; the first try nearly always does): each old
    stream ends ``superseded`` with nothing of the old version after it, and every ``open``
    is decided exactly once whichever of its two copies came first. (The server of
    ``test_serving_connectors`` runs with the socket off: none of these counters moves there.)"""
    before = retire_server.leaks()["counters"]

    async def revise(trial: int) -> tuple[Any, Any]:
        scope = f"early{trial}"
        _, last, revised = await revise_mid_stream(
            retire_server, scope, prompt(40 + trial, 64), prompt(80 + trial, 64), read=3
        )
        return last, revised

    trials = 0
    while trials < 18:  # a bound only: the first try is nearly always decided during a step
        last, revised = asyncio.run(revise(trials))
        trials += 1
        scope = f"early{trials - 1}"
        assert stamp(last) == (scope, 0)
        # (a starved client can read its first chunks after the old version ran to its end)
        end = expected_end(retire_server, scope, 0)
        assert last.choices[0].finish_reason == end
        assert end == "length" or last.choices[0].text == ""
        assert stamp(revised) == (scope, 1)
        counters = retire_server.leaks()["counters"]
        if counters.get("fences_during_step", 0) > before.get("fences_during_step", 0):
            break
    for trial in range(trials):
        assert cancel(retire_server, f"early{trial}").status_code == 200
    retire_server.check_clean()  # every copy came (none is left waiting in ``utility_first``)
    after = retire_server.leaks()["counters"]

    def moved(name: str) -> int:
        return int(after.get(name, 0) - before.get(name, 0))

    assert moved("fences_during_step") >= 1, after
    opens = 2 * trials  # each scope's first version and its revision
    assert moved("early_opens") + moved("early_opens_late") == opens, after
    assert moved("supersedes") == trials and moved("submits") == trials, after
    assert moved("fences_during_step") + moved("fences_between_steps") <= moved("fences")
