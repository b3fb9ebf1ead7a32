"""What each HTTP client does when its plan changes: the native behaviours users have, and Retire.

Each arm is a small policy object over the real ``openai`` async client against a real server
process (stock vLLM's OpenAI server, or ``retire serve``). The application around it is the same
for every arm and is modelled by :class:`App`: one *inbox* per scope (the event queue an agent UI
reads), filled by one reader task per HTTP stream, and drained by the scope's slow consumer (see
``http_replay.py``). An arm only decides three things -- what a revision does to the old stream,
when the new request is sent, and which chunks the application lets through:

* :class:`HttpAbort` -- close the old stream (the server sees the disconnect and vLLM aborts the
  request), then send the new one. Chunks the reader already put into the inbox stay there and
  reach the consumer.
* :class:`LetRun` -- the old call runs to its end; the revision is queued behind it (one request
  at a time per scope, in order, as LangGraph's ``enqueue`` and serialising proxies do). The
  application reads every call's output.
* :class:`StopReading` -- the application stops reading the old stream without closing it (its
  queued chunks are dropped with it, later ones go nowhere) and sends the new request at once;
  the server runs the old one to its end.
* :class:`RetireScoped` -- every request names the scope (``retire_vllm.client.scoped``); a
  revision is just the next request on the scope. The server fences the old version; the
  application reads every chunk through ``retire_vllm.client.ScopeReader``, which drops chunks of
  versions older than the newest accepted one. The server numbers a scope's versions in arrival
  order, so the client sends a scope's requests one at a time, each once the previous one was
  accepted (its headers arrived); a revision replaced by a newer one while it waited for its
  turn is never sent (the harness still counts it as a version of the trace, with no output).

Chunks carry their token ids (``return_token_ids``), so the harness checks what the consumer read
against a clean reference. The arms never apply a protocol rule themselves: Retire's rule lives
in the server and in ``ScopeReader``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, ClassVar

import attrs
import openai

from retire_vllm.client import ScopeReader, each_chunk, scoped

Prompt = Sequence[int]
Sending = Coroutine[Any, Any, None]


@attrs.define
class Chunk:
    """One streamed chunk as the reader task received it (harness clock)."""

    scope: str
    version: int
    token_ids: tuple[int, ...]
    finish_reason: str | None
    received_at: float
    raw: Any = None


@attrs.define
class Stream:
    """One HTTP request of one version, and its reader task."""

    scope: str
    version: int
    asked_at: float  # the application asked for this version
    sent_at: float | None = None  # the request left the client
    accepted_at: float | None = None  # the response headers arrived
    first_token_at: float | None = None  # the first chunk with a token arrived
    ended_at: float | None = None  # the reader saw the stream end (or the client closed it)
    delivering: bool = True  # False: the application no longer reads it (chunks go nowhere)
    close_requested: bool = False  # the application closed it before its headers arrived
    tokens_received: int = 0
    tokens_after_retire: int = 0
    retired_at: float | None = None
    finish_reason: str | None = None
    error: str | None = None  # what broke the stream, unless the application closed it
    handle: Any = None
    task: asyncio.Task[None] | None = None


class App:
    """The application shared by every arm: per-scope inboxes fed by one reader per stream."""

    def __init__(
        self,
        client: openai.AsyncOpenAI,
        model: str,
        clock: Callable[[], float] = time.perf_counter,
        *,
        cache_salt: str | None = None,
        prefix: str = "",
    ) -> None:
        self.client = client
        self.model = model
        self.clock = clock
        self.cache_salt = cache_salt
        self.prefix = prefix  # scope names on the wire: unique per run on a long-lived server
        self.inbox: dict[str, list[Chunk]] = {}
        self.ready: dict[str, asyncio.Event] = {}
        self.streams: dict[tuple[str, int], Stream] = {}
        self.problems: list[str] = []

    def wire(self, scope: str) -> str:
        return f"{self.prefix}{scope}"

    def open_scope(self, scope: str) -> None:
        self.inbox.setdefault(scope, [])
        self.ready.setdefault(scope, asyncio.Event())

    def take(self, scope: str) -> list[Chunk]:
        """What the scope's consumer reads now: everything in its inbox."""
        got, self.inbox[scope] = self.inbox[scope], []
        self.ready[scope].clear()
        return got

    def discard(self, stream: Stream) -> None:
        """The application stops reading ``stream``: it drops its queued chunks, and the reader
        puts no more of them in the inbox."""
        stream.delivering = False
        box = self.inbox[stream.scope]
        box[:] = [c for c in box if c.version != stream.version]

    async def send(
        self, stream: Stream, prompt: Sequence[int], max_tokens: int, body: dict[str, Any]
    ) -> None:
        """Send ``stream``'s request and start its reader task (returns once headers arrived)."""
        extra: dict[str, Any] = {"ignore_eos": True, "return_token_ids": True, **body}
        if self.cache_salt is not None and "vllm_xargs" not in body:
            extra["cache_salt"] = self.cache_salt
        stream.sent_at = self.clock()
        stream.handle = await self.client.completions.create(
            model=self.model,
            prompt=list(prompt),
            max_tokens=max_tokens,
            temperature=0,
            stream=True,
            extra_body=extra,
        )
        stream.accepted_at = self.clock()
        if stream.close_requested:  # closed by the application while the request was in flight
            await self.close_stream(stream)
            return
        stream.task = asyncio.create_task(self._read(stream))

    async def _read(self, stream: Stream) -> None:
        try:
            async for raw in each_chunk(stream.handle):
                if not raw.choices:
                    continue
                choice = raw.choices[0]
                ids = tuple(int(t) for t in (choice.model_extra or {}).get("token_ids") or ())
                now = self.clock()
                if ids and stream.first_token_at is None:
                    stream.first_token_at = now
                stream.tokens_received += len(ids)
                if stream.retired_at is not None:
                    stream.tokens_after_retire += len(ids)
                if choice.finish_reason is not None:
                    stream.finish_reason = str(choice.finish_reason)
                if stream.delivering:
                    chunk = Chunk(stream.scope, stream.version, ids, choice.finish_reason, now, raw)
                    self.inbox[stream.scope].append(chunk)
                    self.ready[stream.scope].set()
        except (openai.APIError, Exception) as err:  # closed under the reader (http_abort)
            if not stream.close_requested:
                stream.error = f"{type(err).__name__}: {err}"
        finally:
            if stream.ended_at is None:
                stream.ended_at = self.clock()

    async def close_stream(self, stream: Stream) -> None:
        """Close the HTTP response (the server sees a disconnect); a request still waiting for
        its headers is closed as soon as they arrive."""
        stream.close_requested = True
        if stream.handle is None:
            return
        with contextlib.suppress(Exception):
            await stream.handle.close()
        if stream.ended_at is None:
            stream.ended_at = self.clock()

    async def drain(self, timeout_s: float) -> None:
        """Wait for every reader task to end (or cancel what is left after ``timeout_s``)."""
        tasks = [s.task for s in self.streams.values() if s.task is not None]
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=timeout_s)
        for t in pending:
            t.cancel()
        for s in self.streams.values():
            if s.task in pending:
                self.problems.append(f"{s.scope}@{s.version}: stream still open at the end")
                await self.close_stream(s)


