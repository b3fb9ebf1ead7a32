"""The nondeterministic environment: every move an engine or user may make in a bounded world.

``env_moves`` lists, for the current joint state of a ``Lockstep``, every legal move: user requests
(open, supersede, pause, unpause, cancel, forget), engine behaviour (launch, receipt, a version's
end or its preemption reported for the current or an older version, emit a frame, deliver any
in-flight frame in any order, allocate, attempt a write anywhere — including into pages the writer
does not own — of verified or (``Budget.drafts``) of speculative draft tokens, verify a page's
drafts (accepted, rejected, repeated or late), close a writer, evict a page given back to its cache,
corrupt a retained page, recycle a retained block id, stop referencing a completed page
(``Budget.unreference``)) and the engine's answer to a pending byte check. The engine obeys the
core's commands (``engine``): it launches a participant only for a version an ``Admit`` started and
no ``Fence`` stopped since (a version that lost authority before any of its participants started was
never fenced: its request may still arrive, late; a pause may have overtaken it too), and allocates
only pages the core's ``Free`` gave back (or never had); only the budgeted faults break its word.
``Budget`` bounds the moves that would otherwise make the world infinite (revisions per scope,
faults). The Hypothesis state machine and the explorer both draw from this one list.
"""

from __future__ import annotations

import functools
from typing import Any

import attrs

from retire_checks.lockstep import Lockstep, Outcome
from retire_spec.actions import ActionInstance, param_domain
from retire_spec.schema import (
    ACTIVE,
    CANCELLED,
    COLUMN_INDEX,
    FINISHED,
    IN_FLIGHT,
    PAUSED,
    UNOPENED,
    Bounds,
)


@attrs.frozen(slots=True)
class Budget:
    faults: int = 1  # corrupt + reuse_id moves in one run
    frame_kinds: tuple[int, ...] = (0, 1, 2)
    partial_writes: bool = False
    reuse_choices: tuple[bool, ...] = (True, False)
    pause: bool = True
    cancel: bool = True
    finish: bool = True  # the engine reports versions finished (current and late ones)
    # the engine reports versions preempted (current and late ones): a preempted version's
    # pages are dropped, and it runs again as new participants
    preempt: bool = True
    # the engine stops referencing a completed, writer-closed page while its version runs (a
    # sliding window passing it), offered for every allocated page whose writer closed (one of a
    # version without authority is late; one unheld already, or incomplete, is refused)
    unreference: bool = False
    # forgetting cancelled scopes: a forgotten scope can open again, and every new incarnation
    # allocates pages anew, so generations grow without bound; runs bounded by their length
    # (Hypothesis) take it, the exhaustive explorer does not
    forget: bool = False
    # speculative decoding: write attempts of unverified draft tokens (gated by the core like
    # any write) and the target model's verification of a page's drafts, accepted or rejected,
    # offered on every allocated page (twice, or after its writer closed: late, a stutter)
    drafts: bool = False
    # a receipt delivered again: for a participant already closed, also once its version has
    # drained and moved to the core's ledger or expired from it (the core must refuse it with
    # ``DuplicateReceiptError``, or ``UnknownParticipantError`` past the ledger window, and
    # change nothing: ``Lockstep.receipt_again``)
    duplicate_receipts: bool = False


