"""``retire_vllm.client.each_chunk`` and ``read_stream``, without a server.

A stream whose chunks are already buffered is read without the reader ever suspending; read
with a plain ``async for``, it holds up every other task of the event loop until its end (a
revision sent beside an old stream then leaves only after the old stream was read, which made a
serving test flaky). Both must let the other task run while they read.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from retire_vllm.client import each_chunk, read_stream


async def _buffered(n: int, log: list[str]) -> AsyncIterator[int]:
    for i in range(n):
        log.append("chunk")
        yield i  # never suspends: every chunk is already there


async def _other(log: list[str]) -> None:
    log.append("other")


async def _race(how: str) -> list[str]:
    log: list[str] = []
    other = asyncio.ensure_future(_other(log))
    if how == "read_stream":
        chunks = await read_stream(_buffered(100, log))
    elif how == "each_chunk":
        chunks = [c async for c in each_chunk(_buffered(100, log))]
    else:
        chunks = [c async for c in _buffered(100, log)]
    await other
    assert chunks == list(range(100))
    return log


def test_readers_let_other_tasks_run_while_they_read() -> None:
    assert asyncio.run(_race("plain")).index("other") == 100  # the plain loop starves it
    assert asyncio.run(_race("read_stream")).index("other") <= 2
    assert asyncio.run(_race("each_chunk")).index("other") <= 2
