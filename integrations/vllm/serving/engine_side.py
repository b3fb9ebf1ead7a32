"""``EngineSide``: the version authority inside vLLM's engine-core process.

One ``retire_core.Retire`` per engine core, beside the scheduler (``RetireServingScheduler``
builds it; the first utility call attaches it to the ``EngineCore``). Utility calls (``call``,
answered by ``scope_calls.ScopeCalls``) are handled on the engine core's busy-loop thread between
steps, scheduler hooks inside them; a scoped request's ``open`` also reaches the ``open`` thread
(``early_opens``), which decides it while a step runs (``open_early``): the fenced versions'
terminal outputs leave at once, the rest of its commands are carried out at the busy loop's next
hook. Hooks and that thread take one lock, so the authority is never entered twice at once and
its commands are carried out in the order it gave them.

Each observation point (a hook: ``_hook`` counts its time in ``EngineTime`` and writes the core
log lines it made when it returns) builds its events, calls the core once (``decide``) and hands
the commands to the one non-re-entrant executor (``commands``:
``engine_commands.EngineCommands``, the serving side of ``executor.CommandExecutor``, which the
in-process facade shares); a caller that needs a frame's fate reads the ``Publish``/``Drop`` in
the commands it got back. Observation -> event:

* ``open`` (a scoped request arrives at the API process) -> ``Submit`` or ``Supersede``;
  ``pause``/``unpause``/``cancel`` -> the user events.
* a scoped request, sent right behind its ``open``, reaches the scheduler (``holds``: stamped
  with its version, put under its admission's cache salt, held until the ``Admit`` if that has
  not come) and, admitted, is added (``on_add_request``) -> ``ParticipantStarted`` for the
  request (and each TP rank).
* after ``Scheduler.schedule``: a block of a request's own that its sliding window passed ->
  ``PageUnreferenced`` (the page goes back to vLLM's cache); new block ids -> ``PageAllocated``;
  the blocks the step writes -> ``WriteAttempted`` (the write gate).
* before the commit: one ``COMMIT`` frame per scheduled request (the commit gate).
* after the commit: blocks the step filled -> ``WriterClosed(digest)`` (the digests the workers
  took within the step, ``step_digests``, else read now; a block past the version's context also
  names the prefix identity of its tokens, read from vLLM's request: ``executor.block_name``);
  each output of a managed request -> a ``TOKEN`` frame at the engine boundary (a dropped one
  never leaves the process);
  a finished request -> ``WriterClosed`` for its open blocks, then a ``Receipt`` per participant,
  then ``VersionFinished`` (its last frame was published: the version ran to its end).
* a request finished from outside (the client went away: vLLM's abort) -> the same closure, but
  no ``VersionFinished``: the scope keeps its pages for the revision that usually follows.
* vLLM hands out a block the core gave back to its cache -> ``PageEvicted``.
* vLLM preempts a managed request (inside its schedule, to give a block to another) -> the same
  closure, then ``VersionPreempted`` (the core frees the version's pages, so the blocks are free
  for that very allocation); once the schedule returns, ``ParticipantStarted`` for the request's
  new participants (it computes everything again, with no prefix hit).

Command -> action: see ``executor`` (what both hosts do) and ``engine_commands`` (what this
process adds: a fence's terminal output, an admission answering the pending ``open``).
"""

from __future__ import annotations

import functools
import itertools
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any, ParamSpec, TextIO, TypeVar

from retire_core import (
    Command,
    Drop,
    Event,
    Fence,
    FrameArrived,
    FrameKind,
    PageEvicted,
    PageReused,
    PageUnreferenced,
    ParticipantStarted,
    Retire,
    RetireError,
    ScopeState,
    VersionFinished,
)

from .. import introspect as ix
from .. import observe
from ..corelog import JsonLinesBuffer, NullLogger, engine_log_path
from ..errors import IntegrationError
from ..executor import participant_names
from . import wire
from .early_opens import FENCE_DIR_ENV, Copy, OpenCopies, OpenListener, address, copy_of
from .engine_commands import EngineCommands
from .ledger import BlockLedger
from .records import Admission, EngineTime, Histogram, ManagedRequest, ScopeInfo
from .scope_calls import Opening, ScopeCalls

