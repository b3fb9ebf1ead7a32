"""``retire serve`` with speculative decoding: revisions while drafts are in flight.

One ``retire serve`` whose engine drafts three tokens a step with a tiny model of other weights
(almost every draft is rejected, so drafts keep crossing block boundaries and being rolled
back). A streamed version is revised after a few of its tokens were read, while the engine core
is proposing, writing and verifying drafts for it: the old stream ends ``superseded``, the
successor equals a cold (unscoped) run of its prompt and adopts exactly the common prefix's
blocks, and the server's core log -- which must show draft writes, verifications and a writer
closed over unverified drafts -- validates against the spec when the server closes. Clients
that leave at random moments (``serving_support.leave_at_random``) leave nothing behind, and so
do clients that leave just as they revise (vLLM takes their abort during the step that verifies
their drafts).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import pytest

from retire_bench.servers import RetireServer
from retire_bench.shapes import speculative_config
from retire_vllm import identity
from retire_vllm.client import scoped, stamp
from tests.vllm.serving_support import (
    cancel,
    complete,
    expected_end,
    leave_at_random,
    open_scoped_stream,
    prompt,
    revise_mid_stream,
    status,
)

pytestmark = pytest.mark.vllm

BLOCK = 32


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RetireServer]:
    spec = json.dumps(speculative_config(draft_seed=1))
    srv = RetireServer(tmp_path_factory.mktemp("retire-serve-spec"), ["--speculative-config", spec])
    try:
        yield srv
    finally:
        verdict = srv.close()
    assert ": valid — " in verdict, verdict
    assert srv.core_log is not None
    seen = {json.loads(line)["transition"] for line in srv.core_log.read_text().splitlines()}
    assert {"write_draft", "verify_drafts"} <= seen, seen


@pytest.mark.parametrize("read", [1, 6, 19])
def test_a_revision_while_drafts_are_in_flight(server: RetireServer, read: int) -> None:
    scope = f"spec-{read}"
    pred = prompt(200 + read, 150)
    succ = [*pred[:100], *prompt(300 + read, 30)]
    _, last_old, new = asyncio.run(
        revise_mid_stream(server, scope, pred, succ, read=read, new_max=24)
    )
    assert stamp(last_old) == (scope, 0)
    assert last_old.choices[0].finish_reason == expected_end(server, scope, 0)
    assert stamp(new) == (scope, 1)
    client = server.openai()
    cold = complete(client, server.model, succ, 24)  # unscoped: served as stock vLLM serves it
    assert new.choices[0].text == cold.choices[0].text
    info = status(server, scope).json()
    assert info["adopted_blocks"] == identity.expected_adopted_blocks(pred, succ, BLOCK) == 3
    assert cancel(server, scope).status_code == 200
    server.check_clean()


def test_clients_that_leave_at_any_moment(server: RetireServer) -> None:
    """Clients leaving at random moments while the engine drafts: nothing left behind."""
    leave_at_random(server, 7)
    server.check_clean()


async def _revise_and_leave(server: RetireServer, k: int) -> str:
    """A streamed version of a scope, three chunks read; its client sends a revision and closes
    the old stream at once, as an application that replaces its call does. Returns how the
    revision ended."""
    c, model = server.openai(asynchronous=True), server.model
    scope = f"leaving-{k}"
    stream = await open_scoped_stream(c, model, scope, prompt(600 + k, 100), 2000)
    read = 0
    async for _ in stream:
        read += 1
        if read == 3:
            break
    revision = asyncio.create_task(complete(c, model, prompt(700 + k, 60), 4, **scoped(scope)))
    await asyncio.sleep(0.001 * (k % 4))
    await stream.close()  # the old client leaves: vLLM aborts its request
    answer = await revision
    await c.close()
    assert stamp(answer) == (scope, 1)
    return str(answer.choices[0].finish_reason)


def test_a_client_that_leaves_as_it_revises_while_its_drafts_are_verified(
    server: RetireServer,
) -> None:
    """The revision is decided during a step (the open socket's thread) and the old client's
    abort reaches the engine core during the same step, which vLLM takes just before the
    commit that verifies the drafts: the abort closes the old request's writers and, its version
    revoked, frees its blocks. The commit then verifies nothing of it
    (``drafts_closed_during_step``). Before, it reported the drafts of a freed block verified:
    the engine core stopped (``DoubleFreeError``) at the first try here. Tries until the window
    was hit (the counter moved); every revision runs to its end and nothing is left."""
    before = server.leaks()["counters"].get("drafts_closed_during_step", 0)
    k = 0
    for k in range(12):
        assert asyncio.run(_revise_and_leave(server, k)) == "length"
        if server.leaks()["counters"].get("drafts_closed_during_step", 0) > before:
            break
    else:
        raise AssertionError("no abort came during the step that verified the old drafts")
    for i in range(k + 1):
        assert cancel(server, f"leaving-{i}").status_code == 200
    server.check_clean()
