"""``Retire``: the object an engine embeds, in the style of h11's ``Connection``.

It holds the current immutable ``CoreState``, feeds each event through ``machine.step`` (or a
whole batch through ``machine.step_many``), writes exactly one structlog event per transition
taken (the lines trace validation reads), and returns the commands for the engine to carry out.
``snapshot``/``restore`` are O(1) (the state is immutable) and ``fingerprint`` is a canonical hash
of the whole state. No I/O beyond the log call, no clocks, no threads: the caller owns time and
concurrency.

The logger is resolved once and reused while structlog's configuration stays the same (a lazy
structlog proxy would otherwise assemble a new bound logger for every line); a logger that says
INFO is not enabled (``is_enabled_for``, as structlog's filtering loggers do) gets no calls at
all, so no log fields are built for it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

import structlog

from retire_core.commands import Command
from retire_core.events import Event
from retire_core.gates import revocation
from retire_core.machine import dispatch, run_batch
from retire_core.reasons import DropReason
from retire_core.state import CoreState, ScopeRecord
from retire_core.transitions import Transition
from retire_core.txn import Txn

LOGGER_NAME = "retire.core"


def _config_key() -> tuple[Any, ...]:
    """What structlog's default (lazy) logger is assembled from."""
    config = structlog.get_config()
    return (
        config["processors"],
        config["wrapper_class"],
        config["context_class"],
        config["logger_factory"],
    )


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
        # structlog's default logger is a lazy proxy: re-resolve it when structlog is reconfigured
        self._lazy = logger is None
        self._log_key: tuple[Any, ...] | None = None
        self._log_info: Any = None  # the bound ``info`` method, or None when INFO is off
        self._seq = 0
        self.last_transitions: tuple[Transition, ...] = ()

    @property
    def state(self) -> CoreState:
        return self._state

    def _info(self) -> Any:
        """The ``info`` to call for this call's lines (None: the logger drops INFO)."""
        if self._lazy:
            key = _config_key()
            if key != self._log_key:
                self._log_key = key
                self._log_info = _resolve(self._log.bind())
        elif self._log_key is None:
            self._log_key = ()
            self._log_info = _resolve(self._log)
        return self._log_info

    def _write(self, info: Any, transitions: Sequence[Transition], trigger: str) -> None:
        if info is None:
            self._seq += len(transitions)
            return
        for t in transitions:
            self._seq += 1
            info("retire.transition", seq=self._seq, trigger=trigger, **t.as_log())

    def handle(self, event: Event) -> list[Command]:
        """Apply one event. Raises a ``RetireError`` (and changes nothing) on bad input."""
        txn = Txn(self._state)  # ``machine.step``, without building a ``Step``
        dispatch(txn, event)
        self._state = txn.freeze()
        transitions = txn.transitions
        if transitions:
            self.last_transitions = tuple(transitions)
            self._write(self._info(), transitions, type(event).__name__)
        else:
            self.last_transitions = ()
        return txn.commands  # a fresh list, the caller's to keep

    def handle_batch(self, events: Iterable[Event]) -> list[Command]:
        """Apply several events in order, exactly as ``handle`` one by one would (the same final
        state, the same commands in the same order, the same transitions and log lines), paying
        the per-call cost once. If any event is bad input, its ``RetireError`` is raised and
        *nothing* of the batch takes effect: no state change, no log line. Afterwards
        ``last_transitions`` holds the transitions of the whole batch."""
        batch = events if type(events) is list or type(events) is tuple else list(events)
        # ``self._info()``, without the call once a given logger has been resolved
        info = self._log_info if self._log_key is not None and not self._lazy else self._info()
        if info is None:  # nobody reads the lines: no per-event counts, just the numbering
            txn = run_batch(self._state, batch)
            self._state = txn.freeze()
            transitions = txn.transitions
            self._seq += len(transitions)
            self.last_transitions = tuple(transitions)
            return txn.commands  # a fresh list, the caller's to keep
        counts: list[int] = []
        txn = run_batch(self._state, batch, counts)
        self._state = txn.freeze()
        transitions = txn.transitions
        self.last_transitions = tuple(transitions)
        i = 0
        for event, n in zip(batch, counts, strict=True):
            if n:
                self._write(info, transitions[i : i + n], type(event).__name__)
                i += n
        return txn.commands

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

    def revocation(self, scope: str, version: int) -> DropReason | None:
        """Why ``version`` of ``scope`` has lost its authority for good, or None while it is
        the scope's current version (``gates.revocation``)."""
        return revocation(self._state.scopes.get(scope), version)

    def pinned_pages(self) -> tuple[int, ...]:
        return tuple(sorted(p for p, r in self._state.pages.items() if r.pinned))


def _resolve(logger: Any) -> Any:
    """``logger.info``, or None when the logger reports that INFO is filtered out."""
    enabled = getattr(logger, "is_enabled_for", None)
    if callable(enabled) and not enabled(logging.INFO):
        return None
    return logger.info