class Arm:
    """Base of the HTTP arms: what ``submit`` / ``revise`` / ``cancel`` do, and ``admit``."""

    name: ClassVar[str] = "arm"
    server: ClassVar[str] = "stock"  # which server process it talks to: "stock" or "retire"
    #: send a scope's requests one after another, each once the previous one's headers arrived
    #: (needed where the server numbers a scope's versions in arrival order); otherwise each
    #: request is sent the moment the application asks for it
    ordered: ClassVar[bool] = False

    def __init__(self, app: App) -> None:
        self.app = app
        self.current: dict[str, Stream] = {}
        self._order: dict[str, asyncio.Lock] = {}

    def _new(self, scope: str, version: int) -> Stream:
        s = Stream(scope, version, self.app.clock())
        self.app.streams[(scope, version)] = s
        return s

    def _lock(self, scope: str) -> contextlib.AbstractAsyncContextManager[Any]:
        if not self.ordered:
            return contextlib.nullcontext()
        return self._order.setdefault(scope, asyncio.Lock())

    def body(self, scope: str) -> dict[str, Any]:
        return {}

    # ``submit`` and ``revise`` do the application's bookkeeping at once, when called (the new
    # stream is the scope's current one from that moment: a revision may follow before the
    # request went out), and return the coroutine that talks to the server.
    def submit(self, scope: str, version: int, prompt: Prompt, max_tokens: int) -> Sending:
        return self._send(self._open(scope, version), prompt, max_tokens)

    def revise(self, scope: str, version: int, prompt: Prompt, max_tokens: int) -> Sending:
        raise NotImplementedError

    def _open(self, scope: str, version: int) -> Stream:
        self.app.open_scope(scope)
        stream = self._new(scope, version)
        self.current[scope] = stream
        return stream

    async def _send(self, stream: Stream, prompt: Prompt, max_tokens: int) -> None:
        async with self._lock(stream.scope):
            await self.app.send(stream, prompt, max_tokens, self.body(stream.scope))

    def retiring(self, scope: str) -> Stream:
        """The application's immediate reaction when it decides that the scope's current version
        is obsolete: runs synchronously at that moment (the harness calls it before it lets
        anything else run, ``revise`` and ``cancel`` call it too); idempotent."""
        old = self.current[scope]
        if old.retired_at is None:
            old.retired_at = self.app.clock()
            self.on_retired(old)
        return old

    def on_retired(self, old: Stream) -> None:
        """What the arm does to the old stream the moment it is obsolete (default: nothing)."""

    async def cancel(self, scope: str) -> None:
        old = self.retiring(scope)
        self.app.discard(old)
        await self.app.close_stream(old)

    def admit(self, chunk: Chunk) -> bool:
        """Does the application show this chunk? (Every native arm: yes.)"""
        return True

    async def finish(self) -> None:
        """End of the run: nothing left to send."""


