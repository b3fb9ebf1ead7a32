"""The servers this package's tests share: one ``retire serve`` and, for comparisons, one stock
vLLM server (same model and engine settings), started as real processes on 127.0.0.1 when a test
first asks for them and stopped after the package's last test. The ``client`` fixture checks
after every test that nothing is left on the server (and releases a failed test's scopes);
closing ``retire_server`` validates its whole core log against the spec."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from retire_bench.servers import RetireServer, StockServer


@pytest.fixture(scope="package")
def retire_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RetireServer]:
    server = RetireServer(tmp_path_factory.mktemp("retire-serve"))
    try:
        yield server
    finally:
        verdict = server.close()
    assert ": valid — " in verdict, verdict


@pytest.fixture(scope="package")
def stock_server(
    tmp_path_factory: pytest.TempPathFactory, retire_server: RetireServer
) -> Iterator[StockServer]:
    server = StockServer(tmp_path_factory.mktemp("stock-serve"), retire_server.model)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def client(retire_server: RetireServer, request: pytest.FixtureRequest) -> Iterator[openai.OpenAI]:
    c = retire_server.openai()
    yield c
    c.close()
    try:
        retire_server.check_clean()
    finally:
        retire_server.release_all()  # a failed test's scopes must not fail the next tests
