"""A thin client helper over the ``openai`` package for ``retire serve``.

Chunks already on the wire when the server accepts a revision can still sit in a client's socket
or in an application's reader queue. ``ScopeReader`` applies the publication rule where the
application reads: every chunk of a scoped response carries ``"retire": {"scope", "version",
"incarnation"}`` and every scoped response the headers ``x-retire-version`` and
``x-retire-incarnation``; once the reader has seen version ``v`` of a scope accepted, a chunk of an
older version of that scope is dropped. The incarnation (when the scope id was opened) orders
before the version: a scope forgotten by the server (``docs/serving.md``, expiry) or a restarted
server opens the same id again at version 0, and a long-lived reader must not take that for an
old version. ``scoped`` builds the
``extra_body`` that puts a request under a scope. ``each_chunk`` iterates a streamed response, and
``read_stream`` reads it to its end, without holding up the other requests of the same event loop
(a revision sent beside the old stream). Nothing here talks to the server by itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, AsyncIterator
from typing import Any, TypeVar

from .serving.wire import HEADER_INCARNATION, HEADER_VERSION

_T = TypeVar("_T")


def scoped(scope: str, tenant: str | None = None, **extra: Any) -> dict[str, Any]:
    """``extra_body`` for ``client.completions.create`` / ``client.chat.completions.create``."""
    xargs: dict[str, Any] = {"retire_scope": scope}
    if tenant is not None:
        xargs["retire_tenant"] = tenant
    return {**extra, "vllm_xargs": {**extra.get("vllm_xargs", {}), **xargs}}


async def each_chunk(stream: AsyncIterable[_T]) -> AsyncIterator[_T]:
    """The chunks of ``stream``, yielding to the event loop after each. Chunks already buffered
    are read without suspending, so a long stream read in one plain ``async for`` would hold up
    every other request of that loop: a revision sent beside it is then sent only once the old
    stream has been read to its end (and the old version may run to its end first)."""
    async for chunk in stream:
        yield chunk
        await asyncio.sleep(0)


async def read_stream(stream: AsyncIterable[_T]) -> list[_T]:
    """Every chunk of ``stream`` (through ``each_chunk``)."""
    return [chunk async for chunk in each_chunk(stream)]


def _mark(obj: Any) -> dict[str, Any] | None:
    """The ``"retire"`` mark of a chunk or response, or None for an unscoped one."""
    extra = getattr(obj, "model_extra", None) or {}
    mark = extra.get("retire") if isinstance(extra, dict) else None
    return mark if isinstance(mark, dict) else None


def stamp(obj: Any) -> tuple[str, int] | None:
    """The ``(scope, version)`` a chunk or response carries, or None for an unscoped one."""
    mark = _mark(obj)
    return None if mark is None else (str(mark["scope"]), int(mark["version"]))


def incarnation(obj: Any) -> int:
    """When the scope of a stamped chunk or response was opened (0 where not stamped)."""
    mark = _mark(obj)
    return 0 if mark is None else int(mark.get("incarnation", 0))


class ScopeReader:
    """The newest accepted (incarnation, version) of each scope, and the rule that drops the
    chunks of older ones."""

    def __init__(self) -> None:
        self.current: dict[str, tuple[int, int]] = {}
        self.dropped = 0

    def accepted(self, scope: str, version: int, incarnation: int = 0) -> None:
        """A revision of ``scope`` was accepted as ``version`` (e.g. from ``x-retire-version``)
        of the scope opened at ``incarnation`` (``x-retire-incarnation``)."""
        if (incarnation, version) > self.current.get(scope, (-1, -1)):
            self.current[scope] = (incarnation, version)

    def accept_response(self, scope: str, response: Any) -> int:
        """Record the version of a scoped streaming response (openai ``Stream`` or httpx
        response): the server sends its headers only once the version is admitted."""
        raw = getattr(response, "response", response)
        version = int(raw.headers[HEADER_VERSION])
        self.accepted(scope, version, int(raw.headers.get(HEADER_INCARNATION, 0)))
        return version

    def admit(self, chunk: Any) -> bool:
        """Should the application see this chunk?"""
        mark = stamp(chunk)
        if mark is None:
            return True
        scope, version = mark
        key = (incarnation(chunk), version)
        if key < self.current.get(scope, (-1, -1)):
            self.dropped += 1
            return False
        self.current[scope] = key
        return True
