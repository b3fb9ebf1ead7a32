"""The lock-step search's memo: caches of the pure functions it evaluates over and over.

``StepMemo`` only stores; what is cached, and when an entry may be reused, is decided by the
harness (``lockstep``) and the explorer's loop (``shard``) that read and fill it.
"""

from __future__ import annotations

from typing import Any

import retire_core as rc
from retire_checks.engine import Books, books_of
from retire_spec.actions import ActionInstance
from retire_spec.schema import SpecState


class StepMemo:
    """Caches of the pure functions a lock-step search evaluates over and over: the core's
    ``step`` on a (core state, event) pair (with the spec instances its transitions stand for,
    its commands already checked against them, and their compiled successor functions), spec
    effects on a (spec state, action instance) pair, the abstraction of a (core state,
    launched participants) pair and the engine's books of a core state. Sound because
    ``retire_core.step``, the spec and the abstraction are pure functions of their arguments;
    one memo serves one core and one action table (a mutant gets its own). Equal core and spec
    states are interned (one object each), so the hot tables are keyed by object identity:
    an entry keyed by ``id(x)`` always holds ``x`` itself, so the id cannot be reused by
    another object while the entry exists (a miss on an equal but distinct object only costs a
    recomputation). ``trim`` empties every cache once the memo holds ``limit`` entries."""

    __slots__ = (
        "abstract",
        "books",
        "cores",
        "events",
        "limit",
        "size",
        "spec",
        "specs",
        "tables",
    )

    def __init__(self, limit: int = 300_000) -> None:
        self.limit = limit
        self.size = 0  # entries added to the core tables since the last trim
        self.spec: dict[tuple[SpecState, ActionInstance], SpecState | None] = {}
        # validated core events by what they are built from: key -> (move, event, core table)
        self.events: dict[Any, tuple[Any, Any, dict[int, Any]]] = {}
        # core table of events that are not built from a move (byte-check reports)
        self.tables: dict[Any, dict[int, Any]] = {}
        # control columns of the abstraction, by (core state id, launched participants)
        self.abstract: dict[tuple[Any, ...], tuple[Any, tuple[Any, ...]]] = {}
        # one object per distinct core / spec state, so that memo hits compare by identity
        self.cores: dict[Any, Any] = {}
        # (keyed by the cells tuple: a C-level hash and comparison; equal cells, equal states)
        self.specs: dict[tuple[Any, ...], SpecState] = {}
        # the engine's books of a core state (``engine.books_of``), by the state's identity
        self.books: dict[int, tuple[Any, Books]] = {}

    def books_of(self, core: rc.CoreState) -> Books:
        # each entry holds its state, so the id is not reused while the entry exists
        found = self.books.get(id(core))
        if found is None:
            found = self.books[id(core)] = (core, books_of(core))
        return found[1]

    def trim(self) -> None:
        if self.size >= self.limit:
            self.events.clear()
            self.tables.clear()
            self.size = 0
        for cache in (self.spec, self.abstract, self.cores, self.specs, self.books):
            if len(cache) >= self.limit:
                cache.clear()
