"""Native replacement baselines: what an application does today on an unmodified vLLM.

Both classes implement :class:`retire_vllm.api.ReplacementEngine` on an in-process ``LLMEngine``
built with exactly the engine settings the Retire facade uses (``retire_vllm.engine_config``), and
stepped by the caller, so both arms of a replay are deterministic and see the same engine:

* :class:`NativeAbortResubmit` -- a revision aborts the predecessor through vLLM's public API
  (``LLMEngine.abort_request([internal_id], internal=True)``, the only form that cannot also abort
  the successor, see ``docs/vllm_research.md`` (e)) and submits the revised request.
* :class:`NativeStopReading` -- a revision makes the client stop reading the old stream and submit
  the successor; the old request runs on to completion (the common agent-framework behaviour).

Publication path. Each request gets vLLM's own ``RequestOutputCollector`` in DELTA mode, attached
as the request state's queue exactly as ``AsyncLLM.add_request`` does, so outputs that the
consumer has not read yet are *merged* by vLLM's code, and ``abort_request`` puts vLLM's own final
``finish_reason=abort`` output into it. A slow consumer that calls :meth:`consume` late therefore
reads predecessor tokens after the revision -- those are counted by the replay harness, never
invented here. (We do not use ``AsyncLLM`` because it always runs the engine core in a second
process, which makes the replay non-deterministic and differs from the in-process engine the
Retire facade drives; the collector and abort code paths are the same objects either way.)

Per-version records (:class:`NativeVersion`) say which internal request ids a version used and
whether its stream still holds undelivered output; the harness uses them, plus its own look into
the scheduler, to decide when an old version is closed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from retire_core import Contract
from retire_vllm.api import Delivery

if TYPE_CHECKING:
    from vllm.v1.engine.llm_engine import LLMEngine


class NativeLeakError(RuntimeError):
    """``close()`` found KV blocks or request state left behind."""


@attrs.define
class NativeVersion:
    """What the native client did for one ``(scope, version)``."""

    scope: str
    version: int
    request_id: str
    prompt_len: int
    max_tokens: int
    submitted_at: float
    retired_at: float | None = None
    engine_closed_at: float | None = None  # left the scheduler and the output processor
    stream_closed_at: float | None = None  # final frame read, or stream abandoned and done
    read: bool = True  # the consumer still reads this stream
    tokens_generated: int = 0  # tokens the engine produced for it (read or not)
    tokens_after_retire: int = 0  # of those, produced after the revision (wasted compute)
    num_cached_tokens: int | None = None
    collector: Any = None

    @property
    def stream_open(self) -> bool:
        return self.stream_closed_at is None


def _make_collector_class() -> type[Any]:
    from vllm.v1.engine.output_processor import RequestOutputCollector

    class CountingCollector(RequestOutputCollector):
        """vLLM's collector, plus a count of the tokens put into it (for wasted-work figures)."""

        def __init__(
            self,
            output_kind: Any,
            request_id: str,
            owner: NativeVersion,
            clock: Callable[[], float],
        ) -> None:
            super().__init__(output_kind, request_id)
            self._owner = owner
            self._clock = clock

        def put(self, output: Any) -> None:
            outs = getattr(output, "outputs", None)
            if outs:
                n = len(outs[0].token_ids)
                self._owner.tokens_generated += n
                if self._owner.retired_at is not None:
                    self._owner.tokens_after_retire += n
            cached = getattr(output, "num_cached_tokens", None)
            if cached is not None and self._owner.num_cached_tokens is None:
                self._owner.num_cached_tokens = int(cached)
            super().put(output)

    return CountingCollector


