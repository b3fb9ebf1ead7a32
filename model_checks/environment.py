"""The nondeterministic environment: every move an engine or user may make in a bounded world.

``env_moves`` lists, for the current joint state of a ``Lockstep``, every legal move: user requests
(open, supersede, pause, unpause, cancel), engine behaviour (launch, receipt, emit a frame, deliver
any in-flight frame in any order, allocate, attempt a write anywhere — including into pages the
writer does not own, close a writer, corrupt a retained page, recycle a retained block id) and the
engine's answer to a pending byte check. ``Budget`` bounds the moves that would otherwise make the
world infinite (revisions per scope, faults). The Hypothesis state machine and the explorer both
draw from this one list.
"""

from __future__ import annotations

import attrs

from retire_checks.lockstep import Lockstep, Outcome
from retire_spec.actions import ActionInstance, param_domain
from retire_spec.schema import (
    ACTIVE,
    CANCELLED,
    IN_FLIGHT,
    PAUSED,
    UNOPENED,
)


@attrs.frozen(slots=True)
class Budget:
    faults: int = 1  # corrupt + reuse_id moves in one run
    frame_kinds: tuple[int, ...] = (0, 1, 2)
    partial_writes: bool = False
    reuse_choices: tuple[bool, ...] = (True, False)
    pause: bool = True
    cancel: bool = True


def env_moves(ls: Lockstep, budget: Budget = Budget()) -> list[ActionInstance]:
    b = ls.uni.bounds
    st = ls.spec
    A = ActionInstance
    moves: list[ActionInstance] = []
    modes, epochs = st["scope_mode"], st["scope_epoch"]
    for s in range(b.scopes):
        mode = modes[s]
        if mode == UNOPENED:
            for ctx in b.contexts:
                for reuse in budget.reuse_choices:
                    moves.append(A("open", (s, ctx, reuse)))
            continue
        if mode in (ACTIVE, PAUSED) and epochs[s] < b.max_epoch:
            for ctx in b.contexts:
                for reuse in budget.reuse_choices:
                    moves.append(A("supersede", (s, ctx, reuse)))
        if budget.pause and mode == ACTIVE and st["scope_admitted"][s]:
            moves.append(A("pause", (s,)))
        if mode == PAUSED:
            moves.append(A("unpause", (s,)))
        if budget.cancel and mode in (ACTIVE, PAUSED):
            moves.append(A("cancel", (s,)))
        if s in ls.pending_reports:
            moves.append(A("report", (s,)))
    used, closed = st["part_used"], st["part_closed"]
    running = [q for q in range(b.parts) if used[q] and not closed[q]]
    free_part = next((q for q in range(b.parts) if not used[q]), None)
    if free_part is not None:
        for s in range(b.scopes):
            if modes[s] == UNOPENED:
                continue
            for v in range(epochs[s] + 1):
                inst = A("launch", (free_part, s, v))
                if ls.spec_enabled(inst):
                    moves.append(inst)
    for q in running:
        moves.append(A("receipt", (q,)))
    free_frame = next((f for f in range(b.frames) if st["frame_state"][f] == 0), None)
    if free_frame is not None:
        for q in running:
            for k in budget.frame_kinds:
                moves.append(A("emit", (free_frame, q, k)))
    for f in range(b.frames):
        if st["frame_state"][f] == IN_FLIGHT:
            moves.append(A("deliver", (f,)))
    free_page = next((p for p in range(b.pages) if not st["page_alloc"][p]), None)
    for q in running:
        if free_page is not None:
            for i in param_domain("Pos", b):
                moves.append(A("allocate", (free_page, q, i)))
        for p in range(b.pages):
            if (st["page_alloc"][p] and st["page_writer"][p]) or st["page_alloc"][p] is False:
                for done in (True, False) if budget.partial_writes else (True,):
                    moves.append(A("attempt_write", (p, q, done)))
            elif st["page_alloc"][p]:
                moves.append(A("attempt_write", (p, q, True)))
    for p in range(b.pages):
        if st["page_alloc"][p] and st["page_writer"][p]:
            moves.append(A("close_writer", (p,)))
    if ls.faults < budget.faults:
        for p in range(b.pages):
            for name in ("corrupt", "reuse_id"):
                inst = A(name, (p,))
                if ls.spec_enabled(inst):
                    moves.append(inst)
    return moves


def apply_move(ls: Lockstep, move: ActionInstance) -> Outcome:
    if move.name == "report":
        return ls.report(move.args[0])
    return ls.env(move)


__all__ = ["CANCELLED", "Budget", "apply_move", "env_moves"]
