"""``retire serve --data-parallel-size 2``: two engine cores, every scope on one of them.

Each engine core runs its own authority over its own KV pool, so every version of a scope, and
every call on it, must reach the same engine: the API process routes a scope by a stable hash of
(tenant, scope) (``wire.affinity``), and calls without a scope go to both engines, their answers
merged. One scope per engine is revised twice -- once after its first version finished, once while
its stream is running: each revision inherits the certified prefix (which exists only on the
scope's engine), ends the running version's stream ``superseded``, and equals a cold unscoped run;
clients that leave at random moments leave nothing on either engine (an abandoned admission is
forgotten by the engine that admitted it); both engines' core logs validate against the spec
when the server closes.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator

import pytest

from retire_bench.servers import RetireServer
from retire_vllm.client import scoped, stamp
from retire_vllm.serving import wire
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
    srv = RetireServer(tmp_path_factory.mktemp("retire-serve-dp"), ["--data-parallel-size", "2"])
    try:
        yield srv
    finally:
        verdict = srv.close()
    assert srv.dp == 2 and verdict.count(": valid — ") == 2, verdict


def scope_on(rank: int) -> str:
    """A scope name the default tenant's requests route to engine ``rank``."""
    return next(
        name
        for name in (f"dp-scope-{i}" for i in itertools.count())
        if wire.affinity(wire.DEFAULT_TENANT, name, 2) == rank
    )


@pytest.mark.parametrize("rank", [0, 1])
def test_every_version_of_a_scope_reaches_its_engine(server: RetireServer, rank: int) -> None:
    client = server.openai()
    scope = scope_on(rank)
    before = server.leaks()["counters"]
    base = prompt(40 + rank, 200)
    first = complete(client, server.model, base, 8, **scoped(scope))
    assert stamp(first) == (scope, 0)
    assert status(server, scope).json()["dp_rank"] == rank

    revised = [*base[:170], *prompt(50 + rank, 40)]  # shares 5 full blocks with version 0
    second = complete(client, server.model, revised, 12, **scoped(scope))
    assert stamp(second) == (scope, 1)
    assert second.usage.prompt_tokens_details.cached_tokens == 5 * BLOCK
    assert second.choices[0].text == complete(client, server.model, revised, 12).choices[0].text

    third = [*revised[:140], *prompt(60 + rank, 30)]  # 4 blocks with version 1, while it runs
    first_old, last_old, new = asyncio.run(revise_mid_stream(server, scope, revised, third))
    assert stamp(first_old) == (scope, 2)
    assert last_old.choices[0].finish_reason == expected_end(server, scope, 2)
    assert stamp(new) == (scope, 3)
    assert new.choices[0].text == complete(client, server.model, third, 12).choices[0].text
    info = status(server, scope).json()
    assert info["dp_rank"] == rank and info["version"] == 3
    assert cancel(server, scope).status_code == 200
    server.check_clean()  # (a copy sent to the wrong engine would be left there: a leak)
    # each of the four opens' copies reached its engine's open socket, once
    after = server.leaks()["counters"]
    copies = ("early_opens", "early_opens_late")
    assert sum(after.get(k, 0) - before.get(k, 0) for k in copies) == 4, after


def test_clients_that_leave_at_any_moment(server: RetireServer) -> None:
    """Clients leaving at random moments (``serving_support.leave_at_random``) with two engines:
    an abandoned admission is forgotten by the engine that admitted it; nothing is left on
    either engine."""
    leave_at_random(server, 6)
    server.check_clean()
