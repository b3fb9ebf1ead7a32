"""``retire serve --tensor-parallel-size 2``: vLLM's multiprocessing executor, two worker ranks.

Every participant of a version is the request plus one participant per rank; RECLAIM frees
nothing until each rank has sent its receipt (``collective_rpc`` to every worker). The test
revises a scope over HTTP, checks the successor inherited the certified prefix and equals a cold
run on the same server, that both ranks delivered receipts for both versions, that nothing is
left, and that the core log is a behaviour of the spec. On a pool too small for two streams at
once, vLLM's preemption inside the engine core closes the preempted request and both its ranks
(their receipts) before the pages go, and the request runs again to the text its prompt gives
alone.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest

from retire_bench.servers import HTTP, RetireServer, pool_options
from retire_vllm.client import scoped, stamp
from tests.vllm.serving_support import texts_alone, texts_streamed_at_once

pytestmark = pytest.mark.vllm

BLOCKS = 20  # the pool, block 0 included: 19 usable blocks of 32 tokens
PROMPT = 150  # tokens: 5 blocks a stream at first,
OUTPUT = 400  # 18 at the end: one stream alone fits, two running together outgrow the pool


@pytest.fixture(scope="module")
def tp2_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RetireServer]:
    server = RetireServer(
        tmp_path_factory.mktemp("retire-tp2"),
        ["--tensor-parallel-size", "2"],
        options=pool_options(BLOCKS),
    )
    try:
        yield server
    finally:
        verdict = server.close()
    assert ": valid — " in verdict, verdict


def test_a_revision_under_tp2_waits_for_receipts_from_both_ranks(tp2_server: RetireServer) -> None:
    c = tp2_server.openai()
    rng = random.Random(7)
    base = [rng.randrange(10, 2000) for _ in range(140)]
    revised = [*base[:130], 11, 12, 13]

    def run(tokens: list[int], body: dict[str, object]) -> object:
        return c.completions.create(
            model=tp2_server.model,
            prompt=tokens,
            max_tokens=8,
            temperature=0,
            extra_body={"ignore_eos": True, **body},
        )

    run(base, scoped("tp2"))
    second = run(revised, scoped("tp2"))
    cold = run(revised, {})
    assert stamp(second) == ("tp2", 1)
    assert second.choices[0].text == cold.choices[0].text  # type: ignore[attr-defined]
    assert second.usage.prompt_tokens_details.cached_tokens == 4 * 32  # type: ignore[attr-defined]
    HTTP.post(f"{tp2_server.base}/v1/scopes/tp2/cancel").raise_for_status()
    counters = tp2_server.leaks()["counters"]
    assert counters["rank_receipts"] >= 4  # two ranks, each version's request
    tp2_server.check_clean()
    c.close()


def test_a_preempted_stream_under_tp2_closes_both_ranks_and_runs_again(
    tp2_server: RetireServer,
) -> None:
    rng = random.Random(5)
    prompts = [[rng.randrange(10, 2000) for _ in range(PROMPT)] for _ in range(2)]
    before = tp2_server.leaks()["counters"]
    texts = texts_streamed_at_once(tp2_server, prompts, OUTPUT, "tp2-pressure-")
    after = tp2_server.leaks()
    preempted = after["counters"].get("preemptions", 0) - before.get("preemptions", 0)
    assert preempted > 0, "the pool never ran out"
    # each run of each request closed on both ranks: the two first runs and every run again
    rank_receipts = after["counters"]["rank_receipts"] - before["rank_receipts"]
    assert rank_receipts == 2 * (2 + preempted)
    assert after["ledger_blocks"] == []  # both finished and gave their pages back
    assert texts == texts_alone(tp2_server, prompts, OUTPUT)
    tp2_server.release_all()
    tp2_server.check_clean()