class HttpAbort(Arm):
    """Close the old stream (vLLM aborts on disconnect), send the revision at once."""

    name = "http_abort"

    def revise(self, scope: str, version: int, prompt: Prompt, max_tokens: int) -> Sending:
        old = self.retiring(scope)
        return self._replace(old, self._open(scope, version), prompt, max_tokens)

    async def _replace(self, old: Stream, stream: Stream, prompt: Prompt, max_tokens: int) -> None:
        await self.app.close_stream(old)  # what is already in the inbox stays there
        await self.app.send(stream, prompt, max_tokens, self.body(stream.scope))


class StopReading(Arm):
    """Stop reading the old stream without closing it; send the revision at once."""

    name = "stop_reading"

    def on_retired(self, old: Stream) -> None:
        self.app.discard(old)  # its reader keeps the socket drained; its chunks go nowhere

    def revise(self, scope: str, version: int, prompt: Prompt, max_tokens: int) -> Sending:
        self.retiring(scope)
        return self._send(self._open(scope, version), prompt, max_tokens)


class LetRun(Arm):
    """Let the old call run to its end; the revision waits for it (queued, in order)."""

    name = "let_run"

    def submit(self, scope: str, version: int, prompt: Prompt, max_tokens: int) -> Sending:
        return self.revise(scope, version, prompt, max_tokens)

    def revise(self, scope: str, version: int, prompt: Prompt, max_tokens: int) -> Sending:
        if scope in self.current:
            self.retiring(scope)  # obsolete now; it still runs and is still read
        return self._run_in_turn(self._open(scope, version), prompt, max_tokens)

    async def _run_in_turn(self, stream: Stream, prompt: Prompt, max_tokens: int) -> None:
        lock = self._order.setdefault(stream.scope, asyncio.Lock())
        async with lock:  # one call at a time per scope, in the order asked
            await self.app.send(stream, prompt, max_tokens, self.body(stream.scope))
            assert stream.task is not None
            await asyncio.shield(stream.task)


class RetireScoped(Arm):
    """Every request on the scope; a revision is the next request; read through ScopeReader."""

    name = "retire"
    server = "retire"
    ordered = True

    def __init__(self, app: App) -> None:
        super().__init__(app)
        self.reader = ScopeReader()
        self._wire_version: dict[str, int] = {}  # the server's numbering of the sent versions

    def body(self, scope: str) -> dict[str, Any]:
        return scoped(self.app.wire(scope))

    def on_retired(self, old: Stream) -> None:
        if old.sent_at is None:  # never sent: nothing of it exists on the server
            old.ended_at = old.retired_at

    def revise(self, scope: str, version: int, prompt: Prompt, max_tokens: int) -> Sending:
        self.retiring(scope)
        return self._send(self._open(scope, version), prompt, max_tokens)

    async def _send(self, stream: Stream, prompt: Prompt, max_tokens: int) -> None:
        """Send once the scope's previous request was accepted (its headers arrived: the server
        numbers a scope's versions in arrival order); a revision that a newer one replaced
        while it waited is not sent at all (the newer one is)."""
        async with self._lock(stream.scope):
            if self.current[stream.scope] is not stream:
                return
            await self.app.send(stream, prompt, max_tokens, self.body(stream.scope))
            version = self.reader.accept_response(self.app.wire(stream.scope), stream.handle)
            last = self._wire_version.get(stream.scope, -1)
            if version <= last:
                self.app.problems.append(f"{stream.scope}: version {version} after {last}")
            self._wire_version[stream.scope] = version

    async def cancel(self, scope: str) -> None:
        import httpx

        self.retiring(scope)
        base = str(self.app.client.base_url).rstrip("/")
        async with httpx.AsyncClient() as h:
            (await h.post(f"{base}/scopes/{self.app.wire(scope)}/cancel")).raise_for_status()

    async def finish(self) -> None:
        """Cancel every scope of the run (a finished version keeps its blocks until then)."""
        for scope in list(self.current):
            if self.current[scope].retired_at is None:
                await self.cancel(scope)

    def admit(self, chunk: Chunk) -> bool:
        return self.reader.admit(chunk.raw)


#: The HTTP arms by name, in the order a replay runs them.
HTTP_ARMS: dict[str, type[Arm]] = {
    a.name: a for a in (HttpAbort, LetRun, StopReading, RetireScoped)
}