if TYPE_CHECKING:
    from .step_digests import StepDigests

_P = ParamSpec("_P")
_R = TypeVar("_R")

#: Environment variable naming the file the core's transitions are written to (JSON lines).
LOG_ENV = "RETIRE_CORE_LOG"
#: How many data-parallel engine cores the server runs (``retire serve`` sets it): vLLM tells an
#: engine core of a dense model only its own index (it reconfigures each as an independent DP=1
#: engine), and every engine core writes its own log.
DP_SIZE_ENV = "RETIRE_DATA_PARALLEL_SIZE"
#: Bytes of core log lines the engine side's file holds before the OS gets them (between the
#: durable flushes: utility calls, shutdown).
LOG_BUFFER = 1 << 16


#: The hooks after which the engine core may have nothing left to run (a request finished).
MAY_GO_IDLE = frozenset({"commit", "finished_outside"})


def _hook(
    hook: str, *, boundary: bool = True, step_scheduled: bool = False
) -> Callable[[Callable[_P, _R]], Callable[_P, _R]]:
    """An ``EngineSide`` method vLLM calls (a hook). It runs under the engine side's lock (the
    ``open`` thread, ``open_early``, decides only between hooks); at a ``boundary`` (every hook
    but one vLLM calls while it is allocating a step's blocks) it first carries out the opens
    decided since the last hook (``step_scheduled``: the step is scheduled, not yet run, so a
    fence waits for its commit). Its time is counted in ``engine_time.hooks[hook]`` and the core
    log lines it made are written when it returns, made durable after a utility call (a client
    that saw its answer can read them) and when the engine has no request left (``idle``): vLLM
    kills the engine core at shutdown before the scheduler's ``shutdown`` runs, so an idle
    engine's log must already be on disk. A hook entered from inside another is part of the
    outer one (counted and written there)."""

    def wrap(method: Callable[_P, _R]) -> Callable[_P, _R]:
        @functools.wraps(method)
        def hooked(*args: _P.args, **kwargs: _P.kwargs) -> _R:
            side: EngineSide = args[0]  # type: ignore[assignment]
            with side.lock:
                clock = side.engine_time
                if clock.inside:
                    return method(*args, **kwargs)
                clock.inside = True
                began = time.perf_counter()
                try:
                    if boundary and side.early_tails:
                        side.carry_out_early(step_scheduled)
                    return method(*args, **kwargs)
                finally:
                    try:
                        if side.log.writes:  # else there is nothing to flush
                            side.log.flush(
                                durable=hook == "utility" or (hook in MAY_GO_IDLE and side.idle())
                            )
                    finally:
                        clock.inside = False
                        clock.hooks[hook] += time.perf_counter() - began

        return hooked

    return wrap


