"""``RetireAsyncLLM``: vLLM's ``AsyncLLM`` with scopes, in the API process.

A request that names a scope (``vllm_xargs`` ``retire_scope``/``retire_tenant``, or the
``X-Retire-Scope``/``X-Retire-Tenant`` headers through ``http``) is opened at the authority in the
engine-core process (one utility call: ``Submit`` for a new scope, ``Supersede`` for a live one),
and the request itself follows at once on the same ordered socket, carrying the opening's id: the
engine side stamps it with its version and cache salt when the version is admitted
(``EngineSide.holds``), so the request waits for the engine core's busy loop once, as an unscoped
one does. Nothing of it reaches the caller before the open's reply (which comes once the version
is admitted); a refused open raises before any response, and vLLM aborts the request it added.
Requests without a scope are served exactly as ``AsyncLLM`` serves them.

This process decides nothing. It carries out the authority's fences on its streams: a fenced
version's terminal output (sent by the engine side before the reply to the revision that fenced
it, on the same ordered socket) ends the stream with ``finish_reason`` ``"superseded"`` or
``"cancelled"``, and whatever that output carries, or any output still buffered behind the fence,
is discarded; a reply that names fenced versions marks their streams at once, so a chunk taken
from a stream's buffer after the revision was accepted is never handed to the caller.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import os
import time
import uuid
from collections.abc import AsyncGenerator
from typing import Any

import attrs

from vllm.v1.engine.async_llm import AsyncLLM
from vllm.v1.engine.exceptions import EngineDeadError

from . import early_opens, wire
from .records import ApiAccount


@attrs.define
class RequestContext:
    """One HTTP request's scope (from headers) and, once opened, its version (for stamping) and
    the wall-clock moments of its opening (``wire.server_timing``)."""

    scope: str | None = None
    tenant: str | None = None
    opened_scope: str | None = None
    version: int | None = None
    incarnation: int | None = None  # when the scope id was opened (``ScopeInfo.incarnation``)
    fence: str | None = None  # the finish reason the stream ended with, when fenced
    error: wire.ScopeRequestError | None = None
    moments: dict[str, float] = attrs.field(factory=lambda: {"arrived": time.time()})


#: Set by ``http.RetireMiddleware`` around each generation request.
CONTEXT: contextvars.ContextVar[RequestContext | None] = contextvars.ContextVar(
    "retire_request", default=None
)


@attrs.define
class _Stream:
    fence: str | None = None


class RetireAsyncLLM(AsyncLLM):
    _retire_streams: dict[tuple[str, int], _Stream]

    @property
    def retire_account(self) -> ApiAccount:
        """This process's count of Retire's part in it (outputs gated and discarded, seconds)."""
        account: ApiAccount = self.__dict__.setdefault("_retire_account", ApiAccount())
        return account

    async def expire_idle_scopes(self, idle_seconds: float) -> None:
        """Run for the server's life: cancel scopes idle for longer than ``idle_seconds``."""
        period = max(1.0, min(idle_seconds / 4, 30.0))
        while True:
            await asyncio.sleep(period)
            await self.retire("expire", idle_seconds=idle_seconds)

    def retire_sizes(self) -> dict[str, int]:
        """How many entries this process's per-request structures hold now (the engine side's
        are in its ``sizes``): Retire's streams of scoped versions and its background tasks,
        vLLM's per-request output state. Each is bounded by the requests in flight."""
        processor = self.output_processor
        return {
            "streams": len(self.__dict__.get("_retire_streams", ())),
            "tasks": len(self.__dict__.get("_retire_tasks", ())),
            "output_states": len(processor.request_states),
            "parent_requests": len(processor.parent_requests),
        }

    def _run_output_handler(self) -> None:
        super()._run_output_handler()  # type: ignore[no-untyped-call]
        handler = self.output_handler
        if handler is not None and self.__dict__.get("_retire_watched") is not handler:
            self.__dict__["_retire_watched"] = handler
            handler.add_done_callback(self._fail_waiting_calls)

    def _fail_waiting_calls(self, _handler: asyncio.Task[Any]) -> None:
        """vLLM resolves a utility call's future only with the engine core's answer: a call in
        flight when the engine core dies would wait forever, and with it the scoped request
        behind it (a client then sees a timeout instead of vLLM's 500). When the output handler
        ends -- the engine core died, or the engine shut down -- every call still waiting fails
        with ``EngineDeadError``."""
        for future in list(self.engine_core.utility_results.values()):
            if not future.done():
                future.set_exception(EngineDeadError())

    async def retire(self, op: str, dp_rank: int | None = None, **payload: Any) -> dict[str, Any]:
        """One operation at the authority; raises ``ScopeRequestError`` when it is refused.

        With data parallelism every engine core has its own authority: an operation on a scope
        goes to the scope's engine (``dp_rank``, else ``wire.affinity``; the answer names it as
        ``dp_rank``), one without a scope to every engine, their answers merged."""
        engines = list(getattr(self.engine_core, "core_engines", ()))
        answer: dict[str, Any]
        if len(engines) <= 1:
            reply = await self.engine_core.call_utility_async(wire.UTILITY, op, payload)
            answer = wire.raise_if_refused(reply)
        elif "scope" in payload:
            rank = dp_rank if dp_rank is not None else self._engine_of(payload)
            assert rank is not None
            reply = await self.engine_core._call_utility_async(
                wire.UTILITY, op, payload, engine=engines[rank]
            )
            answer = {**wire.raise_if_refused(reply), "dp_rank": rank}
        else:
            answers = await self.engine_core.call_utility_all_async(wire.UTILITY, op, payload)
            answer = wire.merge_answers([wire.raise_if_refused(a) for a in answers])
        self._carry_out_fences(str(payload.get("scope", "")), answer.get("fenced", ()))
        return answer

    def _carry_out_fences(self, scope: str, versions: Any) -> None:
        streams = self.__dict__.setdefault("_retire_streams", {})
        for version in versions:
            stream = streams.get((scope, int(version)))
            if stream is not None and stream.fence is None:
                stream.fence = wire.FINISH_SUPERSEDED  # the engine's terminal output says which

    async def generate(
        self, prompt: Any, sampling_params: Any, request_id: str, **kwargs: Any
    ) -> AsyncGenerator[Any, None]:
        ctx = CONTEXT.get()
        args = dict(sampling_params.extra_args or {})
        scope = args.get(wire.XARG_SCOPE) or (ctx.scope if ctx is not None else None)
        if scope is None:
            async for out in super().generate(prompt, sampling_params, request_id, **kwargs):
                yield out
            return
        tenant = args.get(wire.XARG_TENANT) or (ctx.tenant if ctx else None)
        try:
            payload = _open_payload(
                str(scope), tenant or wire.DEFAULT_TENANT, prompt, args, sampling_params
            )
        except wire.ScopeRequestError as err:
            if ctx is not None:
                ctx.error = err
            raise
        rank = self._engine_of(payload)
        sent = time.time()
        # first to the engine core's ``open`` socket, where it is decided even while a step
        # runs (``early_opens``); then as the utility call, which answers with that decision
        payload["early"] = self._send_early(rank or 0, payload)
        opening = asyncio.ensure_future(self.retire("open", dp_rank=rank, **payload))
        first: asyncio.Future[Any] | None = None
        try:
            # The open leaves first (its task runs up to its send before this one goes on); the
            # request follows at once on the same ordered socket, so the engine core takes both
            # in one pass of its busy loop, instead of the request waiting for the open's answer.
            await asyncio.sleep(0)
            params = sampling_params.clone()
            params.extra_args = {
                **args,
                wire.XARG_SCOPE: str(scope),
                wire.XARG_OPENING: payload["opening"],
            }
            if rank is not None:  # the scope's engine: where its authority opens the version
                kwargs["data_parallel_rank"] = rank
            outputs = super().generate(prompt, params, request_id, **kwargs)
            first = asyncio.ensure_future(anext(outputs))
            answer = await asyncio.shield(opening)
        except BaseException as err:
            if first is not None:
                await _stop(first, outputs)  # vLLM aborts the request it added
            if isinstance(err, wire.ScopeRequestError) and ctx is not None:
                ctx.error = err
            if isinstance(err, asyncio.CancelledError):  # the client left during the opening
                self.retire_account.openings_left += 1
            opening.add_done_callback(self._abandon)  # if it was opened, nothing will run it
            raise
        version = int(answer["version"])
        if ctx is not None:
            ctx.opened_scope, ctx.version = str(scope), version
            ctx.incarnation = answer.get("incarnation")
            ctx.moments.update(sent=sent, **answer.get("timing", {}), answered=time.time())
        if "fence" in answer:  # revised or cancelled before it was admitted: it ran nothing
            await _stop(first, outputs)
            self._abandon(opening)  # its opening, should its request not have been sent
            if ctx is not None:
                ctx.fence = str(answer["fence"])
            yield _terminal(request_id, prompt, str(answer["fence"]))
            return
        streams = self.__dict__.setdefault("_retire_streams", {})
        key = (str(scope), version)
        stream = streams[key] = _Stream()
        account = self.retire_account
        try:
            try:
                out = await first
            except BaseException:
                self._abandon(opening)  # its request never ran as the version (a no-op if it did)
                raise
            fence: str | None = None
            while True:
                began = time.perf_counter()
                fence, publish = self._gate(out, fence or stream.fence, ctx)
                account.spent("gate", began)
                if publish:
                    yield out
                try:
                    out = await anext(outputs)
                except StopAsyncIteration:
                    break
        finally:
            streams.pop(key, None)
            await _stop(first, outputs)

    def connect_open_sockets(self) -> None:
        """Connect to every engine core's ``open`` socket (``retire serve`` names their directory
        in ``FENCE_DIR_ENV``; unset: every ``open`` is decided between steps). Called once the
        engine cores listen, so the first scoped request already finds the connections made."""
        directory = os.environ.get(early_opens.FENCE_DIR_ENV)
        if directory:
            sender = self.__dict__["_retire_sender"] = early_opens.OpenSender(directory)
            sender.connect(max(1, len(getattr(self.engine_core, "core_engines", ()))))

    def _send_early(self, engine: int, payload: dict[str, Any]) -> bool:
        sender: early_opens.OpenSender | None = self.__dict__.get("_retire_sender")
        return sender is not None and sender.send(engine, payload)

    def _engine_of(self, payload: dict[str, Any]) -> int | None:
        """With data parallelism, the engine of the authority of ``payload``'s scope
        (``wire.affinity``); None with one engine."""
        engines = list(getattr(self.engine_core, "core_engines", ()))
        if len(engines) <= 1:
            return None
        tenant = payload.get("tenant") or wire.DEFAULT_TENANT
        return wire.affinity(str(tenant), str(payload["scope"]), len(engines))

    def _gate(
        self, out: Any, fence: str | None, ctx: RequestContext | None
    ) -> tuple[str | None, bool]:
        """The publication check on one output of a scoped version: the fence its stream ended
        with (``None`` while current), and whether ``out`` goes to the caller. Behind a fence
        nothing is published; the fence's terminal output goes on emptied, naming the fence."""
        account = self.retire_account
        account.outputs += 1
        completion = out.outputs[0]
        if out.finished:
            fence = wire.fence_reason(completion.stop_reason) or fence
        if fence is None:
            return None, True
        account.dropped_outputs += 1 if completion.token_ids else 0
        if not out.finished:
            return fence, False
        if ctx is not None:
            ctx.fence = fence
        completion.token_ids = []
        completion.text = ""
        completion.logprobs = None
        completion.finish_reason = fence
        completion.stop_reason = None
        return fence, True

    def _abandon(self, opening: asyncio.Future[dict[str, Any]]) -> None:
        """A version opened for a request that will not run as it (its client left, or the
        request failed before it ran): the authority forgets its admission, if its request has
        not taken it (the version stays current, with nothing running, as a finished one), and
        its opening, if the request was never sent."""
        if opening.cancelled() or opening.exception() is not None:
            return
        answer = opening.result()
        task = asyncio.ensure_future(
            self.retire(
                "abandon",
                dp_rank=answer.get("dp_rank"),
                scope=answer["scope"],
                version=answer["version"],
            )
        )
        self.__dict__.setdefault("_retire_tasks", set()).add(task)
        task.add_done_callback(self.__dict__["_retire_tasks"].discard)