@attrs.frozen(slots=True)
class _Table:
    """Every move instance a world can offer, built once (moves are then shared objects, so the
    memo and dispatch tables of ``Lockstep`` compare them by identity)."""

    open: tuple[tuple[ActionInstance, ...], ...]
    supersede: tuple[tuple[ActionInstance, ...], ...]
    pause: tuple[ActionInstance, ...]
    unpause: tuple[ActionInstance, ...]
    cancel: tuple[ActionInstance, ...]
    forget: tuple[ActionInstance, ...]
    finish: tuple[tuple[ActionInstance, ...], ...]  # [s][v]
    preempt: tuple[tuple[ActionInstance, ...], ...]  # [s][v]
    preempt_now: tuple[ActionInstance, ...]  # [s]: the spec's action (the current version)
    report: tuple[ActionInstance, ...]
    launch: tuple[tuple[tuple[ActionInstance, ...], ...], ...]  # [q][s][v]
    receipt: tuple[ActionInstance, ...]
    receipt_again: tuple[ActionInstance, ...]
    emit: tuple[tuple[tuple[ActionInstance, ...], ...], ...]  # [f][q] -> kinds
    deliver: tuple[ActionInstance, ...]
    allocate: tuple[tuple[tuple[ActionInstance, ...], ...], ...]  # [p][q] -> positions
    write_any: tuple[tuple[tuple[ActionInstance, ...], ...], ...]  # [p][q], partial if allowed
    write_done: tuple[tuple[tuple[ActionInstance, ...], ...], ...]  # [p][q], completing only
    draft: tuple[tuple[tuple[ActionInstance, ...], ...], ...]  # [p][q]: filling or not
    verify: tuple[tuple[ActionInstance, ...], ...]  # [p]: accepted (fills) or rejected
    close_writer: tuple[tuple[ActionInstance, ...], ...]  # [p] -> names (NO_MATCH: none)
    evict: tuple[ActionInstance, ...]
    unreference: tuple[ActionInstance, ...]
    faults: tuple[tuple[ActionInstance, ...], ...]  # [p] -> corrupt, reuse_id


@functools.cache
def _table(b: Bounds, budget: Budget) -> _Table:
    A = ActionInstance
    S, Q, F, P = range(b.scopes), range(b.parts), range(b.frames), range(b.pages)
    requests = [(ctx, reuse) for ctx in b.contexts for reuse in budget.reuse_choices]
    dones = (True, False) if budget.partial_writes else (True,)
    return _Table(
        open=tuple(tuple(A("open", (s, c, r)) for c, r in requests) for s in S),
        supersede=tuple(tuple(A("supersede", (s, c, r)) for c, r in requests) for s in S),
        pause=tuple(A("pause", (s,)) for s in S),
        unpause=tuple(A("unpause", (s,)) for s in S),
        cancel=tuple(A("cancel", (s,)) for s in S),
        forget=tuple(A("forget", (s,)) for s in S),
        finish=tuple(tuple(A("finish", (s, v)) for v in range(b.max_epoch + 1)) for s in S),
        preempt=tuple(tuple(A("preempt", (s, v)) for v in range(b.max_epoch + 1)) for s in S),
        preempt_now=tuple(A("preempt", (s,)) for s in S),
        report=tuple(A("report", (s,)) for s in S),
        launch=tuple(
            tuple(tuple(A("launch", (q, s, v)) for v in range(b.max_epoch + 1)) for s in S)
            for q in Q
        ),
        receipt=tuple(A("receipt", (q,)) for q in Q),
        receipt_again=tuple(A("receipt_again", (q,)) for q in Q),
        emit=tuple(
            tuple(tuple(A("emit", (f, q, k)) for k in budget.frame_kinds) for q in Q) for f in F
        ),
        deliver=tuple(A("deliver", (f,)) for f in F),
        allocate=tuple(
            tuple(tuple(A("allocate", (p, q, i)) for i in param_domain("Pos", b)) for q in Q)
            for p in P
        ),
        write_any=tuple(
            tuple(tuple(A("attempt_write", (p, q, d)) for d in dones) for q in Q) for p in P
        ),
        write_done=tuple(tuple((A("attempt_write", (p, q, True)),) for q in Q) for p in P),
        draft=tuple(
            tuple(tuple(A("attempt_draft", (p, q, d)) for d in (True, False)) for q in Q) for p in P
        ),
        verify=tuple(tuple(A("verify_drafts", (p, d)) for d in (True, False)) for p in P),
        close_writer=tuple(
            tuple(A("close_writer", (p, t)) for t in param_domain("Name", b)) for p in P
        ),
        evict=tuple(A("evict", (p,)) for p in P),
        unreference=tuple(A("unreference", (p,)) for p in P),
        faults=tuple((A("corrupt", (p,)), A("reuse_id", (p,))) for p in P),
    )