class EngineSide:
    def __init__(self, scheduler: Any) -> None:
        self.scheduler = scheduler
        self.engine_core: Any = None
        self.retire: Retire | None = None
        self._log_file: TextIO | None = None
        self.log: JsonLinesBuffer | NullLogger = NullLogger()  # the core's transition log
        self.reqs: dict[str, ManagedRequest] = {}
        self.by_participant: dict[str, str] = {}
        self.admissions: dict[tuple[str, int], Admission] = {}
        self.opening: dict[tuple[str, int], Future[dict[str, Any]]] = {}
        # the version each ``open`` made, by the opening id its request carries, until the
        # request arrives; and the requests that arrived before their version's ``Admit``
        self.pipelined: dict[str, tuple[str, int]] = {}
        self.held: dict[tuple[str, int], Any] = {}
        # which of an open's two copies decides it (``early_opens``); the opens the ``open``
        # thread decided whose commands wait for the busy loop's next hook, in the order decided
        self.copies: OpenCopies[Opening] = OpenCopies()
        self.early_tails: list[Opening] = []
        self.lock = threading.RLock()  # hooks and the ``open`` thread
        self.listener: OpenListener | None = None
        self.scopes: dict[str, ScopeInfo] = {}
        self._frame_ids = itertools.count()
        self._commands: EngineCommands | None = None  # the executor, once attached
        self._completed: list[int] = []
        # the last blocks of the requests whose step ends them by length (still partial)
        self._ending: list[int] = []
        self._drafts: list[observe.DraftWrite] = []  # the step's draft writes, until verified
        self._fencing: set[str] = set()  # requests this side is finishing itself
        # requests vLLM preempted in this schedule: managed again (new participants) after it
        self._preempted: list[ManagedRequest] = []
        # when the open being handled queued its first fence's terminal output (Server-Timing)
        self.first_fence_output: float | None = None
        self.counters: dict[str, int] = {}
        self.cleanup = Histogram()
        self.engine_time = EngineTime()
        self.calls = ScopeCalls(self)
        self.kv_windows: tuple[int, ...] = (0,)  # set on attach, one per KV cache group
        self.null_block = 0

    # ---- attach (first utility call) ------------------------------------------------------------

    @property
    def attached(self) -> bool:
        return self.retire is not None

    def attach(self, engine_core: Any) -> None:
        if self.retire is not None:
            return
        vcfg = engine_core.vllm_config
        self.engine_core = engine_core
        self.executor = engine_core.model_executor
        self.kvm = self.scheduler.kv_cache_manager
        self.pool = self.kvm.block_pool
        problems = self.executor.collective_rpc(
            ix.worker_kv_layout_problem, args=(int(self.pool.num_gpu_blocks),)
        )
        if any(problems):
            raise IntegrationError(
                "Retire cannot read this engine's KV blocks: "
                + "; ".join(f"rank {r}: {p}" for r, p in enumerate(problems) if p)
            )
        self.block_size = int(vcfg.cache_config.block_size)
        # One window per KV cache group (refuses groups Retire cannot certify, before attaching).
        self.kv_windows = observe.kv_windows(self.kvm, self.block_size)
        self.null_block = ix.null_block_id(self.kvm)
        self.tp = int(vcfg.parallel_config.tensor_parallel_size)
        self.model_id = Path(str(vcfg.model_config.model)).name
        self.dtype = str(vcfg.model_config.dtype).replace("torch.", "")
        log_path = os.environ.get(LOG_ENV)
        if log_path:
            pc = vcfg.parallel_config
            dp_size = int(os.environ.get(DP_SIZE_ENV) or pc.data_parallel_size)
            path = engine_log_path(log_path, int(pc.data_parallel_index), dp_size)
            self._log_file = open(path, "a", encoding="utf-8", buffering=LOG_BUFFER)  # noqa: SIM115
            self.log = JsonLinesBuffer(self._log_file)
        self.ledger = BlockLedger(self.pool)
        self.ledger.spy.listeners.append(self._on_blocks_handed_out)
        self.initial_free_blocks = int(self.pool.get_num_free_blocks())
        self.retire = Retire(logger=self.log)
        self._commands = EngineCommands(self)
        directory = os.environ.get(FENCE_DIR_ENV)
        if directory:
            engine = int(vcfg.parallel_config.data_parallel_index)
            self.listener = OpenListener(address(directory, engine), self.open_early)
            self.listener.start()

    @property
    def core(self) -> Retire:
        assert self.retire is not None, "the engine side is not attached"
        return self.retire

    @property
    def commands(self) -> EngineCommands:
        """The one executor of the core's commands (``executor.CommandExecutor``)."""
        assert self._commands is not None, "the engine side is not attached"
        return self._commands

    # ---- utility calls (from the API process): answered by ``ScopeCalls`` ------------------

    @_hook("utility")
    def call(self, engine_core: Any, op: str, payload: dict[str, Any]) -> Any:
        self.attach(engine_core)
        if op not in wire.OPS:
            return wire.refusal(ValueError(f"unknown Retire operation {op!r}"))
        if op == "attach":
            return {"ok": True, "block_size": self.block_size, "tp": self.tp}
        try:
            return getattr(self.calls, f"op_{op}")(payload)
        except RetireError as err:
            return wire.refusal(err)

    # ---- scheduler hooks ------------------------------------------------------------------------

    @_hook("add_request")
    def holds(self, request: Any) -> bool:
        """A scoped request reaches the engine core right behind its ``open`` (the API process
        sends both at once, on one ordered socket, so the request waits for the busy loop once,
        not once more after the open's answer): stamp it with its version; if that version is
        admitted, put it under the admission's cache salt and let the scheduler have it; if the
        admission waits (ALIGN waiting for the old version's writers, a byte check at a step
        boundary), keep it here until the ``Admit`` (``release_held``); if its open was
        refused, end it at once. True: the scheduler must not add it now."""
        opening = wire.opening_of(request)
        if opening is None:
            return False
        key = self.pipelined.pop(opening, None)
        if key is None:  # its open was refused (the API process answered with an error), or
            # this engine never saw it: it never runs, scoped or not
            self.count("unopened_requests")
            self.finish_from_here(request.request_id, request.client_index, wire.FINISH_CANCELLED)
            return True
        wire.stamp_version(request, key[1])
        admission = self.admissions.get(key)
        if admission is not None:
            ix.set_cache_salt(request, admission.salt)
            return False
        if self.core.revocation(*key) is not None:
            return False  # ``on_add_request`` ends it with the fence's reason
        self.held[key] = request
        self.count("requests_held")
        return True

    def release_held(self, scope: str, version: int) -> None:
        """The ``Admit`` of a version whose request arrived first: the scheduler gets it now."""
        request = self.held.pop((scope, version), None)
        if request is not None:
            ix.set_cache_salt(request, self.admissions[(scope, version)].salt)
            self.scheduler.add_request(request)

    def end_held(self, scope: str, version: int, reason: str) -> None:
        """A held request whose version lost authority before its ``Admit``: it ran nothing."""
        request = self.held.pop((scope, version), None)
        if request is not None:
            self.finish_from_here(request.request_id, request.client_index, reason)

    def drop_held(self, request_ids: str | Iterable[str] | None) -> None:
        """vLLM finished these requests (``None``: every request) from outside, as when their
        clients left: any of them still held goes."""
        if self.held:
            ids = {request_ids} if isinstance(request_ids, str) else request_ids
            ids = None if ids is None else set(ids)
            for key in [k for k, r in self.held.items() if ids is None or r.request_id in ids]:
                del self.held[key]
                self.count("abandoned_held_requests")

    # ---- opens decided while a step runs (the ``open`` thread) ------------------------------

    def open_early(self, payload: dict[str, Any]) -> None:
        """An ``open`` from the ``open`` socket (``early_opens``), on its own thread: decided
        now, between the busy loop's hooks (during the forward pass, or while the engine waits
        for input); the fenced versions' requests get their terminal outputs at once (the API
        process ends their streams), everything else the decision commands waits for the busy
        loop's next hook (``carry_out_early``). Its utility call, which always follows, answers
        with this decision; if that call came first, or the socket delivered this copy before,
        it changes nothing (``OpenCopies``)."""
        began = time.perf_counter()
        with self.lock:
            try:
                opening, copy = payload.get("opening"), copy_of(payload)
                if not isinstance(opening, str) or copy is None:
                    self.count("early_copies_malformed")
                    return
                lost = self.copies.lost
                taken = self.copies.take_copy(opening, *copy)
                if self.copies.lost > lost:  # utility calls that waited for a lost copy
                    self.count("early_copies_lost", self.copies.lost - lost)
                if taken is not Copy.DECIDES:
                    self.count("early_opens_late" if taken is Copy.LATE else "early_copies_twice")
                    return
                if self.retire is None:
                    self.copies.decided(opening, None)
                    return
                try:
                    decided = self.calls.decide_open(payload)
                except Exception:  # the utility call decides it again and answers the error
                    self.copies.decided(opening, None)
                    raise
                self.copies.decided(opening, decided)
                self.early_tails.append(decided)
                self.count("early_opens")
                self._announce_fences(decided)
            finally:
                self.engine_time.hooks["open_early"] += time.perf_counter() - began

    def _announce_fences(self, decided: Opening) -> None:
        """The terminal output of each request the decision fenced, now: the step in flight may
        still run them, but nothing of theirs leaves this process again (the commit and output
        gates drop it), and the ``Fence`` that finishes them in the scheduler comes with the
        rest of the commands."""
        in_step = self.commands.in_step
        for cmd in decided.commands:
            if not isinstance(cmd, Fence):
                continue
            reason = wire.finish_reason(self.core.revocation(cmd.scope, cmd.version))
            known = (self.by_participant.get(p) for p in cmd.participants)
            for rid in dict.fromkeys(r for r in known if r is not None):
                req = self.reqs.get(rid)
                if req is None or req.announced:  # closed, or fenced by an earlier decision
                    continue
                req.announced = True
                self.send_terminal(rid, req.client_index, reason)
                decided.timing.setdefault("fenced", time.time())
                self.count("fences_during_step" if in_step else "fences_between_steps")

    def carry_out_early(self, step_scheduled: bool) -> None:
        """At a hook of the busy loop: the commands of the opens the ``open`` thread decided
        since the last hook, in the order decided (``step_scheduled``: the step is scheduled and
        not run yet, so a fence waits for its commit, as one during its forward pass does)."""
        if step_scheduled:
            self.commands.in_step = True
        tails, self.early_tails = self.early_tails, []
        for decided in tails:
            self.calls.carry_out_open(decided)

    @_hook("add_request")
    def on_add_request(self, request: Any) -> None:
        """A request reached the scheduler: an admitted version's request starts its
        participants (the core answers with a Fence if the version lost authority meanwhile)."""
        admitted = wire.admitted_version(request)
        if admitted is None or self.retire is None:
            return
        scope, version = admitted
        rid = request.request_id
        admission = self.admissions.pop((scope, version), None)
        if admission is None:  # lost authority before its request arrived
            reason = wire.finish_reason(self.core.revocation(scope, version))
            self.finish_from_here(rid, request.client_index, reason)
            return
        participants = participant_names(rid, self.tp)
        req = ManagedRequest(
            rid,
            scope,
            version,
            participants,
            admission.salt,
            request.client_index,
            adopted=admission.adopted,
            handoff_pins=sorted(observe.table_pages(admission.adopted, self.null_block)),
            names=admission.names,
            request=request,
        )
        self.reqs[rid] = req
        for p in participants:
            self.by_participant[p] = rid
        self.count(
            "uncertified_hashes_evicted",
            observe.restrict_prefix_hit(self.pool, request, req.adopted, self.null_block),
        )
        started: list[Event] = [ParticipantStarted(scope, version, p) for p in participants]
        self.commands.run(self.decide(started))

    @_hook("schedule", boundary=False)  # inside vLLM's schedule, which is allocating blocks
    def on_preempted(self, request: Any) -> None:
        """vLLM preempted a managed request to make room (``CommandExecutor.preempt``); it is
        managed again under new participants once the schedule returns
        (``_restart_preempted``)."""
        rid = request.request_id
        req = self.reqs.get(rid)
        if req is None or rid in self._fencing or len(req.closed) == len(req.participants):
            return
        self.count("preemptions")
        # a step scheduled before this one may still be waiting for its commit (a batch queue):
        # the blocks it completes or ends must not be closed then under a new owner
        gone = set(req.pages)
        self._completed = [b for b in self._completed if b not in gone]
        self._ending = [b for b in self._ending if b not in gone]
        self.commands.preempt(req, request)
        self._preempted.append(req)

    def _restart_preempted(self) -> None:
        """Each request preempted in the schedule that just returned is managed again under new
        participants (``CommandExecutor.restart``)."""
        preempted, self._preempted = self._preempted, []
        for old in preempted:
            participants = participant_names(old.rid, self.tp, old.preemptions + 1)
            _, evicted = self.commands.restart(old, participants)
            self.count("uncertified_hashes_evicted", evicted)

    def forget_admission(self, scope: str, version: int, why: str) -> bool:
        """Drop the admission of a version whose request has not arrived, and the handoff pins of
        the blocks it adopted, which that request's own references would have replaced: its
        client left while the version was opened (``why``: ``abandoned``), or the version lost
        authority first (``revoked``: its request, if it comes, is finished with the fence's
        reason). Counted as ``<why>_admissions``. False: no such admission."""
        admission = self.admissions.pop((scope, version), None)
        if admission is None:
            return False
        for block in sorted(observe.table_pages(admission.adopted, self.null_block)):
            self.ledger.release_handoff(block)
        self.count(f"{why}_admissions")
        return True

    @_hook("schedule")
    def withheld(self, scheduler: Any) -> set[str]:
        if self.retire is None or not self.reqs:
            return set()
        scopes = self.core.state.scopes
        return {
            rid
            for rid, req in self.reqs.items()
            if scopes[req.scope].state is ScopeState.PAUSED
            and req.version == scopes[req.scope].epoch
        }

    @_hook("schedule", step_scheduled=True)
    def after_schedule(self, scheduler: Any, scheduler_output: Any) -> None:
        if not self.reqs and not self._preempted:
            return
        self.commands.in_step = True
        if self._preempted:
            self._restart_preempted()
        events, allocations, writes, first_time, self._drafts = observe.schedule_events(
            self.reqs, scheduler, scheduler_output, self.ledger.refs, self.block_size
        )
        for req, ids, start in first_time:
            self._check_prefix_hit(req, ids, start)
        if not events:
            return
        commands = self.decide(events)
        passed = sum(1 for e in events if type(e) is PageUnreferenced)
        if passed:
            self.count("window_blocks_passed", passed)
        for req, bid, idx, group in allocations:
            self.ledger.retain(bid, req.scope, req.version, req.rid, idx, req.salt, group)
            req.pages.append(bid)
        self.commands.run(commands)
        self._completed.extend(bid for _, bid, _, completes in writes if completes)
        requests = scheduler.requests
        self._ending = [
            bid
            for req, bid, _, completes in writes
            if not completes and observe.ends_by_length(requests[req.rid])
        ]

    @_hook("commit")
    def before_commit(self, scheduler: Any, scheduler_output: Any) -> set[str]:
        """The commit gate: one COMMIT frame per scheduled managed request; returns the requests
        whose commit was dropped."""
        frames: list[tuple[str, FrameArrived]] = []
        for rid in scheduler_output.num_scheduled_tokens:
            req = self.reqs.get(rid)
            if req is not None:
                frame = next(self._frame_ids)
                frames.append((rid, FrameArrived(req.scope, req.version, frame, FrameKind.COMMIT)))
        if not frames:
            return set()
        commands = self.decide([f for _, f in frames])
        dropped = {c.frame for c in commands if isinstance(c, Drop)}
        self.commands.run(commands)
        refused = {rid for rid, f in frames if f.frame in dropped}
        if refused:
            self.count("commits_dropped", len(refused))
        self._fencing |= refused  # finished by the commit path, closed by the deferred Fence
        return refused

    def blocks_to_digest(self) -> list[int]:
        """What the workers may digest within the step (``step_digests``): the blocks the
        scheduled step's writes complete (their writers close at its commit) and the last blocks
        of the requests it ends by length (theirs close when the request finishes, at the same
        commit)."""
        return sorted({*self._completed, *self._ending})

    @_hook("commit")
    def after_commit(self, outputs: dict[int, Any], answer: StepDigests | None = None) -> None:
        """Close the writers of the blocks the step filled (with the digests the workers took
        within the step, ``answer``, when it came back), gate each managed output at the engine
        boundary (a dropped one is removed: it never leaves this process), close finished
        requests, then carry out what the step boundary deferred."""
        step_digests: list[dict[int, str]] = []
        if answer is not None:  # the ranks digest side by side: the step waits for the slowest
            step_digests = answer.per_rank
            self.engine_time.worker_digest_seconds += max(answer.seconds, default=0.0)
        commands = self.commands
        commands.in_step = False
        if self._drafts:
            drafts, self._drafts = self._drafts, []
            events, completed = observe.verify_drafts(
                drafts, self._fencing, self.block_size, self.ledger.refs
            )
            # drafts of requests vLLM finished during the step (aborts it takes before the commit)
            closed = len(drafts) - len(events) - sum(d.rid in self._fencing for d in drafts)
            if closed:
                self.count("drafts_closed_during_step", closed)
            if events:
                commands.run(self.decide(events))
            self._completed.extend(completed)
        completed, self._completed = self._completed, []
        ending, self._ending = self._ending, []
        read: dict[int, str] = {}
        if step_digests:  # the blocks every rank digested (a draft's may not have been)
            taken = [b for b in {*completed, *ending} if all(b in r for r in step_digests)]
            read = observe.rank_digests(step_digests, taken)
        if completed:
            commands.close_writers(completed, read)
        if self.reqs:
            self._gate_outputs(outputs, read)
        self._fencing.clear()
        if commands.pending_reports:
            commands.send_reports(set())
        if commands.deferred:
            commands.run_deferred()

    @_hook("finished_outside")
    def on_finished_outside(self, requests: Iterable[Any]) -> None:
        """vLLM finished managed requests on its own (the API process aborted them: the client
        went away): their writers close and their participants deliver receipts."""
        for request in requests:
            req = self.reqs.get(request.request_id)
            if req is not None and request.request_id not in self._fencing:
                self.commands.close_request(req, req.participants)

    # ---- the engine boundary --------------------------------------------------------------------

    def _gate_outputs(self, outputs: dict[int, Any], read: Mapping[int, str]) -> None:
        frames: list[tuple[Any, Any, FrameArrived]] = []
        for eco in outputs.values():
            for out in eco.outputs:
                req = self.reqs.get(out.request_id)
                if req is None or (not out.new_token_ids and out.finish_reason is None):
                    continue
                if wire.fence_reason(out.stop_reason) is not None:
                    continue  # a fence's terminal output: already decided
                frame = FrameArrived(req.scope, req.version, next(self._frame_ids), FrameKind.TOKEN)
                frames.append((eco, out, frame))
        if not frames:
            return
        commands = self.decide([f for _, _, f in frames])
        dropped = {c.frame for c in commands if isinstance(c, Drop)}
        self.commands.run(commands)
        finished: list[ManagedRequest] = []
        for eco, out, frame in frames:
            if frame.frame in dropped:
                eco.outputs.remove(out)
                self.count("frames_dropped_engine")
                continue
            if out.finish_reason is not None:
                req = self.reqs.get(out.request_id)
                if req is not None:
                    finished.append(req)
        for req in finished:
            self.commands.close_request(req, req.participants, read)
            # its last frame was published: the version ran to its end
            self.commands.run(self.decide([VersionFinished(req.scope, req.version)]))

    # ---- the executor ---------------------------------------------------------------------------

    def decide(self, events: list[Event]) -> list[Command]:
        return self.core.handle_batch(events)  # raises (and changes nothing) on bad input

    # ---- requests, writers, receipts ------------------------------------------------------------

    def finish_from_here(
        self, rid: str, client_index: int, reason: str, *, announce: bool = True
    ) -> None:
        """Finish a request in the scheduler and (unless its terminal output was already sent:
        ``announce`` False) send the API process its terminal output, which names the fence."""
        from vllm.v1.request import RequestStatus

        request = self.scheduler.requests.get(rid)
        if request is not None and not request.is_finished():
            self._fencing.add(rid)
            try:
                self.scheduler.finish_requests([rid], RequestStatus.FINISHED_ABORTED)
            finally:
                self._fencing.discard(rid)
        if announce:
            self.send_terminal(rid, client_index, reason)

    def send_terminal(self, rid: str, client_index: int, reason: str) -> None:
        """The request's terminal output, naming the fence (the stream ends with ``reason``;
        nothing buffered is delivered), on the engine core's output queue (thread-safe: vLLM's
        output thread drains it)."""
        from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs, FinishReason

        terminal = EngineCoreOutput(
            request_id=rid,
            new_token_ids=[],
            finish_reason=FinishReason.ABORT,
            stop_reason=wire.STOP_MARK + reason,
        )
        self.engine_core.output_queue.put_nowait(
            (client_index, EngineCoreOutputs(outputs=[terminal]))
        )

    # ---- prefix hits of admitted versions -------------------------------------------------------

    def _check_prefix_hit(self, req: ManagedRequest, tables: list[list[int]], start: int) -> None:
        observe.check_prefix_hit(req.rid, tables, start, req.adopted, self.block_size)
        self.commands.release_handoff_pins(req)  # the successor's own references hold them now

    @_hook("schedule", boundary=False)  # vLLM is allocating the step's blocks
    def _on_blocks_handed_out(self, ids: list[int]) -> None:
        """A block id the ledger still retains went to a new owner underneath the core."""
        for bid in ids:
            if self.ledger.evicted(bid):  # a page given back to the cache: vLLM evicted it
                self.count("cached_blocks_evicted")
                self.commands.run(self.decide([PageEvicted(bid)]))
            elif bid in self.ledger.refs and bid in self.core.state.pages:
                page = self.core.state.pages[bid]
                if page.held or not page.full:
                    raise IntegrationError(f"block {bid} was recycled while retained")
                self.count("pages_reused")
                self.commands.run(self.decide([PageReused(bid)]))

    def idle(self) -> bool:
        """The scheduler holds no request that is not finished (nothing more to log until a
        request or a utility call arrives)."""
        return not self.scheduler.has_unfinished_requests()

    def shutdown(self) -> None:
        """The engine core is stopping (when vLLM lets it get this far): the core log's last
        lines go to the OS."""
        self.log.flush(durable=True)

    def count(self, name: str, n: int = 1) -> None:
        self.counters[name] = self.counters.get(name, 0) + n

    def sizes(self) -> dict[str, int]:
        """How many entries each structure of the core and of this side holds now. None may
        grow with the number of requests or scopes served: each is bounded by the KV pool
        (``blocks``), the core's ledger size, the scopes not forgotten yet or the requests in
        flight (the soak samples them; ``bounds`` gives the fixed bounds)."""
        core = self.core.state
        index = core.page_index
        return {
            "core_scopes": len(core.scopes),
            "core_participants": sum(len(r.participants) for r in core.scopes.values()),
            "core_pages": len(core.pages),
            "core_generations": len(core.generations),
            "core_ledger": len(core.ledger),
            "core_index_scopes": len(index[1]) + len(index[2]) if index is not None else 0,
            "scope_infos": len(self.scopes),
            "scope_info_versions": sum(
                len(i.adopted_blocks) + len(i.context_blocks) + len(i.names)
                for i in self.scopes.values()
            ),
            "requests": len(self.reqs),
            "participants": len(self.by_participant),
            "request_blocks": sum(
                len(r.tables) + len(r.pages) + len(r.handoff_pins) for r in self.reqs.values()
            ),
            "admissions": len(self.admissions),
            "openings": len(self.opening),
            "pipelined": len(self.pipelined),
            "held_requests": len(self.held),
            "early_openings": len(self.copies) + len(self.early_tails),
            "pending_work": self.commands.pending_work()
            + len(self._completed)
            + len(self._fencing),
            "ledger_refs": len(self.ledger.refs),
            "ledger_cached": len(self.ledger.cached),
            "spy_generations": len(self.ledger.spy.generation),
            "spy_evicted": len(self.ledger.spy.evicted),
            "spy_listeners": len(self.ledger.spy.listeners),
            "counters": len(self.counters),
            "scheduler_requests": len(self.scheduler.requests),
        }

    def bounds(self) -> dict[str, int]:
        """The fixed bounds of ``sizes``: the KV pool's blocks and the core's ledger size."""
        return {"blocks": int(self.pool.num_gpu_blocks), "core_ledger": self.core.state.ledger_size}