def _open_payload(
    scope: str, tenant: str, prompt: Any, args: dict[str, Any], params: Any
) -> dict[str, Any]:
    """The ``open`` call's arguments for a scoped request, with the opening id its request will
    carry; raises ``ScopeRequestError`` (nothing sent) for what the API process can refuse."""
    for key in (wire.XARG_SCOPE, wire.XARG_TENANT):
        if key in args and not isinstance(args[key], str):
            raise wire.ScopeRequestError(
                "MalformedIdError", f"{key} must be a string, got {args[key]!r}"
            )
    for key in (wire.XARG_VERSION, wire.XARG_OPENING):
        if key in args:
            raise wire.ScopeRequestError(
                "MalformedIdError", f"{key} is set by the server, not by a client"
            )
    if not isinstance(prompt, dict) or "prompt_token_ids" not in prompt:
        raise wire.ScopeRequestError(
            "ContractError", "a scoped request needs a token prompt (text or token ids)"
        )
    if getattr(params, "n", 1) != 1:
        raise wire.ScopeRequestError("ContractError", "a scoped request generates n=1")
    return {
        "scope": scope,
        "tenant": tenant,
        "prompt_token_ids": list(prompt["prompt_token_ids"]),
        "greedy": float(params.temperature) == 0.0,
        "opening": uuid.uuid4().hex,
    }


async def _stop(first: asyncio.Future[Any], outputs: AsyncGenerator[Any, None]) -> None:
    """End a request's own generation (vLLM's ``generate``: it aborts the request it added)."""
    if not first.done():
        first.cancel()
        with contextlib.suppress(BaseException):
            await first
    await outputs.aclose()


def _terminal(request_id: str, prompt: Any, reason: str) -> Any:
    from vllm.outputs import CompletionOutput, RequestOutput

    return RequestOutput(
        request_id=request_id,
        prompt=None,
        prompt_token_ids=list(prompt.get("prompt_token_ids", ())),
        prompt_logprobs=None,
        outputs=[
            CompletionOutput(
                index=0,
                text="",
                token_ids=[],
                cumulative_logprob=None,
                logprobs=None,
                finish_reason=reason,
            )
        ],
        finished=True,
    )
