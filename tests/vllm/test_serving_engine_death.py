"""``retire serve`` whose engine core dies while a scoped request's open call waits for it.

vLLM resolves a utility call's future only with the engine core's answer, so a call in flight
when the engine core dies waited forever, and the scoped request behind it with it: its client
saw a timeout (ten minutes in ``test_serving_speculative`` when a bug stopped the engine core)
instead of the 500 vLLM gives every other request in flight. ``RetireAsyncLLM`` now fails the
calls still waiting when its output handler ends. One server of its own (it is killed), no
core log (the engine core's last lines die with it)."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator

import openai
import psutil
import pytest

from retire_bench.servers import RetireServer
from retire_vllm.client import scoped
from tests.vllm.serving_support import complete, prompt

pytestmark = pytest.mark.vllm

#: Long enough for a hung call to show as a timeout, far longer than a failing call takes.
WAIT_S = 120.0


@pytest.fixture
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RetireServer]:
    srv = RetireServer(tmp_path_factory.mktemp("retire-serve-death"), log=False)
    try:
        yield srv
    finally:
        srv.stop()


def _engine_core(server: RetireServer) -> psutil.Process:
    (core,) = [
        p
        for p in psutil.Process(server.proc.pid).children(recursive=True)
        if "EngineCore" in p.name()
    ]
    return core


def test_a_scoped_request_waiting_when_the_engine_core_dies_gets_a_500(
    server: RetireServer,
) -> None:
    """The open call waits behind another request's long prefill (the step in flight) when the
    engine core is killed: the scoped request ends with a 5xx, as vLLM's own requests in flight
    do, instead of waiting for an answer that never comes."""
    model, core = server.model, _engine_core(server)

    async def run() -> list[BaseException | object]:
        c = openai.AsyncOpenAI(
            base_url=f"{server.base}/v1", api_key="none", max_retries=0, timeout=WAIT_S
        )
        busy = asyncio.create_task(complete(c, model, prompt(1, 3000), 1))
        await asyncio.sleep(0.01)
        scoped_request = asyncio.create_task(
            complete(c, model, prompt(2, 64), 4, **scoped("dying"))
        )
        await asyncio.sleep(0.03)
        os.kill(core.pid, signal.SIGKILL)
        ends = await asyncio.gather(busy, scoped_request, return_exceptions=True)
        await c.close()
        return ends

    busy, scoped_end = asyncio.run(run())
    assert isinstance(busy, openai.InternalServerError), busy  # vLLM's own answer
    assert isinstance(scoped_end, openai.InternalServerError), scoped_end