class NativeEngine:
    """Shared machinery of the two native baselines (not a baseline by itself)."""

    system = "native-base"
    #: on revision / cancel: abort the old request (True) or just stop reading it (False)
    aborts = True

    def __init__(
        self,
        model_path: str | None = None,
        *,
        engine: LLMEngine | None = None,
        clock: Callable[[], float] = time.perf_counter,
        **engine_overrides: Any,
    ) -> None:
        if engine is None:
            from retire_vllm.engine_config import build_engine

            engine = build_engine(model_path, **engine_overrides)
        from vllm.sampling_params import RequestOutputKind

        self.engine = engine
        self._clock = clock
        self._delta = RequestOutputKind.DELTA
        self._collector_cls = _make_collector_class()
        self._versions: dict[tuple[str, int], NativeVersion] = {}
        self._current: dict[str, int] = {}
        self._paused: set[str] = set()
        self._cancelled: set[str] = set()
        self._by_request: dict[str, NativeVersion] = {}
        self._closed = False

    # --- ReplacementEngine ---------------------------------------------------------------

    def submit(self, scope: str, prompt: Sequence[int], contract: Contract, max_tokens: int) -> int:
        if scope in self._current:
            raise ValueError(f"scope {scope!r} already exists")
        self._current[scope] = 0
        self._start(scope, 0, prompt, max_tokens)
        return 0

    def supersede(
        self, scope: str, prompt: Sequence[int], contract: Contract, max_tokens: int
    ) -> int:
        old = self._current_record(scope)
        self._retire(old)
        version = old.version + 1
        self._current[scope] = version
        self._start(scope, version, prompt, max_tokens)
        return version

    def pause(self, scope: str) -> None:
        # vLLM has no per-request pause: the client holds its reads, the request keeps running.
        self._current_record(scope)
        self._paused.add(scope)

    def unpause(self, scope: str) -> None:
        self._current_record(scope)
        self._paused.discard(scope)

    def cancel(self, scope: str) -> None:
        self._retire(self._current_record(scope))
        self._cancelled.add(scope)
        self._paused.discard(scope)

    def step(self) -> None:
        if self.engine.has_unfinished_requests():
            self.engine.step()  # outputs go to the collectors, not into the returned list
        self._observe()

    def consume(self, scope: str) -> list[Delivery]:
        """Read every stream of ``scope`` the client still reads, oldest first."""
        if scope in self._paused:
            return []
        out: list[Delivery] = []
        now = self._clock()
        for rec in self._scope_versions(scope):
            if not rec.read or rec.collector is None:
                continue
            got = rec.collector.get_nowait()
            if got is None:
                continue
            tokens = tuple(got.outputs[0].token_ids) if got.outputs else ()
            out.append(Delivery(scope, rec.version, tokens, bool(got.finished), now))
            if got.finished:
                rec.read = False
                rec.stream_closed_at = now
                rec.collector = None
        self._observe()
        return out

    def has_unfinished(self) -> bool:
        return bool(self.engine.has_unfinished_requests())

    def close(self) -> None:
        """Abort whatever still runs, drain the engine and check that nothing leaked."""
        if self._closed:
            return
        self._closed = True
        live = [r.request_id for r in self._versions.values() if r.engine_closed_at is None]
        if live:
            self.engine.abort_request(live, internal=True)
        for _ in range(10_000):
            if not self.engine.has_unfinished_requests():
                break
            self.engine.step()
        self._observe()
        for rec in self._versions.values():
            rec.collector = None
        self.check_no_leak()

    def add_external(
        self, request_id: str, prompt: Sequence[int], max_tokens: int, salt: str | None = None
    ) -> str:
        """A request outside any scope (co-tenant traffic); its outputs are not collected."""
        from vllm.sampling_params import SamplingParams

        params = SamplingParams(
            temperature=0.0, max_tokens=max_tokens, ignore_eos=True, output_kind=self._delta
        )
        inputs: dict[str, Any] = {"prompt_token_ids": list(prompt)}
        if salt is not None:
            inputs["cache_salt"] = salt
        return str(self.engine.add_request(request_id, inputs, params))  # type: ignore[arg-type]

    # --- records for the harness ------------------------------------------------------------

    def versions(self) -> list[NativeVersion]:
        return sorted(self._versions.values(), key=lambda r: (r.submitted_at, r.scope))

    def version_record(self, scope: str, version: int) -> NativeVersion:
        return self._versions[(scope, version)]

    def request_ids(self, scope: str, version: int) -> tuple[str, ...]:
        rec = self._versions.get((scope, version))
        return () if rec is None else (rec.request_id,)

    def stream_open(self, scope: str, version: int) -> bool:
        rec = self._versions.get((scope, version))
        return rec is not None and rec.stream_open

    def check_no_leak(self) -> None:
        from retire_vllm import introspect

        pool = introspect.block_pool(self.engine)
        usable = len(pool.blocks) - 1  # block 0 is vLLM's null block
        problems = []
        if pool.get_num_free_blocks() != usable:
            problems.append(f"{usable - pool.get_num_free_blocks()} KV blocks still in use")
        if self.engine.output_processor.request_states:
            problems.append(f"{len(self.engine.output_processor.request_states)} request states")
        if introspect.scheduler(self.engine).requests:
            problems.append(f"{len(introspect.scheduler(self.engine).requests)} scheduler requests")
        if problems:
            raise NativeLeakError("; ".join(problems))

    # --- internals ---------------------------------------------------------------------------

    def _current_record(self, scope: str) -> NativeVersion:
        if scope not in self._current:
            raise KeyError(f"unknown scope {scope!r}")
        if scope in self._cancelled:
            raise ValueError(f"scope {scope!r} is cancelled")
        return self._versions[(scope, self._current[scope])]

    def _scope_versions(self, scope: str) -> list[NativeVersion]:
        n = self._current.get(scope, -1) + 1
        return [self._versions[(scope, v)] for v in range(n) if (scope, v) in self._versions]

    def _start(self, scope: str, version: int, prompt: Sequence[int], max_tokens: int) -> None:
        from vllm.sampling_params import SamplingParams

        params = SamplingParams(
            temperature=0.0, max_tokens=max_tokens, ignore_eos=True, output_kind=self._delta
        )
        now = self._clock()
        rid = self.engine.add_request(
            f"{scope}-v{version}", {"prompt_token_ids": list(prompt)}, params
        )
        rec = NativeVersion(scope, version, rid, len(prompt), max_tokens, now)
        rec.collector = self._collector_cls(self._delta, rid, rec, self._clock)
        # What AsyncLLM.add_request does: the request state publishes into this collector.
        self.engine.output_processor.request_states[rid].queue = rec.collector
        self._versions[(scope, version)] = rec
        self._by_request[rid] = rec

    def _retire(self, rec: NativeVersion) -> None:
        rec.retired_at = self._clock()
        if self.aborts:
            # vLLM's public abort: the scheduler frees the request; vLLM puts a final abort
            # output into the collector, merged with anything the consumer has not read yet.
            self.engine.abort_request([rec.request_id], internal=True)
        else:
            rec.read = False  # the client drops the stream; the request runs to completion
        self._observe()

    def _observe(self) -> None:
        """Stamp engine closure of requests that left vLLM, and abandoned streams that ended."""
        states = self.engine.output_processor.request_states
        from retire_vllm import introspect

        sched = introspect.scheduler(self.engine).requests
        now = None
        for rec in self._by_request.values():
            if (
                rec.engine_closed_at is None
                and rec.request_id not in states
                and (rec.request_id not in sched)
            ):
                now = now if now is not None else self._clock()
                rec.engine_closed_at = now
            if rec.engine_closed_at is not None and not rec.read and rec.stream_closed_at is None:
                # Nobody reads this stream any more and the engine is done with it.
                rec.stream_closed_at = rec.engine_closed_at
                rec.collector = None
        # Forget fully closed requests so that observation stays cheap.
        for rid in [
            r
            for r, rec in self._by_request.items()
            if rec.stream_closed_at is not None and rec.engine_closed_at is not None
        ]:
            del self._by_request[rid]


class NativeAbortResubmit(NativeEngine):
    """Abort the predecessor through vLLM's public API, then submit the revised request."""

    system = "native"
    aborts = True


class NativeStopReading(NativeEngine):
    """Stop reading the old stream and submit the successor; the old request runs to the end."""

    system = "native_stop_reading"
    aborts = False
