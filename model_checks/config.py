"""Bounded worlds for the explorer: ``Config`` (one world), ``Profile`` (a list of worlds with the
probes a run must hit) and ``new_lockstep``, the harness every search and replay of a world
starts from. What does not live here: the profiles themselves (``profiles``), the search
(``shard``, ``parallel``) and counterexamples (``counterexample``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

import retire_core as rc
from retire_checks.abstraction import Universe
from retire_checks.environment import Budget
from retire_checks.lockstep import Lockstep
from retire_checks.step_memo import StepMemo
from retire_spec.actions import Action
from retire_spec.invariants import INVARIANTS, Invariant
from retire_spec.schema import Bounds

StepFn = Callable[[rc.CoreState, Any], rc.Step]

# Moves by which the engine completes what was started; a state offering none is quiescent.
COMPLETION = frozenset({"receipt", "deliver", "close_writer", "report"})


@attrs.frozen(slots=True)
class Config:
    """One bounded world: spec bounds, environment budget, core ledger size."""

    name: str
    bounds: Bounds
    budget: Budget = attrs.field(factory=Budget)
    ledger_size: int = 1024
    max_states: int | None = None  # a cap; a capped run is reported as not exhaustive
    symmetry: bool = True
    # KV cache groups (``Universe``): the contracts' ``kv_windows`` and each page slot's group.
    kv_windows: tuple[int, ...] = (0,)
    page_groups: tuple[int, ...] = ()
    # One worker's seconds for this search in the last measured run (0: unknown); only orders
    # configurations that run side by side, longest first, so that the cores finish together.
    expected_seconds: float = attrs.field(default=0.0, eq=False)


@attrs.frozen(slots=True)
class Profile:
    name: str
    configs: tuple[Config, ...]
    required_probes: tuple[str, ...]


def new_lockstep(
    config: Config,
    step_fn: StepFn = rc.step,
    actions: dict[str, Action] | None = None,
    invariants: tuple[Invariant, ...] = INVARIANTS,
    *,
    record: bool = False,
    memo: StepMemo | None = None,
) -> Lockstep:
    return Lockstep(
        Universe.of(config.bounds, config.kv_windows, config.page_groups),
        step_fn=step_fn,
        invariants=invariants,
        actions=actions,
        ledger_size=config.ledger_size,
        record=record,
        check_each_step=record,
        memo=memo,
    )


__all__ = ["COMPLETION", "Config", "Profile", "StepFn", "new_lockstep"]
