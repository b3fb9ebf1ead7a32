"""``retire serve`` with a small KV pool: many scopes in turn, each version running to its end.

A server whose pool holds 32 blocks (31 usable) serves 200 scopes one after the other, each with
a two-block prompt: 400 blocks in all, more than twelve times the pool. Only because each
finished version gives its blocks back to vLLM's prefix cache (no reference held) do they all
run; vLLM evicts the oldest cached blocks to make room and reports each eviction to the core.
Its own server keeps the core log short enough to validate at the end like every server test's.
The same pool is too small for five long streams at once: vLLM preempts some of them, and each
preemption must free the preempted version's pages at once (``VersionPreempted``), or nothing
can run any more.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest

from retire_bench.servers import HTTP, RetireServer, pool_options
from retire_vllm.client import scoped, stamp
from tests.vllm.serving_support import texts_alone, texts_streamed_at_once

pytestmark = pytest.mark.vllm

BLOCKS = 32  # the pool, block 0 included (vLLM keeps it as the null block)
BLOCK = 32  # tokens per block
TURNS = 200


@pytest.fixture(scope="module")
def small_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RetireServer]:
    options = pool_options(BLOCKS)
    server = RetireServer(tmp_path_factory.mktemp("retire-turns"), options=options)
    try:
        yield server
    finally:
        verdict = server.close()
    assert ": valid — " in verdict, verdict


def test_200_scopes_in_turn_do_not_fill_the_pool(small_server: RetireServer) -> None:
    c = small_server.openai()
    rng = random.Random(11)
    for i in range(TURNS):
        tokens = [rng.randrange(10, 2000) for _ in range(2 * BLOCK)]
        done = c.completions.create(
            model=small_server.model,
            prompt=tokens,
            max_tokens=1,
            temperature=0,
            extra_body={"ignore_eos": True, **scoped(f"turn-{i}")},
        )
        assert stamp(done) == (f"turn-{i}", 0)
    leaks = small_server.leaks()
    assert leaks["ledger_blocks"] == [] and leaks["ledger_pins"] == []  # no reference held
    assert leaks["free_blocks"] == leaks["initial_free_blocks"]
    assert len(leaks["live_scopes"]) == TURNS  # finished, still revisable (until they expire)
    # each version gave back the blocks a revision could inherit: its context's (vLLM never hits
    # a prompt's last token: 1 of the 2) and the last prompt block, past the context, which it
    # named when its writer closed (a next turn continuing the prompt inherits it); vLLM evicted
    # the oldest ones to make room
    last = HTTP.get(small_server.scope_url(f"turn-{TURNS - 1}")).json()
    assert last["state"] == "finished" and len(last["cached_pages"]) == 2
    assert leaks["counters"]["cached_blocks_evicted"] >= TURNS - (BLOCKS - 1)
    small_server.release_all()  # cancels them all: what is still cached is freed
    small_server.check_clean()
    c.close()


PRESSURE_STREAMS = 5
# 5 blocks a stream at first, 30 at the end: one stream alone fits the 31 usable blocks, any two
# running together outgrow them (long enough to overlap however the five arrive)
PRESSURE_PROMPT = 150
PRESSURE_OUTPUT = 800


def test_preempted_streams_run_again_and_finish_with_the_greedy_text(
    small_server: RetireServer,
) -> None:
    """Five scoped streams that outgrow the pool together: vLLM preempts some (the counter says
    it did), each preempted version's pages are freed at once and its request computes them
    again under new participants, and every stream ends with all its tokens, the text the same
    prompt gives alone (unscoped, one at a time, no pressure). The core log, with its
    ``preempt`` transitions and the new participants' launches, is validated at the end."""
    rng = random.Random(5)
    prompts = [
        [rng.randrange(10, 2000) for _ in range(PRESSURE_PROMPT)] for _ in range(PRESSURE_STREAMS)
    ]
    before = small_server.leaks()["counters"].get("preemptions", 0)
    texts = texts_streamed_at_once(small_server, prompts, PRESSURE_OUTPUT, "pressure-")
    leaks = small_server.leaks()
    assert leaks["counters"].get("preemptions", 0) > before, "the pool never ran out"
    assert leaks["ledger_blocks"] == []  # every version finished and gave its pages back
    assert texts == texts_alone(small_server, prompts, PRESSURE_OUTPUT)
    small_server.release_all()
    small_server.check_clean()
