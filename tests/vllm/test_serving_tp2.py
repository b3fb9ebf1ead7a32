"""``retire serve --tensor-parallel-size 2``: vLLM's multiprocessing executor, two worker ranks.

Every participant of a version is the request plus one participant per rank; RECLAIM frees
nothing until each rank has sent its receipt (``collective_rpc`` to every worker). The test
revises a scope over HTTP, checks the successor inherited the certified prefix and equals a cold
run on the same server, that both ranks delivered receipts for both versions, that nothing is
left, and that the core log is a behaviour of the spec.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest

from retire_bench.servers import HTTP, RetireServer
from retire_vllm.client import scoped, stamp

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def tp2_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RetireServer]:
    server = RetireServer(tmp_path_factory.mktemp("retire-tp2"), ["--tensor-parallel-size", "2"])
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
