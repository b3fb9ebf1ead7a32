"""``retire serve`` beside a KV connector of the user's, the real ``openai`` client.

The user configures vLLM's own ``ExampleConnector`` with ``--kv-transfer-config`` (it saves the
KV of the requests it is handed to files; a producer here, so it loads nothing back). Retire's
step-digest connector then runs beside it in vLLM's ``MultiConnector``
(``step_digests.with_step_digests``): the user's connector still saves the KV it is given, the
workers still digest the blocks a step fills within that step (no round trip after it), and a
revision adopts the certified prefix with output equal to a cold run. A scoped request finds no
KV of the user's connector (Retire's ``MultiConnector`` does not ask it), a request without a
scope still does. This server also runs without Retire's ``open`` socket
(``--retire-open-socket off``): its revisions are decided between steps, by their utility calls
alone. Every scope is cancelled and the server must hold nothing afterwards; closing it
validates its core log against the spec.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from retire_bench.servers import RetireServer
from retire_vllm.client import scoped, stamp
from tests.vllm.serving_support import cancel, complete, prompt, retire_metrics, status

pytestmark = pytest.mark.vllm

BLOCK = 32


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("user-connector-store")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, store: Path) -> Iterator[RetireServer]:
    theirs = {
        "kv_connector": "ExampleConnector",
        "kv_role": "kv_producer",
        "kv_connector_extra_config": {"shared_storage_path": str(store)},
    }
    srv = RetireServer(
        tmp_path_factory.mktemp("retire-serve-connector"),
        # and without the open socket: every open decided between steps, by its utility call
        ["--kv-transfer-config", json.dumps(theirs), "--retire-open-socket", "off"],
    )
    try:
        yield srv
    finally:
        verdict = srv.close()
    assert ": valid — " in verdict, verdict


def test_a_revision_beside_the_users_connector(server: RetireServer, store: Path) -> None:
    c = server.openai()
    model = server.model
    before = retire_metrics(server).get("retire_blocks_digested_in_step_total", 0.0)
    base = prompt(11, 150)
    assert stamp(complete(c, model, base, 4, **scoped("conn"))) == ("conn", 0)
    revised = [*base[:100], *prompt(12, 30)]  # 3 full blocks shared
    second = complete(c, model, revised, 8, **scoped("conn"))
    assert stamp(second) == ("conn", 1)
    assert second.usage.prompt_tokens_details.cached_tokens == 3 * BLOCK
    assert status(server, "conn").json()["adopted_blocks"] == 3
    # the full blocks of both versions were digested by the workers within their steps
    digested = retire_metrics(server)["retire_blocks_digested_in_step_total"] - before
    assert digested >= len(base) // BLOCK + (len(revised) // BLOCK - 3), digested
    # and the user's connector saved what it was handed, a file per layer and request
    assert list(store.rglob("*.safetensors")), "the user's connector saved nothing"
    # (it would load that back into any request of the same tokens, cache salt or not)
    shutil.rmtree(store)
    cold = complete(c, model, revised, 8)  # unscoped: no cache salt, nothing cached
    assert cold.usage.prompt_tokens_details.cached_tokens == 0
    assert second.choices[0].text == cold.choices[0].text
    counters = server.leaks()["counters"]
    assert counters["supersedes"] >= 1
    assert not {"early_opens", "early_opens_late", "fences_during_step"} & set(counters)
    assert cancel(server, "conn").status_code == 200
    c.close()
    server.check_clean()


def test_a_scoped_request_loads_nothing_from_the_users_connector(
    server: RetireServer, store: Path
) -> None:
    """The user's connector saved the KV of a prompt; a request of another scope and tenant
    with the same prompt gets none of it (it would be KV that no version of its scope wrote and
    Retire never certified, here another tenant's), while a request without a scope still does:
    the user's connector serves it as configured."""
    c = server.openai()
    model = server.model
    tokens = prompt(21, 130)
    first = complete(c, model, tokens, 4, **scoped("saver", "t1"))
    assert list(store.rglob("*.safetensors")), "the user's connector saved nothing"
    other = complete(c, model, tokens, 4, **scoped("reader", "t2"))
    assert other.usage.prompt_tokens_details.cached_tokens == 0
    assert other.choices[0].text == first.choices[0].text
    plain = complete(c, model, tokens, 4)
    assert plain.usage.prompt_tokens_details.cached_tokens == 4 * BLOCK  # loaded from the store
    for scope, tenant in (("saver", "t1"), ("reader", "t2")):
        assert cancel(server, scope, tenant).status_code == 200
    c.close()
    server.check_clean()
