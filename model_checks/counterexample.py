"""Counterexamples: a shortest path from the initial state to a violation, replayed through the
real core with every check on (``replay``), printed as numbered steps (``Counterexample.steps``)
and written as a self-contained pytest module (``Counterexample.to_pytest``). What does not live
here: the searches that find them (``shard``, ``parallel``, ``explorer.explore_spec``).
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs

import retire_core as rc
from retire_checks.config import Config, StepFn, new_lockstep
from retire_checks.environment import apply_move, env_moves
from retire_checks.lockstep import Lockstep, RefinementError
from retire_spec.actions import Action, ActionInstance
from retire_spec.expr import Concrete
from retire_spec.invariants import QUIESCENCE


@attrs.frozen(slots=True)
class Counterexample:
    """A shortest path from the initial state to a violation, replayable through the core."""

    config: Config
    moves: tuple[ActionInstance, ...]
    error: str
    quiescence: bool = False  # the violation is a QUIESCENCE failure in the last state
    violated: tuple[str, ...] = ()  # invariant / quiescence names; empty: refinement failure

    def steps(self, step_fn: StepFn = rc.step, actions: dict[str, Action] | None = None) -> str:
        """The numbered step list, from a recording replay (core transitions indented)."""
        lines = replay_lines(self, step_fn, actions)
        return "\n".join(lines)

    def to_pytest(self, mutant: str | None = None) -> str:
        """A self-contained pytest module that replays this path and fails while the violation
        is present (with ``mutant``, inside that mutant of the catalogue)."""
        return render_pytest(self, mutant)


def replay(
    config: Config,
    moves: Iterable[ActionInstance],
    step_fn: StepFn = rc.step,
    actions: dict[str, Action] | None = None,
    check_quiescence: bool = False,
) -> Lockstep:
    """Replay ``moves`` through the real core and the spec with every check on; raises
    ``RefinementError`` at the first violation (including quiescence at the end, if asked).
    A move the environment can no longer make (the core now decides differently, so the path
    no longer exists) ends the replay without error."""
    ls = new_lockstep(config, step_fn, actions, record=True)
    ls.check_state()
    for move in moves:
        if move not in env_moves(ls, config.budget):
            return ls
        apply_move(ls, move)
    if check_quiescence:
        I = Concrete(config.bounds.sizes())
        broken = [q.name for q in QUIESCENCE if not q.holds(I, ls.spec)]
        if broken:
            raise RefinementError(f"quiescence property(ies) {broken} violated at the end")
    return ls


def replay_lines(
    cex: Counterexample, step_fn: StepFn = rc.step, actions: dict[str, Action] | None = None
) -> list[str]:
    ls = new_lockstep(cex.config, step_fn, actions, record=True)
    lines = []
    error = None
    for n, move in enumerate(cex.moves, 1):
        before = len(ls.trace)
        try:
            apply_move(ls, move)
        except RefinementError as err:
            error = str(err)
        new = ls.trace[before:]
        lines.append(f"{n:>3}. {move}")
        lines.extend(f"       {line.strip()}" for line in new[1:])
        if error is not None:
            break
    if error is None and cex.quiescence:
        I = Concrete(cex.config.bounds.sizes())
        broken = [q.name for q in QUIESCENCE if not q.holds(I, ls.spec)]
        error = f"quiescent state violates {broken}" if broken else None
    lines.append(f"  => {error or 'no violation on replay (' + cex.error + ')'}")
    return lines


def render_pytest(cex: Counterexample, mutant: str | None = None) -> str:
    b = cex.config.bounds
    budget = cex.config.budget
    moves = ",\n".join(f"    A({m.name!r}, {m.args!r})" for m in cex.moves)
    ctx = f"MUTANTS[{mutant!r}].active()" if mutant is not None else "contextlib.nullcontext()"
    mutant_import = "from retire_checks.mutants import MUTANTS\n" if mutant is not None else ""
    return f'''"""Counterexample found by the Retire explorer ({cex.config.name}).

Violation: {cex.error}
The test replays the shortest path through the real core and the spec with every check on; it
fails while the violation is present{" (inside mutant " + repr(mutant) + ")" if mutant else ""}.
"""

import contextlib

from retire_checks.environment import Budget
from retire_checks.explorer import Config, replay
{mutant_import}from retire_spec.actions import ActionInstance as A
from retire_spec.schema import Bounds

CONFIG = Config(
    {cex.config.name!r},
    Bounds(
        scopes={b.scopes},
        parts={b.parts},
        frames={b.frames},
        pages={b.pages},
        positions={b.positions},
        max_epoch={b.max_epoch},
        contexts={b.contexts!r},
        fingerprints={b.fingerprints!r},
    ),
    Budget(
        faults={budget.faults},
        frame_kinds={budget.frame_kinds!r},
        partial_writes={budget.partial_writes!r},
        reuse_choices={budget.reuse_choices!r},
        pause={budget.pause!r},
        cancel={budget.cancel!r},
        finish={budget.finish!r},
        forget={budget.forget!r},
        drafts={budget.drafts!r},
    ),
    ledger_size={cex.config.ledger_size},
    kv_windows={cex.config.kv_windows!r},
    page_groups={cex.config.page_groups!r},
)
MOVES = (
{moves},
)
CHECK_QUIESCENCE = {cex.quiescence!r}


def test_counterexample_replays_cleanly() -> None:
    with {ctx}:
        replay(CONFIG, MOVES, check_quiescence=CHECK_QUIESCENCE)
'''


__all__ = ["Counterexample", "render_pytest", "replay", "replay_lines"]
