"""``Retire``: the object an engine embeds, in the style of h11's ``Connection``.

It holds the current immutable ``CoreState``, feeds each event through ``machine.step``, writes
exactly one structlog event per transition taken (the lines trace validation reads), and returns
the commands for the engine to carry out. ``snapshot``/``restore`` are O(1) (the state is
immutable) and ``fingerprint`` is a canonical hash of the whole state. No I/O beyond the log
call, no clocks, no threads: the caller owns time and concurrency.
"""

from __future__ import annotations

from typing import Any

import structlog

from retire_core.commands import Command
from retire_core.events import Event
from retire_core.machine import Step, step
from retire_core.state import CoreState, ScopeRecord
from retire_core.transitions import Transition

LOGGER_NAME = "retire.core"


class Retire:
    """One protocol instance: every scope, page and pending handoff of one engine."""

    def __init__(
        self,
        *,
        ledger_size: int = 1024,
        logger: Any | None = None,
        state: CoreState | None = None,
    ) -> None:
        self._state = state if state is not None else CoreState(ledger_size=ledger_size)
        self._log = logger if logger is not None else structlog.get_logger(LOGGER_NAME)
        self._seq = 0
        self.last_transitions: tuple[Transition, ...] = ()

    @property
    def state(self) -> CoreState:
        return self._state

    def handle(self, event: Event) -> list[Command]:
        """Apply one event. Raises a ``RetireError`` (and changes nothing) on bad input."""
        result: Step = step(self._state, event)
        self._state = result.state
        self.last_transitions = result.transitions
        for t in result.transitions:
            self._seq += 1
            self._log.info(
                "retire.transition", seq=self._seq, trigger=type(event).__name__, **t.as_log()
            )
        return list(result.commands)

    def snapshot(self) -> CoreState:
        return self._state

    def restore(self, state: CoreState) -> None:
        self._state = state

    def fingerprint(self) -> int:
        return hash(self._state)

    # --- read-only queries an engine needs --------------------------------------------------

    def scope(self, scope: str) -> ScopeRecord:
        return self._state.scopes[scope]

    def current_version(self, scope: str) -> int:
        return self._state.scopes[scope].epoch

    def pinned_pages(self) -> tuple[int, ...]:
        return tuple(sorted(p for p, r in self._state.pages.items() if r.pinned))
