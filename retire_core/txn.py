"""``Txn``: the scratch pad one core step (or one batch of steps) builds the next state in.

A step thaws the maps it needs into plain dicts, records every change as a ``Transition`` and
every order to the engine as a command, and freezes the result into a new ``CoreState``. The old
state is never touched, which is what makes a failed step (an error raised half-way) leave the
core exactly as it was. Maps are thawed on first use only: a map a step never looks at is handed
on to the next state as the same (already hashed) ``FrozenMap``. Protocol rules do not live here;
only the bookkeeping of one step does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from retire_core.commands import Command
from retire_core.frozen import FrozenMap
from retire_core.ids import PageId, ScopeId, Version
from retire_core.state import CoreState, PageRecord, ScopeRecord
from retire_core.transitions import Stage, Transition


class Txn:
    __slots__ = (
        "_generations",
        "_ledger",
        "_pages",
        "_scopes",
        "commands",
        "ledger_size",
        "state",
        "transitions",
    )

    def __init__(self, state: CoreState) -> None:
        self.state = state
        self._scopes: dict[ScopeId, ScopeRecord] | None = None
        self._pages: dict[PageId, PageRecord] | None = None
        self._generations: dict[PageId, int] | None = None
        self._ledger: list[tuple[ScopeId, Version]] | None = None
        self.ledger_size = state.ledger_size
        self.commands: list[Command] = []
        self.transitions: list[Transition] = []

    # Each map is thawed into a plain dict the first time the step touches it.

    @property
    def scopes(self) -> dict[ScopeId, ScopeRecord]:
        d = self._scopes
        if d is None:
            d = self._scopes = self.state.scopes.thaw()
        return d

    @property
    def pages(self) -> dict[PageId, PageRecord]:
        d = self._pages
        if d is None:
            d = self._pages = self.state.pages.thaw()
        return d

    @property
    def generations(self) -> dict[PageId, int]:
        d = self._generations
        if d is None:
            d = self._generations = self.state.generations.thaw()
        return d

    @property
    def ledger(self) -> list[tuple[ScopeId, Version]]:
        d = self._ledger
        if d is None:
            d = self._ledger = list(self.state.ledger)
        return d

    # Reads that do not thaw a map (a step that only reads leaves the map as it was).

    def scope_record(self, scope: ScopeId) -> ScopeRecord | None:
        d = self._scopes
        return (d if d is not None else self.state.scopes).get(scope)

    def read_scope(self, scope: ScopeId) -> ScopeRecord:
        """``self.scopes[scope]`` without thawing the map (KeyError if there is none)."""
        d = self._scopes
        return (d if d is not None else self.state.scopes)[scope]

    def read_pages(self) -> Mapping[PageId, PageRecord]:
        """``self.pages`` for reading only, without thawing the map."""
        d = self._pages
        return d if d is not None else self.state.pages

    def read_page(self, page: PageId) -> PageRecord | None:
        """``self.pages.get(page)`` without thawing the map."""
        d = self._pages
        return (d if d is not None else self.state.pages).get(page)

    def record(
        self,
        action: str,
        stage: Stage,
        scope: ScopeId | None,
        version: Version | None,
        *,
        reason: str | None = None,
        changed: dict[str, Any] | None = None,
        **args: Any,
    ) -> None:
        self.transitions.append(
            Transition(
                action,
                stage,
                scope,
                version,
                tuple(args.items()),
                tuple(changed.items()) if changed else (),
                reason,
            )
        )

    def emit(self, command: Command) -> None:
        self.commands.append(command)

    def trim_ledger(self) -> None:
        """Bound the ledger as ``freeze`` does (between the events of one batch)."""
        ledger = self._ledger
        if ledger is None:
            if len(self.state.ledger) <= self.ledger_size:
                return
            ledger = self.ledger
        if len(ledger) > self.ledger_size:
            del ledger[: len(ledger) - self.ledger_size]

    def freeze(self) -> CoreState:
        state = self.state
        if self._ledger is None and len(state.ledger) > self.ledger_size:
            self.trim_ledger()  # a hand-built state with an over-long ledger: bound it as always
        scopes, pages, generations, ledger = (
            self._scopes,
            self._pages,
            self._generations,
            self._ledger,
        )
        if scopes is None and pages is None and generations is None and ledger is None:
            return state
        return CoreState(
            state.scopes if scopes is None else FrozenMap.freeze(scopes),
            state.pages if pages is None else FrozenMap.freeze(pages),
            state.generations if generations is None else FrozenMap.freeze(generations),
            state.ledger
            if ledger is None
            else (tuple(ledger[-self.ledger_size :]) if self.ledger_size else ()),
            self.ledger_size,
        )
