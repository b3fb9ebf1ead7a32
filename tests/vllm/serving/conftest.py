"""The servers this package's tests share: one ``retire serve`` and, for comparisons, one stock
vLLM server (same model and engine settings), started as real processes on 127.0.0.1 before the
package's first test (together, their start-ups overlapping; stock's only when a selected test
compares with it) and stopped after its last. The ``client`` fixture checks after every test that
nothing is left on the server (and releases a failed test's scopes); closing ``retire_server``
validates its whole core log against the spec."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from retire_bench.servers import RetireServer, StockServer, ready_together
from retire_vllm.default_model import ensure_default_model


@pytest.fixture(scope="package")
def servers(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[tuple[RetireServer, StockServer | None]]:
    retire = RetireServer(tmp_path_factory.mktemp("retire-serve"), wait=False)
    stock = None
    if any("stock_server" in item.fixturenames for item in request.session.items):
        model = str(ensure_default_model())
        stock = StockServer(tmp_path_factory.mktemp("stock-serve"), model, wait=False)
    ready_together([retire] if stock is None else [retire, stock])
    try:
        yield retire, stock
    finally:
        if stock is not None:
            stock.stop()
        verdict = retire.close()
    assert ": valid — " in verdict, verdict


@pytest.fixture(scope="package")
def retire_server(servers: tuple[RetireServer, StockServer | None]) -> RetireServer:
    return servers[0]


@pytest.fixture(scope="package")
def stock_server(servers: tuple[RetireServer, StockServer | None]) -> StockServer:
    stock = servers[1]
    assert stock is not None  # started whenever a selected test asks for it
    return stock


@pytest.fixture
def client(retire_server: RetireServer, request: pytest.FixtureRequest) -> Iterator[openai.OpenAI]:
    c = retire_server.openai()
    yield c
    c.close()
    try:
        retire_server.check_clean()
    finally:
        retire_server.release_all()  # a failed test's scopes must not fail the next tests
