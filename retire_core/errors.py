"""The typed errors the core raises for bad input.

Every error here means the caller handed the core something it must not: an unknown scope, a
version from the future, a duplicate receipt, an event for a cancelled scope, a double free, a
malformed id, or an event that the scope's state does not accept. Raising one never changes the
core's state. Legitimately *late* events (work of a retired version still draining) are not
errors: the core classifies them and answers with a drop or a fence (see ``ledger``).
"""

from __future__ import annotations


class RetireError(Exception):
    """Base class: the input was rejected and the core's state is unchanged."""


class MalformedIdError(RetireError, ValueError):
    """An id of the wrong type or shape (empty string, negative page number, bool...)."""


class UnknownScopeError(RetireError, KeyError):
    """An event names a scope that was never submitted."""


class ScopeExistsError(RetireError):
    """A scope id is submitted a second time."""


class FutureVersionError(RetireError):
    """An event carries a version newer than the scope's current one."""


class ScopeCancelledError(RetireError):
    """A request (revision, pause, launch...) for a scope that was cancelled."""


class IllegalTransitionError(RetireError):
    """The scope's state does not accept this event (e.g. unpause of an active scope)."""

    def __init__(self, state: str, event: str, why: str) -> None:
        super().__init__(f"{event} is not accepted in state {state}: {why}")
        self.state = state
        self.event = event


class DuplicateReceiptError(RetireError):
    """A participant reported closure twice."""


class UnknownParticipantError(RetireError, KeyError):
    """An event names a participant that never started, or started under another version."""


class DuplicateParticipantError(RetireError):
    """A participant id is started a second time."""


class UnknownPageError(RetireError, KeyError):
    """An event names a page the core is not tracking."""


class PageInUseError(RetireError):
    """A page is allocated while the core still tracks it as allocated."""


class DoubleFreeError(RetireError):
    """A page is reported freed or reused after it was already released."""


class ContractError(RetireError, ValueError):
    """An execution contract or context that cannot be honoured (bad policy, bad lengths)."""


class ReportMismatchError(RetireError):
    """An adoption report that does not cover exactly the pages of the pending certificate."""


class TableViolationError(Exception):
    """A handler left its scope in a state its ``table.TABLE`` entry does not allow: a bug in
    the core, not bad input (so not a ``RetireError``). The step is discarded, as any failed
    step is: the core's state is unchanged."""

    def __init__(self, state: str, event: str, after: str, allowed: tuple[str, ...]) -> None:
        super().__init__(
            f"{event} in state {state} left the scope {after}; the table allows "
            + " | ".join(allowed)
        )
        self.state = state
        self.event = event
        self.after = after
