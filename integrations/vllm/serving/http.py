"""``RetireMiddleware``: scopes on vLLM's standard endpoints, and the scope routes.

Installed through vLLM's own ``--middleware`` option (an ASGI class), so the server application
stays vLLM's. For ``/v1/completions`` and ``/v1/chat/completions`` it reads the scope headers into
the request's ``RequestContext`` (``front_end`` reads them when ``vllm_xargs`` names no scope),
stamps every JSON object of a scoped response with ``"retire": {"scope", "version"}`` (each SSE
chunk and the non-streaming body) and its headers with ``x-retire-version`` and a
``Server-Timing`` of its opening (``wire.server_timing``), and turns a refused
scope request into an HTTP 4xx in OpenAI's error format instead of vLLM's in-stream error event.
It answers the scope routes: ``GET /v1/scopes/{scope}`` and
``POST /v1/scopes/{scope}/cancel|pause|resume``, ``GET /v1/retire/leaks`` and
``POST /v1/retire/expire``; it appends Retire's metrics to vLLM's ``/metrics``. Requests without
a scope pass through unchanged.
"""

from __future__ import annotations

import json
import time
from typing import Any
from urllib.parse import unquote

from . import wire
from .front_end import CONTEXT, RequestContext
from .metrics import render
from .records import ApiAccount

GENERATION_PATHS = frozenset({"/v1/completions", "/v1/chat/completions"})
SCOPE_PREFIX = "/v1/scopes/"
#: What Retire and vLLM still hold (tests end with it: nothing may be left).
LEAKS_PATH = "/v1/retire/leaks"
#: Cancel the scopes idle for longer than ``{"idle_seconds": N}`` now (an operator's call).
EXPIRE_PATH = "/v1/retire/expire"
SCOPE_ACTIONS = {"cancel": "cancel", "pause": "pause", "resume": "unpause"}

Send = Any
Receive = Any


