"""``Txn``: the scratch pad one core step builds the next state in.

A step thaws the maps it needs into plain dicts, records every change as a ``Transition`` and
every order to the engine as a command, and freezes the result into a new ``CoreState``. The old
state is never touched, which is what makes a failed step (an error raised half-way) leave the
core exactly as it was. Protocol rules do not live here; only the bookkeeping of one step does.
"""

from __future__ import annotations

from typing import Any

from retire_core.commands import Command
from retire_core.frozen import FrozenMap
from retire_core.ids import PageId, ScopeId, Version
from retire_core.state import CoreState, PageRecord, ScopeRecord
from retire_core.transitions import Stage, Transition


class Txn:
    __slots__ = (
        "commands",
        "generations",
        "ledger",
        "ledger_size",
        "pages",
        "scopes",
        "transitions",
    )

    def __init__(self, state: CoreState) -> None:
        self.scopes: dict[ScopeId, ScopeRecord] = state.scopes.thaw()
        self.pages: dict[PageId, PageRecord] = state.pages.thaw()
        self.generations: dict[PageId, int] = state.generations.thaw()
        self.ledger: list[tuple[ScopeId, Version]] = list(state.ledger)
        self.ledger_size = state.ledger_size
        self.commands: list[Command] = []
        self.transitions: list[Transition] = []

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
                tuple((changed or {}).items()),
                reason,
            )
        )

    def emit(self, command: Command) -> None:
        self.commands.append(command)

    def freeze(self) -> CoreState:
        return CoreState(
            FrozenMap.freeze(self.scopes),
            FrozenMap.freeze(self.pages),
            FrozenMap.freeze(self.generations),
            tuple(self.ledger[-self.ledger_size :]) if self.ledger_size else (),
            self.ledger_size,
        )