def env_moves(ls: Lockstep, budget: Budget = Budget()) -> list[ActionInstance]:
    b = ls.uni.bounds
    t = _table(b, budget)
    cells = ls.spec.cells
    moves: list[ActionInstance] = []
    modes, epochs = cells[_MODE], cells[_EPOCH]
    pending = ls.pending_reports
    for s in range(b.scopes):
        mode = modes[s]
        if mode == UNOPENED:
            moves.extend(t.open[s])
            continue
        if mode in (ACTIVE, PAUSED, FINISHED) and epochs[s] < b.max_epoch:
            moves.extend(t.supersede[s])
        if budget.pause and mode == ACTIVE and cells[_ADMITTED][s]:
            moves.append(t.pause[s])
        if mode == PAUSED:
            moves.append(t.unpause[s])
        if budget.cancel and mode in (ACTIVE, PAUSED, FINISHED):
            moves.append(t.cancel[s])
        # forgetting a cancelled scope: only once nothing of it is left, frames on their way
        # included (what the core cannot see, the caller vouches for)
        if budget.forget and mode == CANCELLED and ls.spec_enabled(t.forget[s]):
            moves.append(t.forget[s])
        if budget.finish:
            # the current version's end, or a late (repeated, or superseded) report of one
            moves.extend(t.finish[s][: epochs[s] + 1])
        if budget.preempt:
            # a late report for an older version or an ended scope's; the current one's once
            # the engine can send it (its receipts in, its writers closed: the spec's ``preempt``)
            moves.extend(t.preempt[s][: epochs[s]])
            if mode in (CANCELLED, FINISHED) or ls.spec_enabled(t.preempt_now[s]):
                moves.append(t.preempt[s][epochs[s]])
        if s in pending:
            moves.append(t.report[s])
    used, closed = cells[_USED], cells[_CLOSED]
    running = [q for q in range(b.parts) if used[q] and not closed[q]]
    free_part = next((q for q in range(b.parts) if not used[q]), None)
    launchable = ls.launchable
    if free_part is not None and launchable:
        for s in range(b.scopes):
            if modes[s] == UNOPENED:
                continue
            versions = t.launch[free_part][s]
            if epochs[s] >= len(versions):  # only a mutant's spec steps get here
                versions = tuple(
                    ActionInstance("launch", (free_part, s, v)) for v in range(epochs[s] + 1)
                )
            for inst in versions[: epochs[s] + 1]:
                # the engine launches only for a version it was admitted to run and that was
                # not fenced since (``engine``); the spec's guard says the rest
                if (s, inst.args[2]) in launchable and ls.spec_enabled(inst):
                    moves.append(inst)
    for q in running:
        moves.append(t.receipt[q])
    if budget.duplicate_receipts:
        for q in range(b.parts):
            if used[q] and closed[q]:
                moves.append(t.receipt_again[q])
    frame_state = cells[_FRAME_STATE]
    free_frame = next((f for f in range(b.frames) if frame_state[f] == 0), None)
    if free_frame is not None:
        for q in running:
            moves.extend(t.emit[free_frame][q])
    for f in range(b.frames):
        if frame_state[f] == IN_FLIGHT:
            moves.append(t.deliver[f])
    alloc, writer = cells[_ALLOC], cells[_WRITER]
    free_page = next((p for p in range(b.pages) if not alloc[p]), None)
    for q in running:
        if free_page is not None:
            moves.extend(t.allocate[free_page][q])
        for p in range(b.pages):
            if (alloc[p] and writer[p]) or alloc[p] is False:
                moves.extend(t.write_any[p][q])
            elif alloc[p]:
                moves.extend(t.write_done[p][q])
            if budget.drafts:
                # drafts are written where verified tokens would be: anywhere (the gate decides;
                # into a page it fences, whether the drafts would fill it changes nothing)
                drafts = t.draft[p][q]
                moves.extend(drafts if alloc[p] and writer[p] else drafts[:1])
    for p in range(b.pages):
        if alloc[p] and writer[p]:
            moves.extend(t.close_writer[p])
        if budget.drafts and alloc[p]:
            # the target's verification, also when it is late (no drafts left, writer closed)
            moves.extend(t.verify[p])
        # only a page the core gave back to the cache (``ReleaseToCache``: ``engine.obey``
        # keeps the engine's cache equal to the pages nothing references or pins)
        if budget.finish and alloc[p] and not writer[p] and ls.spec_enabled(t.evict[p]):
            moves.append(t.evict[p])
        if budget.unreference and alloc[p] and not writer[p]:
            moves.append(t.unreference[p])
    if ls.faults < budget.faults:
        for p in range(b.pages):
            for inst in t.faults[p]:
                if ls.spec_enabled(inst):
                    moves.append(inst)
    return moves


