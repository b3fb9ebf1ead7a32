"""The explicit-state explorer: every interleaving of the environment, over the real core.

``explore(config, jobs=N)`` runs a breadth-first search over the joint states of a ``Lockstep``
(the real ``retire_core`` and the spec side by side) whose successors are all the moves
``env_moves`` offers in a bounded world (``Config``: the spec ``Bounds``, the environment
``Budget`` and the core's ledger size). Each transition is checked by the lock-step harness
(every core transition must be a step the spec allows, commands must agree with transitions),
each *new* state once (the core's abstraction equals the spec's control columns, every invariant
holds), and every state in which the engine has nothing left to complete (no receipt, writer
closure, frame delivery or byte check pending) against ``QUIESCENCE`` — progress once revisions
stop, and no leak. States are stored as 64-bit fingerprints modulo symmetry (``symmetry``) in a
map to their parent, so a violation comes with a shortest path, which ``Counterexample`` replays
with a recording harness, prints as numbered steps and writes as a pytest file. Reachability
probes (``probes``) count how often each stage, transition, late-event classification and
protocol path was taken; a profile whose run misses a required probe is vacuous and fails.

The package's explorer is spread over modules, each with its own docstring: ``config`` (worlds
and profiles' types), ``probes``, ``shard`` (one worker's part of the search: the expansion of a
level), ``parallel`` (``explore``: the levels, over one process or several, fingerprint-
partitioned), ``counterexample`` (replay and rendering) and ``profiles`` (``QUICK``, ``FULL``,
``run_profile``). This module holds ``explore_spec``, the same search over the spec alone (every
action of ``ACTIONS``, the engine's and the core's alike), which is how spec-level mutants are
judged, and names everything the others offer. The CLI lives in ``cli_checks``.
"""

from __future__ import annotations

import time
from collections import Counter, deque

from retire_checks.abstraction import fast_canonical
from retire_checks.config import COMPLETION, Config, Profile, StepFn, new_lockstep
from retire_checks.counterexample import Counterexample, render_pytest, replay, replay_lines
from retire_checks.parallel import ExploreResult, Progress, explore
from retire_checks.probes import ALL_PROBES, ProbeTally, probe_hits, twin_page
from retire_checks.profiles import (
    ALL_KINDS,
    FULL,
    PROFILES,
    QUICK,
    TOKEN_ONLY,
    ProfileResult,
    run_profile,
)
from retire_checks.shard import without_cyclic_gc
from retire_spec.actions import ACTION_BY_NAME, Action, ActionInstance
from retire_spec.codegen import compiler
from retire_spec.invariants import INVARIANTS, Invariant
from retire_spec.schema import SpecState, initial_state


def explore_spec(
    config: Config,
    actions: dict[str, Action] | None = None,
    invariants: tuple[Invariant, ...] = INVARIANTS,
    max_states: int | None = None,
    max_generation: int = 3,
) -> ExploreResult:
    """Breadth-first search of the spec alone: every instance of every action (the engine's,
    the user's and the core's decisions), every invariant in every state. No symmetry. Like
    epochs in ``enabled``, ownership generations are capped at ``max_generation`` (recycled
    block ids would otherwise make the world infinite)."""
    with without_cyclic_gc():
        return _explore_spec(config, actions, invariants, max_states, max_generation)


def _explore_spec(
    config: Config,
    actions: dict[str, Action] | None,
    invariants: tuple[Invariant, ...],
    max_states: int | None,
    max_generation: int,
) -> ExploreResult:
    t0 = time.perf_counter()
    bounds = config.bounds
    table = tuple((actions or ACTION_BY_NAME).values())
    compiled = compiler(bounds)
    checks = [(inv.name, compiled.predicate(inv.holds)) for inv in invariants]
    init = initial_state(bounds)
    parents: dict[SpecState, tuple[SpecState, ActionInstance] | None] = {
        fast_canonical(init, bounds): None
    }
    queue: deque[tuple[SpecState, int]] = deque([(init, 0)])
    transitions = max_depth = 0
    hits: Counter[str] = Counter()
    violation = None
    cap = max_states if max_states is not None else config.max_states
    while queue and violation is None:
        st, depth = queue.popleft()
        key = fast_canonical(st, bounds)
        for inst, nxt in compiled.enabled(st, table):
            if any(g > max_generation for g in nxt["page_gen"]):
                continue
            transitions += 1
            hits[f"transition:{inst.name}"] += 1
            nkey = fast_canonical(nxt, bounds)
            if nkey in parents:
                continue
            parents[nkey] = (key, inst)
            max_depth = max(max_depth, depth + 1)
            broken = [name for name, holds in checks if not holds(nxt)]
            if broken:
                moves = [inst]
                link = parents[key]
                while link is not None:
                    key_, move = link
                    moves.append(move)
                    link = parents[key_]
                moves.reverse()
                violation = Counterexample(
                    config,
                    tuple(moves),
                    f"spec invariant(s) {broken} violated",
                    violated=tuple(broken),
                )
                break
            queue.append((nxt, depth + 1))
        if cap is not None and len(parents) >= cap:
            break
    return ExploreResult(
        config,
        len(parents),
        transitions,
        max_depth,
        time.perf_counter() - t0,
        0,
        violation is None and not queue,
        hits,
        violation,
    )


__all__ = [
    "ALL_KINDS",
    "ALL_PROBES",
    "COMPLETION",
    "FULL",
    "PROFILES",
    "QUICK",
    "TOKEN_ONLY",
    "Config",
    "Counterexample",
    "ExploreResult",
    "ProbeTally",
    "Profile",
    "ProfileResult",
    "Progress",
    "StepFn",
    "explore",
    "explore_spec",
    "new_lockstep",
    "probe_hits",
    "render_pytest",
    "replay",
    "replay_lines",
    "run_profile",
    "twin_page",
]