class RetireMiddleware:
    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        if path.startswith(SCOPE_PREFIX):
            await self._scope_route(scope, send)
            return
        if path == LEAKS_PATH and scope["method"] == "GET":
            engine = scope["app"].state.engine_client
            answer = await engine.retire("leaks")
            answer["api_sizes"] = engine.retire_sizes()
            await _send_json(send, 200, answer)
            return
        if path == EXPIRE_PATH and scope["method"] == "POST":
            await self._expire(scope, receive, send)
            return
        if path == "/metrics" and scope["method"] == "GET":
            await self._metrics(scope, receive, send)
            return
        if path not in GENERATION_PATHS:
            await self.app(scope, receive, send)
            return
        headers = _headers(scope)
        ctx = RequestContext(headers.get(wire.HEADER_SCOPE), headers.get(wire.HEADER_TENANT))
        token = CONTEXT.set(ctx)
        try:
            account = scope["app"].state.engine_client.retire_account
            await self.app(scope, receive, _StampingSend(ctx, send, path, account))
        finally:
            CONTEXT.reset(token)

    async def _metrics(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        """vLLM's own metrics, uncompressed, followed by Retire's."""
        plain = {**scope, "headers": [h for h in scope["headers"] if h[0] != b"accept-encoding"]}
        parts: list[dict[str, Any]] = []

        async def capture(message: dict[str, Any]) -> None:
            parts.append(message)

        await self.app(plain, receive, capture)
        start = next(m for m in parts if m["type"] == "http.response.start")
        body = b"".join(m.get("body", b"") for m in parts if m["type"] == "http.response.body")
        engine = scope["app"].state.engine_client
        body += render(await engine.retire("metrics"), engine.retire_account.as_dict())
        await send({**start, "headers": _with_length(start["headers"], len(body))})
        await send({"type": "http.response.body", "body": body})

    async def _expire(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        try:
            idle = json.loads(b"".join(chunks) or b"{}").get("idle_seconds")
            if isinstance(idle, bool) or not isinstance(idle, int | float) or idle < 0:
                raise ValueError("idle_seconds must be a non-negative number")
        except (ValueError, AttributeError) as err:
            await _send_json(send, 400, _error(str(err), "BadRequestError", "invalid_request"))
            return
        answer = await scope["app"].state.engine_client.retire("expire", idle_seconds=idle)
        swept = {"expired": answer["expired"], "forgotten": answer["forgotten"]}
        await _send_json(send, 200, swept)

    async def _scope_route(self, scope: dict[str, Any], send: Send) -> None:
        # Split the raw path, then decode each segment: a scope id may hold "/" (sent as %2F).
        raw = scope.get("raw_path") or scope["path"].encode()
        raw = raw.split(b"?", 1)[0].decode("latin-1")
        parts = [unquote(p) for p in raw[len(SCOPE_PREFIX) :].split("/")]
        method = scope["method"]
        tenant = _headers(scope).get(wire.HEADER_TENANT) or wire.DEFAULT_TENANT
        if len(parts) == 1 and method == "GET":
            op = "status"
        elif len(parts) == 2 and parts[1] in SCOPE_ACTIONS and method == "POST":
            op = SCOPE_ACTIONS[parts[1]]
        else:
            await _send_json(send, 404, _error("not found", "NotFound", "route_not_found"))
            return
        engine = scope["app"].state.engine_client
        try:
            answer = await engine.retire(op, scope=parts[0], tenant=tenant)
        except wire.ScopeRequestError as err:
            await _send_json(send, err.status, err.body())
            return
        answer = {k: v for k, v in answer.items() if k not in ("ok", "fenced")}
        await _send_json(send, 200, answer)


class _StampingSend:
    """Holds the response start until the first body message: by then the request's scope is
    known (stamp, or answer the refusal with its own status)."""

    def __init__(self, ctx: RequestContext, send: Send, path: str, account: ApiAccount) -> None:
        self.ctx = ctx
        self.account = account
        self.path = path
        self.finished = False
        self.send = send
        self.start: dict[str, Any] | None = None
        self.replaced = False
        self.stamp = b""

    async def __call__(self, message: dict[str, Any]) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            self.start = message
            return
        if kind != "http.response.body":
            await self.send(message)
            return
        if self.replaced:
            return
        body: bytes = message.get("body", b"")
        if self.start is not None:
            start, self.start = self.start, None
            ctx = self.ctx
            if ctx.error is not None:
                self.replaced = True
                await _send_json(self.send, ctx.error.status, ctx.error.body())
                return
            if ctx.version is not None:
                mark = {"scope": ctx.opened_scope, "version": ctx.version}
                if ctx.incarnation is not None:
                    mark["incarnation"] = ctx.incarnation
                self.stamp = b'{"retire":' + json.dumps(mark).encode() + b","
                body = self._stamped(body)
                headers = [
                    *start["headers"],
                    (wire.HEADER_VERSION.encode(), str(ctx.version).encode()),
                    (wire.HEADER_INCARNATION.encode(), str(ctx.incarnation or 0).encode()),
                    (b"server-timing", wire.server_timing(ctx.moments).encode()),
                ]
                if not message.get("more_body", False):
                    headers = _with_length(headers, len(body))
                start = {**start, "headers": headers}
            await self.send(start)
            await self.send({**message, "body": body})
            return
        if self.stamp:
            body = self._stamped(body)
        await self.send({**message, "body": body})

    def _stamped(self, body: bytes) -> bytes:
        began = time.perf_counter()
        try:
            return self._stamp(body)
        finally:
            self.account.spent("stamp", began)

    def _stamp(self, body: bytes) -> bytes:
        if body.startswith(b"{"):
            return self.stamp + body[1:]
        if b'"finish_reason":"' in body:
            self.finished = True
        if body.startswith(b"data: [DONE]") and self.ctx.fence and not self.finished:
            # vLLM sends no chunk for a stream that ends before its first token: the client
            # still learns why it ended.
            self.finished = True
            return self._terminal_chunk() + body
        return body.replace(b"data: {", b"data: " + self.stamp)

    def _terminal_chunk(self) -> bytes:
        chat = self.path == "/v1/chat/completions"
        choice: dict[str, Any] = {"index": 0, "finish_reason": self.ctx.fence}
        if chat:
            choice["delta"] = {}
        else:
            choice["text"] = ""
        chunk = {
            "object": "chat.completion.chunk" if chat else "text_completion",
            "choices": [choice],
        }
        return b"data: " + self.stamp + json.dumps(chunk).encode()[1:] + b"\n\n"


def _headers(scope: dict[str, Any]) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}


def _with_length(headers: list[tuple[bytes, bytes]], length: int) -> list[tuple[bytes, bytes]]:
    kept = [(k, v) for k, v in headers if k.lower() != b"content-length"]
    return [*kept, (b"content-length", str(length).encode())]


def _error(message: str, kind: str, code: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "code": code}}


async def _send_json(send: Send, status: int, payload: dict[str, Any]) -> None:
    body = json.dumps(payload).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
