"""``RetireEngine``: ``retire_core.Retire`` as the control logic of a real vLLM engine.

The facade owns an in-process ``LLMEngine`` (``VLLM_ENABLE_V1_MULTIPROCESSING=0``; with tensor
parallelism the workers run in their own processes, the scheduler stays here) whose scheduler is
:class:`retire_vllm.scheduler.RetireScheduler`, and steps it by hand; it is the benchmarks'
deterministic driver, beside ``retire serve``. It never decides protocol: each observation point
turns what it sees in vLLM into core events (one ``Retire.handle_batch`` per hook and per
``consume``; a fenced request's receipts one at a time, since each can admit the successor), and
the commands go to the one executor (``executor.CommandExecutor``, shared with the serving engine
side, completed for this engine by ``facade_commands.FacadeCommands``). Which observation gives
which event, and what each command does in vLLM: ``docs/vllm.md`` ("Observations -> events",
"Commands -> actions"). A worker process that dies (or stops answering one of Retire's calls,
``observe.collective``) surfaces as :class:`EngineDeadError` from the call that met it; the
commands still in hand are not carried out, and every later ``step`` and ``close`` raises it
without touching the engine. Its records and statistics live in ``facade_records``, the faults
a campaign injects in ``faults``.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from retire_core import (
    DEFAULT_CONTRACT,
    AllowWrite,
    Cancel,
    Command,
    Contract,
    Drop,
    Event,
    FrameArrived,
    FrameKind,
    PageEvicted,
    PageReused,
    PageUnreferenced,
    Pause,
    Publish,
    Retire,
    ScopeState,
    Submit,
    Supersede,
    Unpause,
    VersionFinished,
)

from . import identity, observe
from . import introspect as ix
from .api import Delivery
from .corelog import CoreLog, NullLogger, TraceRejected, log_path_for
from .engine_config import BLOCK_SIZE, build_engine, engine_contract
from .errors import EngineDeadError, IntegrationError, IsolationError, LeakError
from .executor import participant_names
from .facade_commands import FacadeCommands
from .facade_records import (
    Chunk,
    ExternalRequest,
    FacadeRequest,
    ScopeLog,
    Stats,
    VersionRecord,
)
from .serving.ledger import BlockLedger

if TYPE_CHECKING:
    from vllm.v1.engine.llm_engine import LLMEngine


_FACADE_IDS = itertools.count()


# --- the facade --------------------------------------------------------------------------------


class RetireEngine:
    """One vLLM engine under one ``retire_core.Retire`` (implements ``api.ReplacementEngine``)."""

    def __init__(
        self,
        model_path: str | Path | None = None,
        *,
        engine: LLMEngine | None = None,
        clock: Callable[[], float] = time.perf_counter,
        logger: Any | None = None,
        tenant: str = "default",
        log_path: str | Path | None = None,
        **engine_overrides: Any,
    ) -> None:
        from .scheduler import RetireScheduler

        self.clock = clock
        self.tenant = tenant
        self.uid = next(_FACADE_IDS)
        self._owns_engine = engine is None
        if engine is None:
            engine_overrides.setdefault("scheduler_cls", RetireScheduler)
            engine = build_engine(model_path, **engine_overrides)
        elif engine_overrides:
            raise TypeError("engine overrides given together with an existing engine")
        self.engine: LLMEngine = engine
        ix.share_distributed_state(engine)  # (a fleet runs several engines in this process)
        self.scheduler: Any = ix.scheduler(engine)
        if not isinstance(self.scheduler, RetireScheduler):
            raise TypeError(
                "the engine's scheduler is not a RetireScheduler: build it with "
                "scheduler_cls=retire_vllm.scheduler.RetireScheduler"
            )
        if self.scheduler.retire_hooks is not None:
            raise RuntimeError("another RetireEngine is attached to this engine; close it first")
        if self.scheduler.has_unfinished_requests():
            raise RuntimeError("attach a RetireEngine to an idle engine")
        self.kvm: Any = ix.kv_cache_manager(engine)
        self.pool: Any = ix.block_pool(engine)
        self.executor: Any = ix.engine_core(engine).model_executor
        # Every rank's KV cache must be readable block by block (digests, receipts), or the
        # first writer closure would fail mid-run: say so now, before attaching.
        problems = self.executor.collective_rpc(
            ix.worker_kv_layout_problem, args=(int(self.pool.num_gpu_blocks),)
        )
        if any(problems):
            raise IntegrationError(
                "Retire cannot read this engine's KV blocks: "
                + "; ".join(f"rank {r}: {p}" for r, p in enumerate(problems) if p)
            )
        vcfg: Any = ix.engine_core(engine).vllm_config
        self.block_size: int = int(vcfg.cache_config.block_size)
        if self.block_size != BLOCK_SIZE:
            raise IntegrationError(f"block size {self.block_size}, expected {BLOCK_SIZE}")
        # One window per KV cache group (refuses groups Retire cannot certify, before attaching).
        self.kv_windows = observe.kv_windows(self.kvm, self.block_size)
        self.null_block = ix.null_block_id(self.kvm)
        self.tp: int = int(vcfg.parallel_config.tensor_parallel_size)
        self.max_model_len: int = int(vcfg.model_config.max_model_len)
        self.model_id = Path(str(vcfg.model_config.model)).name
        self.dtype = str(vcfg.model_config.dtype).replace("torch.", "")
        self.fingerprint = self.fingerprint_of(tenant)

        # The core's log, validated against the spec at ``close`` (``corelog``): to ``log_path``,
        # else into $RETIRE_CORE_LOG_DIR unless a logger is given.
        path = log_path_for(log_path, logger)
        self.core_log: CoreLog | None = CoreLog(path) if path is not None else None
        if self.core_log is not None:
            logger = self.core_log
        self.retire = Retire(logger=logger if logger is not None else NullLogger())

        self.records: dict[str, ScopeLog] = {}
        self.external: dict[str, ExternalRequest] = {}
        self.stats = Stats()
        self.reqs: dict[str, FacadeRequest] = {}
        self.participant_rid: dict[str, str] = {}
        self.internal_ids: dict[str, str] = {}  # external request id -> internal id
        self.queues: dict[str, deque[Chunk]] = {}
        self._frame_ids = itertools.count()  # every frame id is decided once, by its caller
        self._completed: list[int] = []
        self._drafts: list[observe.DraftWrite] = []  # the step's draft writes, until verified
        self._refused: set[str] = set()  # the step's requests whose commit was dropped
        self._held: set[str] = set()
        self._maybe_paused: set[str] = set()  # scopes paused through ``pause`` (maybe unpaused)
        self._during_step: list[Callable[[RetireEngine], None]] = []
        self._preempted: list[FacadeRequest] = []  # in this schedule: managed again after it
        self.observers: list[Any] = []  # objects with before_execute(facade, writes)/after_step
        self._step_writes: list[tuple[str, int, int]] = []  # (rid, block id, position)
        self._closed = False
        self._steps = 0
        # The engine's death (a worker process died, or stopped answering), once seen: every
        # later ``step`` and ``close`` raises it instead of touching the engine.
        self.dead: EngineDeadError | None = None

        # Every retention, pin and handoff reference on a vLLM block, with its generation stamp.
        self.ledger = BlockLedger(self.pool)
        self.pages = self.ledger.refs  # block id -> BlockRef (what the facade retains)
        self.commands = FacadeCommands(self)  # carries out every command the core returns
        self.spy = self.ledger.spy
        self.spy.listeners.append(self._on_blocks_handed_out)
        self.initial_free_blocks = self.pool.get_num_free_blocks()
        self.scheduler.retire_hooks = self

    # ---- user API (api.ReplacementEngine) -----------------------------------------------------

    def submit(
        self,
        scope: str,
        prompt: Sequence[int],
        contract: Contract = DEFAULT_CONTRACT,
        max_tokens: int = 16,
        *,
        tenant: str | None = None,
    ) -> int:
        """Version 0 of ``scope``, owned by ``tenant`` (default: the facade's ``tenant``). A
        scope's tenant is part of its pages' fingerprint, of its prefix identities and of the
        physical cache salt of its cold versions, so that scopes of several tenants can share
        one engine without sharing a page."""
        tenant = self.tenant if tenant is None else tenant
        contract, tokens, context, names = self._prepare(
            scope, prompt, contract, max_tokens, tenant
        )
        record = VersionRecord(scope, 0, tokens, max_tokens, contract, context, self.clock())
        record.output_names = names

        def accept() -> None:
            self.records[scope] = ScopeLog(scope, tenant, [record])
            self.queues[scope] = deque()

        submit = Submit(scope, tenant, self.fingerprint_of(tenant), context, contract)
        self.emit(submit, accept)
        return 0

    def supersede(
        self,
        scope: str,
        prompt: Sequence[int],
        contract: Contract = DEFAULT_CONTRACT,
        max_tokens: int = 16,
    ) -> int:
        log = self.records.get(scope)
        tenant = self.tenant if log is None else log.tenant  # (unknown: the core refuses it)
        contract, tokens, context, names = self._prepare(
            scope, prompt, contract, max_tokens, tenant
        )

        def accept() -> None:
            version = self.retire.current_version(scope)
            record = VersionRecord(
                scope, version, tokens, max_tokens, contract, context, self.clock()
            )
            record.output_names = names
            self.records[scope].versions.append(record)

        self.emit(Supersede(scope, context, contract), accept)
        return self.retire.current_version(scope)

    def pause(self, scope: str) -> None:
        self.emit(Pause(scope))
        self._maybe_paused.add(scope)

    def unpause(self, scope: str) -> None:
        self.emit(Unpause(scope))

    def cancel(self, scope: str) -> None:
        self.emit(Cancel(scope))

    def step(self) -> None:
        """Byte-check pending certificates and admit, run one engine step, then report what it
        did (closed writers, outputs, finished requests) and carry out fences deferred to this
        step boundary."""
        if self.dead is not None or observe.engine_failed(self.executor):
            raise self._died()
        try:
            self._step()
        except EngineDeadError as err:
            self.dead = err
            raise

    def _step(self) -> None:
        commands = self.commands
        if commands.pending_reports:
            commands.send_reports(self._held)
        commands.in_step = True
        try:
            outputs = self.engine.step()
        except (RuntimeError, TimeoutError) as err:
            dead = observe.engine_death(self.executor, err)
            if dead is None:
                raise
            raise dead from err
        finally:
            commands.in_step = False
        self._steps += 1
        if self._drafts:
            self._verify_drafts()
        if self._completed:
            self._close_completed_writers()
        # The engine-boundary TOKEN frames of this step's outputs go to the core as one batch,
        # flushed before a finished request is closed so that the core sees every event in the
        # order it would one by one.
        frames: list[Chunk] = []
        on_output = self._on_output
        for out in outputs:
            on_output(out, frames)
        if frames:
            self.deliver_engine_frames(frames)
        if commands.deferred:
            commands.run_deferred()
        for obs in self.observers:
            obs.after_step(self)

    def consume(self, scope: str) -> list[Delivery]:
        """What the consumer of ``scope`` reads now: every queued chunk crosses the consumer
        boundary as its own frame and is delivered only if the core publishes it. Once a
        version's last chunk is delivered, its end is reported (``VersionFinished``: its
        completed pages go back to vLLM's prefix cache)."""
        queue = self.queues.get(scope)
        delivered: list[Delivery] = []
        if not queue:
            return delivered
        # Every queued chunk crosses the boundary as its own frame; the core decides them all in
        # one batch (consumer frames only ever publish or drop, so nothing in between differs).
        chunks = list(queue)
        frames = [next(self._frame_ids) for _ in chunks]
        token = FrameKind.TOKEN
        fates = _fates(
            self.emit_batch(
                [
                    FrameArrived(scope, chunk.version, frame, token)
                    for chunk, frame in zip(chunks, frames, strict=True)
                ]
            )
        )
        for _ in chunks:
            queue.popleft()
        versions = self.records[scope].versions
        ended: list[int] = []
        for chunk, frame in zip(chunks, frames, strict=True):
            outcome = fates[frame]  # the core decides every frame when it arrives
            rec = versions[chunk.version]
            if outcome == "publish":
                if chunk.finished and chunk.finish_reason != "abort":
                    ended.append(chunk.version)  # its last chunk is read: it ran to its end
                now = self.clock()
                delivered.append(
                    Delivery(scope, chunk.version, chunk.token_ids, chunk.finished, now)
                )
                rec.delivered_token_ids.extend(chunk.token_ids)
                if chunk.token_ids:
                    rec.last_delivery_at = now
                    if rec.first_delivery_at is None:
                        rec.first_delivery_at = now
            else:
                rec.dropped_consumer_tokens += len(chunk.token_ids)
        for version in ended:
            self.emit(VersionFinished(scope, version))
        return delivered

    def has_unfinished(self) -> bool:
        """Is there work a ``step`` can advance?  Requests of paused scopes and successors held
        by :meth:`hold_admission` do not count (stepping cannot finish them)."""
        pending = any(scope not in self._held for scope, _ in self.commands.pending_reports)
        live = int(self.scheduler.get_num_unfinished_requests())
        paused = 0
        if self._maybe_paused:  # (otherwise nothing is withheld)
            requests = self.scheduler.requests
            paused = sum(1 for rid in self.withheld(self.scheduler) if rid in requests)
        return bool(live > paused or pending or self.commands.deferred)

    def close(self) -> None:
        """Cancel every scope, drain the engine, and check that every block, pin and page the
        facade took is back: the engine's free block count equals its value at attach time.
        On an engine that died (``EngineDeadError``) nothing is drained or checked: the facade
        detaches, validates its core log and raises the death."""
        if self._closed:
            return
        if self.dead is not None or observe.engine_failed(self.executor):
            self._closed = True
            self.scheduler.retire_hooks = None
            self.ledger.close()
            if self.core_log is not None:
                self.core_log.finish()  # what the core did up to the death is a behaviour
            raise self._died()
        try:
            for scope in list(self.records):
                if self.retire.scope(scope).state is not ScopeState.CANCELLED:
                    self.cancel(scope)
            self._held.clear()
            for _ in range(100_000):
                if not self.has_unfinished():
                    break
                self.step()
            problems = self.leaks()
        finally:
            self._closed = True
            self.scheduler.retire_hooks = None
            self.ledger.close()
        if self.core_log is not None:
            try:
                self.core_log.finish()
            except TraceRejected as err:
                if problems:
                    err.add_note("also left behind: " + "; ".join(problems))
                raise
        if problems:
            raise LeakError("; ".join(problems))

    def shutdown(self) -> None:
        """``close`` and, if this facade built the engine, shut the engine down."""
        try:
            self.close()
        finally:
            if self._owns_engine:
                self.engine.engine_core.shutdown()

    def _died(self) -> EngineDeadError:
        """The engine's death, recorded the first time it is seen; a new error each time it is
        raised again (fail closed: nothing more runs on a dead engine)."""
        if self.dead is None:
            self.dead = observe.engine_death(self.executor) or EngineDeadError("engine died")
        return EngineDeadError(str(self.dead))

    # ---- extras used by tests, the checker and benchmarks -----------------------------------

    def leaks(self) -> list[str]:
        problems = []
        free = self.pool.get_num_free_blocks()
        if free != self.initial_free_blocks:
            problems.append(f"free blocks {free} != {self.initial_free_blocks} at attach time")
        pinned = self.retire.pinned_pages()
        if pinned:
            problems.append(f"core still pins pages {list(pinned)}")
        ours = sorted(p for p, pg in self.pages.items() if pg.pins)
        if ours:
            problems.append(f"facade still holds pins on blocks {ours}")
        if self.pages:
            problems.append(f"facade still retains blocks {sorted(self.pages)}")
        if self.retire.state.pages:
            problems.append(f"core still tracks pages {sorted(self.retire.state.pages)}")
        return problems

    def hold_admission(self, scope: str) -> None:
        """Keep ``scope``'s next successor waiting (pinned, not byte-checked, not admitted) until
        :meth:`release_admission`: models a successor queued behind other traffic."""
        self._held.add(scope)

    def release_admission(self, scope: str) -> None:
        self._held.discard(scope)

    def during_next_step(self, callback: Callable[[RetireEngine], None]) -> None:
        """Run ``callback(self)`` inside the next step, after scheduling and before the model
        executes: a revision or cancel issued there arrives while the step is in flight."""
        self._during_step.append(callback)

    def add_external(
        self, request_id: str, prompt: Sequence[int], max_tokens: int, salt: str | None = None
    ) -> str:
        """Add a request that is not under Retire (a co-tenant); its output is kept in
        ``external``."""
        from vllm.sampling_params import RequestOutputKind, SamplingParams

        params = SamplingParams(
            temperature=0.0,
            max_tokens=max_tokens,
            ignore_eos=True,
            output_kind=RequestOutputKind.DELTA,
        )
        inputs: dict[str, Any] = {"prompt_token_ids": list(prompt)}
        if salt is not None:
            inputs["cache_salt"] = salt
        if request_id in self.internal_ids:
            raise ValueError(f"request id {request_id!r} is already in use")
        rid = self.engine.add_request(request_id, inputs, params)  # type: ignore[arg-type]
        self.internal_ids[request_id] = rid
        self.external[rid] = ExternalRequest(rid, tuple(prompt), salt)
        return rid

    def run_until_idle(self, max_steps: int = 100_000) -> int:
        for n in range(max_steps):
            if not self.has_unfinished():
                return n
            self.step()
        raise RuntimeError(f"engine still busy after {max_steps} steps")

    def read_digests(self, pages: Iterable[int]) -> dict[int, str]:
        """sha256 of the KV bytes of each block on every rank (``observe.read_digests``)."""
        return observe.read_digests(self.executor, list(pages))

    def digest_for_adoption(self, pages: Sequence[int]) -> dict[int, str]:
        """The byte check reported in ``AdoptionReport`` (tests patch this to disable it)."""
        return self.read_digests(pages)

    def owner_of(self, block_id: int) -> tuple[str, int] | None:
        """The scope and version whose page ``block_id`` holds: retained, or given back to
        vLLM's prefix cache (a finished version's) and not evicted since."""
        page = self.pages.get(block_id) or self.ledger.cached.get(block_id)
        return None if page is None else (page.scope, page.version)

    def page_generation(self, block_id: int) -> int:
        return self.spy.gen(block_id)

    def pinned_blocks(self) -> list[int]:
        return sorted(p for p, pg in self.pages.items() if pg.pins)

    def live_request_ids(self) -> list[str]:
        """Requests with a participant that has not delivered its receipt yet."""
        return sorted(rid for rid, r in self.reqs.items() if len(r.closed) < len(r.participants))

    def live_obsolete_request_ids(self) -> list[str]:
        """Live requests of versions that are no longer current (or of cancelled scopes)."""
        out = []
        for rid in self.live_request_ids():
            req = self.reqs[rid]
            if self.retire.revocation(req.scope, req.version) is not None:
                out.append(rid)
        return out

    def request_of(self, scope: str, version: int) -> str | None:
        return self.records[scope].version(version).request_id

    def version_record(self, scope: str, version: int | None = None) -> VersionRecord:
        log = self.records[scope]
        return log.current if version is None else log.version(version)

    # ---- scheduler hooks (RetireScheduler) -----------------------------------------------------

    def withheld(self, scheduler: Any) -> set[str]:
        held: set[str] = set()
        if not self._maybe_paused:
            return held
        # Only a Pause makes a scope paused, so only scopes we paused need a look; the core's
        # state says whether they still are.
        for scope in list(self._maybe_paused):
            rec = self.retire.scope(scope)
            if rec.state is ScopeState.PAUSED:
                rid = self.records[scope].version(rec.epoch).request_id
                if rid is not None:
                    held.add(rid)
            else:
                self._maybe_paused.discard(scope)
        return held

    def on_preempted(self, request: Any) -> None:
        """vLLM preempted a request of ours to make room (``CommandExecutor.preempt``); it is
        managed again under new participants once the schedule returns."""
        req = self.reqs.get(request.request_id)
        if req is None or len(req.closed) == len(req.participants):
            return
        self.stats.preemptions += 1
        gone = set(req.pages)  # a filled block is closed as the version's, not its successor's
        self._completed = [b for b in self._completed if b not in gone]
        self.commands.preempt(req, request)
        self._preempted.append(req)

    def _restart_preempted(self) -> None:
        preempted, self._preempted = self._preempted, []
        for old in preempted:
            participants = participant_names(old.rid, self.tp, old.preemptions + 1)
            old.record.participants = participants
            _, evicted = self.commands.restart(old, participants)
            self.stats.uncertified_hashes_evicted += evicted

    def after_schedule(self, scheduler: Any, scheduler_output: Any) -> None:
        if self._preempted:
            self._restart_preempted()
        if self._during_step:
            callbacks, self._during_step = self._during_step, []
            for callback in callbacks:
                callback(self)
        step_writes: list[tuple[str, int, int]] = []  # (rid, block id, position)
        self._step_writes = step_writes
        # The step's allocations and write checks go to the core as one batch, in the order they
        # would have gone one by one; the allocations' own bookkeeping follows once the core has
        # accepted them (a refused batch changes nothing, there or here).
        events, allocations, writes, first_time, self._drafts = observe.schedule_events(
            self.reqs, scheduler, scheduler_output, self.pages, self.block_size
        )
        for req, ids, start in first_time:
            self._check_prefix_hit(req, ids, start)
        if events:
            commands = self.retire.handle_batch(events)  # raises (and changes nothing) if bad
            self.stats.window_pages_passed += sum(1 for e in events if type(e) is PageUnreferenced)
            for req, bid, idx, group in allocations:
                self._retain(req, bid, idx, group)
            self.commands.run(commands)
            allowed = {(c.page, c.participant) for c in commands if isinstance(c, AllowWrite)}
            completed = self._completed
            for req, bid, idx, completes in writes:
                if (bid, req.participants[0]) not in allowed:
                    raise IsolationError(f"write of {req.rid} into block {bid} was not allowed")
                req.record.writes += 1
                step_writes.append((req.rid, bid, idx))
                if completes:
                    completed.append(bid)
        for obs in self.observers:
            obs.before_execute(self, list(step_writes))

    def before_commit(self, scheduler: Any, scheduler_output: Any) -> set[str]:
        refused: set[str] = set()
        events: list[Event] = []
        frames: list[tuple[FacadeRequest, int]] = []
        reqs = self.reqs
        frame_ids = self._frame_ids
        commit = FrameKind.COMMIT
        for rid in scheduler_output.num_scheduled_tokens:
            req = reqs.get(rid)
            if req is None:
                continue
            frame = next(frame_ids)
            events.append(FrameArrived(req.scope, req.version, frame, commit))
            frames.append((req, frame))
        self._refused = refused
        if not events:
            return refused
        # one COMMIT frame per scheduled request, decided together
        fates = _fates(self.emit_batch(events))
        for req, frame in frames:
            rec = req.record
            rec.commits += 1
            if fates[frame] != "publish":
                refused.add(req.rid)
                rec.commits_dropped += 1
                self.stats.commits_dropped += 1
        return refused

    # ---- event plumbing ------------------------------------------------------------------------

    def emit(self, event: Event, accept: Callable[[], None] | None = None) -> list[Command]:
        commands = self.retire.handle(event)  # raises (and changes nothing) on bad input
        if accept is not None:
            accept()
        self.commands.run(commands)
        return commands

    def emit_batch(self, events: list[Event]) -> list[Command]:
        """Hand the core several events at once (``Retire.handle_batch``: the same decisions as
        one by one, all or nothing) and carry out every command it returns, in order."""
        commands = self.retire.handle_batch(events)
        self.commands.run(commands)
        return commands

    # ---- frames ---------------------------------------------------------------------------------

    def deliver_engine_frames(self, chunks: list[Chunk]) -> list[str]:
        """Each chunk crosses the engine boundary as a TOKEN frame, all decided in one batch: a
        published chunk joins its scope's consumer queue, a dropped one is counted against its
        version. Returns each frame's fate, ``"publish"`` or the drop reason."""
        token = FrameKind.TOKEN
        events = [FrameArrived(c.scope, c.version, next(self._frame_ids), token) for c in chunks]
        fates = _fates(self.emit_batch(list(events)))
        out = []
        for event, chunk in zip(events, chunks, strict=True):
            fate = fates[event.frame]
            if fate == "publish":
                self.queues[chunk.scope].append(chunk)
            else:
                rec = self.records[chunk.scope].version(chunk.version)
                rec.dropped_engine_tokens += len(chunk.token_ids)
            out.append(fate)
        return out

    def _on_output(self, out: Any, frames: list[Chunk] | None = None) -> None:
        """Record one ``RequestOutput``; its chunk is appended to ``frames`` (delivered at the
        engine boundary by the caller) or, without a list, delivered at once."""
        # RequestOutput carries the external id; map it back to the internal one.
        rid = out.request_id
        rid = self.internal_ids.get(rid, rid)
        completion = out.outputs[0]
        tokens = tuple(map(int, completion.token_ids))
        finished = out.finished
        ext = self.external.get(rid)
        if ext is not None:
            ext.token_ids.extend(tokens)
            if ext.num_cached_tokens is None:
                ext.num_cached_tokens = out.num_cached_tokens
            if finished:
                ext.finished = True
                ext.finish_reason = completion.finish_reason
            return
        req = self.reqs.get(rid)
        if req is None:
            return
        rec = req.record
        now = self.clock()
        rec.output_token_ids.extend(tokens)
        if rec.num_cached_tokens is None and out.num_cached_tokens is not None:
            rec.num_cached_tokens = int(out.num_cached_tokens)
        if tokens and rec.first_output_at is None:
            rec.first_output_at = now
        if finished:
            req.finished = True
            rec.finish_reason = completion.finish_reason
            rec.finished_at = now
        if tokens or finished:
            chunk = Chunk(req.scope, req.version, tokens, finished, completion.finish_reason)
            if frames is None:
                self.deliver_engine_frames([chunk])
            else:
                frames.append(chunk)
        if finished and completion.finish_reason != "abort":
            if frames:
                pending = list(frames)
                frames.clear()
                self.deliver_engine_frames(pending)
            self.commands.close_request(req, req.participants)

    # ---- pages ---------------------------------------------------------------------------------

    def _retain(self, req: FacadeRequest, bid: int, position: int, group: int) -> None:
        """The facade's side of an allocation the core accepted: the retention reference (the
        core's "held")."""
        self.ledger.retain(bid, req.scope, req.version, req.rid, position, req.salt, group)
        req.pages.append(bid)
        req.record.pages.append(bid)

    def _verify_drafts(self) -> None:
        drafts, self._drafts = self._drafts, []
        events, completed = observe.verify_drafts(
            drafts, self._refused, self.block_size, self.pages
        )
        if events:
            self.emit_batch(events)
        self._completed.extend(completed)

    def _close_completed_writers(self) -> None:
        completed, self._completed = self._completed, []
        self.commands.close_writers(completed)

    def _on_blocks_handed_out(self, ids: list[int]) -> None:
        """GenerationSpy listener: a block id we still retain, or gave back to vLLM's prefix
        cache (a finished version's), went to a new owner."""
        for bid in ids:
            if self.ledger.evicted(bid):  # a page given back to the cache: vLLM evicted it
                self.stats.cached_pages_evicted += 1
                self.emit(PageEvicted(bid))
                continue
            page = self.pages.get(bid)
            if page is None:
                continue
            core_page = self.retire.state.pages.get(bid)
            if core_page is None:
                continue
            if core_page.held or not core_page.full:
                raise IntegrationError(
                    f"block {bid}, held by {page.scope}@{page.version} for the core, was handed "
                    "to a new owner: a retention reference was lost"
                )
            # A pinned, retained page recycled underneath the core: its generation moves on, the
            # references we took are gone with it (the ledger sees the new generation).
            self.stats.pages_reused += 1
            self.emit(PageReused(bid))

    # ---- admission -----------------------------------------------------------------------------

    def _check_prefix_hit(self, req: FacadeRequest, tables: list[list[int]], start: int) -> None:
        n = start // self.block_size
        req.record.hit_block_ids = tuple(tuple(ids[:n]) for ids in tables)
        observe.check_prefix_hit(req.rid, tables, start, req.adopted, self.block_size)
        self.commands.release_handoff_pins(req)  # the successor's own references hold them now

    # ---- helpers -------------------------------------------------------------------------------

    def fingerprint_of(self, tenant: str) -> str:
        """The configuration fingerprint of ``tenant``'s pages on this engine."""
        return identity.fingerprint(
            model=self.model_id,
            dtype=self.dtype,
            block_size=self.block_size,
            tenant=tenant,
            tensor_parallel_size=self.tp,
        )

    def _prepare(
        self, scope: str, prompt: Sequence[int], contract: Contract, max_tokens: int, tenant: str
    ) -> tuple[Contract, tuple[int, ...], tuple[str, ...], identity.OutputNames]:
        """Check a request (raises before anything changes): the contract it runs under on this
        engine, its tokens, its block context and the names of its blocks past the context."""
        contract = engine_contract(contract, self.kv_windows)
        tokens = self._check_prompt(prompt, max_tokens)
        context, names = self._context(scope, tokens, contract, tenant)
        return contract, tokens, context, names

    def _context(
        self, scope: str, tokens: tuple[int, ...], contract: Contract, tenant: str
    ) -> tuple[tuple[str, ...], identity.OutputNames]:
        context, chain = identity.context_chain(
            tokens,
            tenant=tenant,
            scope=scope,
            numerical_mode=contract.numerical_mode,
            block_size=self.block_size,
        )
        return context, identity.OutputNames(chain)

    def _check_prompt(self, prompt: Sequence[int], max_tokens: int) -> tuple[int, ...]:
        """Refuse what vLLM would refuse *before* the core hears of it."""
        tokens = tuple(map(int, prompt))
        if not tokens:
            raise ValueError("empty prompt")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"max_tokens must be a positive int, got {max_tokens!r}")
        if len(tokens) + max_tokens > self.max_model_len:
            raise ValueError(
                f"{len(tokens)} prompt tokens + {max_tokens} exceed max_model_len "
                f"{self.max_model_len}"
            )
        return tokens


def _fates(commands: Iterable[Command]) -> dict[int, str]:
    """Frame id -> ``"publish"`` or the drop reason, read from the commands the core returned."""
    fates: dict[int, str] = {}
    for cmd in commands:
        if isinstance(cmd, Publish):
            fates[cmd.frame] = "publish"
        elif isinstance(cmd, Drop):
            fates[cmd.frame] = cmd.reason
    return fates
