"""Commands: what the core tells the engine to do, in order.

Publication decisions (``Publish``, ``Drop``), fencing (``Fence`` asks the engine to stop a retired
version's participants and close their writers at the next safe boundary; ``AllowWrite`` /
``FenceWrite`` answer a write attempt), handoff (``PinCertified`` pins the certified prefix and asks
for a byte check; ``Adopt`` moves pinned pages to the successor; ``Unpin`` releases pins that will
not be adopted), admission (``Admit``) and reclamation (``Free``; ``ReleaseToCache`` for a finished
version's inheritable pages). Every command is a frozen attrs class with slots; the engine executes
them and reports what it observed back as events.
"""

from __future__ import annotations

import attrs

from retire_core.events import FrameKind
from retire_core.ids import BlockKey, FrameId, PageId, ParticipantId, ScopeId, Version
from retire_core.reasons import DropReason, FenceReason, ReleaseReason, UnpinReason


@attrs.frozen(slots=True)
class Publish:
    frame: FrameId
    scope: ScopeId
    version: Version
    kind: FrameKind


@attrs.frozen(slots=True)
class Drop:
    """Do not publish this frame: its version has no authority (``reason``, a ``DropReason``)."""

    frame: FrameId
    scope: ScopeId
    version: Version
    kind: FrameKind
    reason: DropReason


@attrs.frozen(slots=True)
class Fence:
    """Stop these participants of a retired version; report their receipts and closed writers."""

    scope: ScopeId
    version: Version
    participants: tuple[ParticipantId, ...]


@attrs.frozen(slots=True)
class AllowWrite:
    page: PageId
    participant: ParticipantId


@attrs.frozen(slots=True)
class FenceWrite:
    """Refuse this write (Rule 3); ``reason`` is a ``FenceReason``."""

    page: PageId
    participant: ParticipantId
    reason: FenceReason


@attrs.frozen(slots=True)
class CertEntry:
    page: PageId
    position: int
    generation: int
    prefix: BlockKey
    fingerprint: str
    digest: str
    group: int = 0


@attrs.frozen(slots=True)
class Certificate:
    scope: ScopeId
    version: Version
    entries: tuple[CertEntry, ...]

    @property
    def pages(self) -> tuple[PageId, ...]:
        return tuple(e.page for e in self.entries)


@attrs.frozen(slots=True)
class PinCertified:
    """Pin the certified pages and report their current digests (``AdoptionReport``)."""

    certificate: Certificate


@attrs.frozen(slots=True)
class Adopt:
    """Hand these pinned pages to the successor; its references replace the handoff pins."""

    scope: ScopeId
    version: Version
    pages: tuple[PageId, ...]


@attrs.frozen(slots=True)
class Unpin:
    """Drop the handoff pins of these pages, which will not be adopted: ``reason`` is an
    ``UnpinReason``, or the ``ReleaseReason`` of a failed byte check."""

    pages: tuple[PageId, ...]
    reason: UnpinReason | ReleaseReason


@attrs.frozen(slots=True)
class Admit:
    """Start the version: ``adopted_blocks`` leading blocks come from adopted pages, the rest is
    computed (the new suffix and anything that failed certification or verification)."""

    scope: ScopeId
    version: Version
    adopted_blocks: int
    cold: bool


@attrs.frozen(slots=True)
class Free:
    pages: tuple[PageId, ...]


@attrs.frozen(slots=True)
class ReleaseToCache:
    """A finished version's completed pages: drop every reference to them but keep them in the
    engine's prefix cache, where a later revision may still have them certified. The engine may
    evict them; it reports each eviction (``PageEvicted``) before the block is reused."""

    pages: tuple[PageId, ...]


Command = (
    Publish
    | Drop
    | Fence
    | AllowWrite
    | FenceWrite
    | PinCertified
    | Adopt
    | Unpin
    | Admit
    | Free
    | ReleaseToCache
)
