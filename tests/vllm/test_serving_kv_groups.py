"""``retire serve`` over a model with two KV cache groups (issue 17, item 2), the real ``openai``
client.

The ``hybrid`` default model (one 64-token sliding-window layer, one full-attention layer) served
by ``retire serve`` in its own processes on 127.0.0.1: a revision of a finished version and one of
a version still streaming each adopt the cut's pages of both groups (every block before the cut
in the full-attention group, the last two in the sliding-window group), and their output equals
a cold run of the same prompt on the same server (an unscoped request under no cache salt, with
no cached token). Clients that leave at random moments (``serving_support.leave_at_random``) break
nothing. Every scope is cancelled and the server must hold nothing afterwards; closing it
validates its core log against the spec.
"""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from retire_bench.servers import ENGINE_OPTIONS, HTTP, RetireServer
from retire_vllm.client import scoped, stamp
from retire_vllm.default_model import ensure_default_model
from tests.vllm.serving_support import (
    cancel,
    complete,
    expected_end,
    leave_at_random,
    prompt,
    status,
)

pytestmark = pytest.mark.vllm

BLOCK = 32


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RetireServer]:
    options = [
        "--model",
        str(ensure_default_model(size="hybrid")),
        "--max-model-len",
        "2048",
        "--max-num-batched-tokens",
        "2048",
        "--num-gpu-blocks-override",
        "512",
        *ENGINE_OPTIONS,
    ]
    server = RetireServer(tmp_path_factory.mktemp("retire-hybrid"), options=options)
    try:
        yield server
    finally:
        verdict = server.close()
    assert ": valid — " in verdict, verdict


@pytest.fixture
def client(server: RetireServer) -> Iterator[openai.OpenAI]:
    c = server.openai()
    yield c
    c.close()
    try:
        server.check_clean()
    finally:
        server.release_all()


def _cold(c: openai.OpenAI, model: str, tokens: list[int], n: int) -> str:
    done = complete(c, model, tokens, n)
    assert done.usage.prompt_tokens_details.cached_tokens == 0  # really cold
    return str(done.choices[0].text)


def test_a_revision_of_a_finished_version_adopts_both_groups(
    client: openai.OpenAI, server: RetireServer
) -> None:
    model = server.model
    base = prompt(1, 300)
    first = complete(client, model, base, 8, **scoped("hy-fin"))
    assert stamp(first) == ("hy-fin", 0)
    revised = [*base[:200], *prompt(2, 40)]  # 6 full blocks shared
    second = complete(client, model, revised, 16, **scoped("hy-fin"))
    assert stamp(second) == ("hy-fin", 1)
    assert second.usage.prompt_tokens_details.cached_tokens == 6 * BLOCK
    info = status(server, "hy-fin").json()
    assert info["version"] == 1 and info["adopted_blocks"] == 6
    assert second.choices[0].text == _cold(client, model, revised, 16)
    counters = server.leaks()["counters"]
    assert counters["adopted_blocks"] == 6 + 2  # full attention: blocks 0-5; sliding: 4 and 5
    assert cancel(server, "hy-fin").status_code == 200


def test_a_revision_of_a_streaming_version_adopts_both_groups(
    client: openai.OpenAI, server: RetireServer
) -> None:
    model = server.model
    base = prompt(3, 260)
    before = server.leaks()["counters"].get("adopted_blocks", 0)
    stream = client.completions.create(
        model=model,
        prompt=base,
        max_tokens=1500,
        temperature=0,
        stream=True,
        extra_body={"ignore_eos": True, **scoped("hy-live")},
    )
    chunks = iter(stream)
    next(chunks)  # the version runs (its prompt's blocks are written)
    revised = [*base[:250], *prompt(4, 30)]  # 7 full blocks shared
    second = complete(client, model, revised, 12, **scoped("hy-live"))
    assert stamp(second) == ("hy-live", 1)
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert reasons[-1] == expected_end(server, "hy-live", 0)
    assert second.usage.prompt_tokens_details.cached_tokens == 7 * BLOCK
    assert status(server, "hy-live").json()["adopted_blocks"] == 7
    assert server.leaks()["counters"]["adopted_blocks"] - before == 7 + 2
    assert second.choices[0].text == _cold(client, model, revised, 12)
    stream.close()
    assert cancel(server, "hy-live").status_code == 200


def test_the_blocks_a_window_passed_go_back_while_the_version_runs(
    client: openai.OpenAI, server: RetireServer
) -> None:
    """A scoped completion of 300 prompt tokens and 100 out: once the prompt is processed, the
    64-token window has passed at least 7 of the sliding group's blocks, and the engine side
    reports each (``PageUnreferenced``, counted as ``window_blocks_passed``, on ``/metrics``
    as ``retire_window_blocks_passed_total``); nothing is left behind (the fixture)."""
    before = server.leaks()["counters"].get("window_blocks_passed", 0)
    done = complete(client, server.model, prompt(5, 300), 100, **scoped("hy-window"))
    assert stamp(done) == ("hy-window", 0) and done.usage.completion_tokens == 100
    passed = server.leaks()["counters"]["window_blocks_passed"] - before
    assert passed >= (300 - 63) // BLOCK, passed
    metrics = HTTP.get(f"{server.base}/metrics").text
    assert f"retire_window_blocks_passed_total {float(before + passed)}" in metrics
    assert cancel(server, "hy-window").status_code == 200


def test_clients_that_leave_at_any_moment(client: openai.OpenAI, server: RetireServer) -> None:
    """Clients leaving at random moments (``serving_support.leave_at_random``) on a model whose
    blocks a sliding window drops from the table: nothing left behind (the fixture)."""
    leave_at_random(server, 5, load_tokens=2000)
