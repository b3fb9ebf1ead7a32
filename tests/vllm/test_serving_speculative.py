"""``retire serve`` with speculative decoding: revisions while drafts are in flight.

One ``retire serve`` whose engine drafts three tokens a step with a tiny model of other weights
(almost every draft is rejected, so drafts keep crossing block boundaries and being rolled
back). A streamed version is revised after a few of its tokens were read, while the engine core
is proposing, writing and verifying drafts for it: the old stream ends ``superseded``, the
successor equals a cold (unscoped) run of its prompt and adopts exactly the common prefix's
blocks, and the server's core log -- which must show draft writes, verifications and a writer
closed over unverified drafts -- validates against the spec when the server closes. Clients
that leave at random moments (``serving_support.leave_at_random``) leave nothing behind.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import pytest

from retire_bench.servers import RetireServer
from retire_bench.shapes import speculative_config
from retire_vllm import identity
from retire_vllm.client import stamp
from tests.vllm.serving_support import (
    cancel,
    complete,
    expected_end,
    leave_at_random,
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
