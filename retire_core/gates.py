"""The two gates: may this frame publish, and may this write land.

``publication_gate`` is Rule 1 (current-version publication) for every frame kind — tokens on
their way to a consumer, scheduler commits, installed state: a frame passes only if its version
is the scope's current version at this moment and the scope holds authority (active or paused;
a cancelled scope and a finished version publish nothing more).
``write_gate`` is Rule 3 (retired-state isolation): a write lands only in a page owned by the
writer's own version whose writer is still open. Both return a decision and, when they refuse,
the reason that is logged with the drop or fence. ``revocation`` is the part of Rule 1 that
outlives a frame: whether a version has lost its authority for good, and why (an engine asks it
to end a request of such a version with the right reason). Nothing else in the core decides
these questions.
"""

from __future__ import annotations

from retire_core.events import FrameKind
from retire_core.ids import ParticipantId, ScopeId, Version
from retire_core.reasons import DropReason, FenceReason
from retire_core.state import PageRecord, ScopeRecord, ScopeState


def revocation(scope: ScopeRecord | None, version: Version) -> DropReason | None:
    """Why ``version`` has lost its authority for good: ``SCOPE_CANCELLED`` (its scope was
    cancelled; a scope the core no longer knows was cancelled before it was forgotten) or
    ``RETIRED_VERSION`` (a later version superseded it). None while it is its scope's current
    version, whatever the scope's state (a finished version was not revoked: its frames are
    refused by ``publication_gate`` because it ended)."""
    if scope is None or scope.state is ScopeState.CANCELLED:
        return DropReason.SCOPE_CANCELLED
    if version != scope.epoch:
        return DropReason.RETIRED_VERSION
    return None


def publication_gate(
    scope: ScopeRecord, version: Version, kind: FrameKind
) -> tuple[bool, DropReason | None]:
    """Rule 1. ``(True, None)`` to publish, ``(False, reason)`` to drop."""
    revoked = revocation(scope, version)
    if revoked is not None:
        return False, revoked
    if scope.state is ScopeState.FINISHED:
        return False, DropReason.VERSION_FINISHED
    return True, None


def write_gate(
    page: PageRecord | None, scope: ScopeId, version: Version, participant: ParticipantId
) -> tuple[bool, FenceReason | None]:
    """Rule 3. ``(True, None)`` to let the write land, ``(False, reason)`` to fence it."""
    if page is None:
        return False, FenceReason.PAGE_NOT_ALLOCATED
    if page.owner != scope:
        return False, FenceReason.PAGE_OF_ANOTHER_SCOPE
    if page.version != version:
        return False, FenceReason.PAGE_OF_ANOTHER_VERSION
    if not page.writer_open:
        return False, FenceReason.WRITER_CLOSED
    return True, None
