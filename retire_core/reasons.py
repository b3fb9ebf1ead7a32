"""Why the core refused or undid something: the reason a ``Drop``, a fence, an ``Unpin`` or a
released pin carries, in commands and in the transition log.

One ``StrEnum`` per family, defined here only; every package names reasons through these. A
member *is* its value (``DropReason.RETIRED_DRAINING == "retired_draining"``, and so it prints
and serializes), so logs, reports and docs read the same strings as before.
"""

from __future__ import annotations

import enum


class DropReason(enum.StrEnum):
    """Why a frame of a version does not publish (``Drop``). The same classes tell why a launch
    of such a version is fenced as it starts (``fence``) and why its late ``AdoptionReport`` or
    ``VersionFinished`` changes nothing (``late_report``, ``late_finish``)."""

    SCOPE_CANCELLED = "scope_cancelled"  # the cancelled scope's last version
    VERSION_FINISHED = "version_finished"  # the version ran to its end
    RETIRED_DRAINING = "retired_draining"  # superseded; participants or pages of it remain
    RETIRED_DRAINED = "retired_drained"  # superseded and drained, still in the ledger
    RETIRED_EXPIRED = "retired_expired"  # superseded and drained, older than the ledger
    # ``publication_gate``'s own answer for any superseded version; ``ledger.classify_late``
    # turns it into one of the three above before it is logged
    RETIRED_VERSION = "retired_version"


class FenceReason(enum.StrEnum):
    """Why a write is refused (``FenceWrite``, logged as ``fence_write``): Rule 3."""

    PAGE_NOT_ALLOCATED = "page_not_allocated"
    PAGE_OF_ANOTHER_SCOPE = "page_of_another_scope"
    PAGE_OF_ANOTHER_VERSION = "page_of_another_version"
    WRITER_CLOSED = "writer_closed"


class ReleaseReason(enum.StrEnum):
    """Why a certified page fails the byte check at RESUME: its handoff pin is released
    (logged as ``release``), the page is not adopted and its part is recomputed."""

    PAGE_LOST = "page_lost"
    GENERATION_CHANGED = "generation_changed"
    DIGEST_MISMATCH = "digest_mismatch"


class UnpinReason(enum.StrEnum):
    """Why the handoff pins of a whole pending certificate are dropped (``Unpin``) before its
    byte check. An ``Unpin`` after the byte check carries the ``ReleaseReason`` instead."""

    SUPERSEDED_BEFORE_ADOPTION = "superseded_before_adoption"  # chain collapse
    CANCELLED = "cancelled"