_MODE, _EPOCH, _ADMITTED, _USED, _CLOSED, _FRAME_STATE, _ALLOC, _WRITER = (
    COLUMN_INDEX[name]
    for name in (
        "scope_mode",
        "scope_epoch",
        "scope_admitted",
        "part_used",
        "part_closed",
        "frame_state",
        "page_alloc",
        "page_writer",
    )
)


class _Recorder:
    """A stand-in for a ``Lockstep`` that answers ``env_moves``'s guard questions from the real
    harness and records them (``Offers``)."""

    __slots__ = ("asked", "faults", "launchable", "ls", "pending_reports", "spec", "uni")

    def __init__(self, ls: Lockstep) -> None:
        self.ls = ls
        self.uni = ls.uni
        self.spec = ls.spec
        self.pending_reports = ls.pending_reports
        self.faults = ls.faults
        self.launchable = ls.launchable
        self.asked: list[tuple[ActionInstance, bool]] = []

    def spec_enabled(self, inst: ActionInstance) -> bool:
        answer = self.ls.spec_enabled(inst)
        self.asked.append((inst, answer))
        return answer


class Offers:
    """``env_moves`` memoized on exactly what it reads. It reads eight columns of the spec state
    (scope modes, epochs and admission, participants used and closed, frame states, pages
    allocated and with an open writer), which scopes await a byte check, whether the fault
    budget is spent, the versions the engine may launch for, and the guards of the instances
    it asks ``spec_enabled`` about; which
    instances it asks about depends on the former alone. So the memo is keyed in two levels:
    the projection finds the instances asked about (recorded on the first call), their guards
    are evaluated in the current state, and projection plus answers find the move list (and
    whether it offers a completion move: a state offering none is quiescent)."""

    def __init__(self, budget: Budget, completion: frozenset[str], limit: int = 300_000) -> None:
        self.budget = budget
        self.completion = completion
        self.limit = limit
        self._asked: dict[tuple[Any, ...], tuple[ActionInstance, ...]] = {}
        self._moves: dict[tuple[Any, ...], tuple[list[ActionInstance], bool]] = {}

    def __call__(self, ls: Lockstep) -> tuple[list[ActionInstance], bool]:
        proj = self.projection(ls)
        asked = self._asked.get(proj)
        if asked is not None:
            enabled = ls.spec_enabled
            key = (proj, tuple([enabled(inst) for inst in asked]))
            found = self._moves.get(key)
            if found is not None:
                return found
        if len(self._moves) >= self.limit:
            self._moves.clear()
            self._asked.clear()
        recorder = _Recorder(ls)
        moves = env_moves(recorder, self.budget)  # type: ignore[arg-type]
        self._asked[proj] = tuple(inst for inst, _ in recorder.asked)
        key = (proj, tuple(answer for _, answer in recorder.asked))
        found = self._moves[key] = (moves, any(m.name in self.completion for m in moves))
        return found

    def projection(self, ls: Lockstep) -> tuple[Any, ...]:
        """Everything ``env_moves`` reads but the guards it asks about."""
        c = ls.spec.cells
        pending = ls.pending_reports
        return (
            c[_MODE],
            c[_EPOCH],
            c[_ADMITTED],
            c[_USED],
            c[_CLOSED],
            c[_FRAME_STATE],
            c[_ALLOC],
            c[_WRITER],
            tuple(pending) if pending else (),
            ls.faults < self.budget.faults,
            ls.launchable,
        )


def apply_move(ls: Lockstep, move: ActionInstance) -> Outcome:
    if move.name == "report":
        return ls.report(move.args[0])
    return ls.env(move)


__all__ = ["CANCELLED", "Budget", "Offers", "apply_move", "env_moves"]
