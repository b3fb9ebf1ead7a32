"""Seeded random walks through the environment: a fast, deterministic lock-step check.

``random_walks`` runs many short random runs of ``env_moves`` against a core step function,
checking refinement and invariants after every step (through ``Lockstep``) and the quiescence
properties in every terminal state. It is cheaper than the Hypothesis machine and the explorer,
and reproducible from its seed; it returns the first failure with its trace, or ``None``.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import attrs

import retire_core as rc
from retire_checks.abstraction import Universe
from retire_checks.environment import Budget, apply_move, env_moves
from retire_checks.lockstep import Lockstep, RefinementError
from retire_spec.invariants import QUIESCENCE
from retire_spec.schema import Bounds

WALK_BOUNDS = Bounds(
    scopes=2,
    parts=3,
    frames=3,
    pages=3,
    positions=2,
    max_epoch=3,
    contexts=((1, 2), (1, 3), (1, 2), (4, 5)),
    fingerprints=(0, 1),
)


@attrs.frozen(slots=True)
class WalkFailure:
    seed: int
    error: str
    trace: tuple[str, ...]


def random_walks(
    step_fn: Callable[[rc.CoreState, Any], rc.Step] = rc.step,
    runs: int = 300,
    steps: int = 60,
    seed: int = 0,
    bounds: Bounds = WALK_BOUNDS,
    budget: Budget = Budget(faults=2, partial_writes=True),
) -> WalkFailure | None:
    uni = Universe.of(bounds)
    for run in range(runs):
        rng = random.Random(seed * 1_000_003 + run)
        ls = Lockstep(uni, step_fn=step_fn)
        ls.core = rc.CoreState(ledger_size=rng.choice((1, 8)))
        try:
            for _ in range(steps):
                moves = env_moves(ls, budget)
                if not moves:
                    broken = [i.name for i in QUIESCENCE if not i.holds(ls.I, ls.spec)]
                    if broken:
                        raise RefinementError(f"quiescence violated: {broken}")
                    break
                apply_move(ls, rng.choice(moves))
        except (RefinementError, rc.RetireError, AssertionError, KeyError) as err:
            return WalkFailure(run, f"{type(err).__name__}: {err}", tuple(ls.trace))
    return None
