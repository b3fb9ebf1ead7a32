"""Events: what the engine (or the user, through it) tells the core.

Each event is a frozen attrs class with slots. User requests: ``Submit``, ``Supersede``, ``Pause``,
``Unpause``, ``Cancel``, ``Forget``. Engine observations: ``ParticipantStarted``, ``Receipt``,
``FrameArrived``, ``PageAllocated``, ``WriteAttempted``, ``DraftsVerified``, ``WriterClosed``,
``AdoptionReport``, ``PageReused``, ``PageEvicted``, ``VersionFinished``, ``VersionPreempted``.
Field validation (ids, contexts) happens here, at construction, so a malformed event never reaches
the state machine. What the core answers lives in ``commands``.
"""

from __future__ import annotations

import enum
from typing import Any

import attrs

from retire_core import ids
from retire_core.contract import DEFAULT_CONTRACT, Contract
from retire_core.ids import (
    BlockKey,
    FrameId,
    PageId,
    ParticipantId,
    ScopeId,
    TenantId,
    Version,
    check_block_key,
    check_context,
    check_name,
    check_number,
)


class FrameKind(enum.Enum):
    TOKEN = "token"  # generated tokens on their way to the consumer
    COMMIT = "commit"  # a scheduler step result about to be committed to request state
    INSTALL = "install"  # transferred or inherited state about to be installed


# Field validators. Each inlines the common case (a name already accepted, a non-negative
# int) and leaves everything else to the ``check_*`` helper, which raises the same errors as
# always: events are built several times per engine step.
_ACCEPTED = ids._ACCEPTED


def _scope(_: object, __: object, v: str) -> None:
    if v.__class__ is not str or v not in _ACCEPTED:
        check_name(v, "scope")


def _tenant(_: object, __: object, v: str) -> None:
    check_name(v, "tenant")


def _participant(_: object, __: object, v: str) -> None:
    if v.__class__ is not str or v not in _ACCEPTED:
        check_name(v, "participant")


def _version(_: object, __: object, v: int) -> None:
    if v.__class__ is not int or v < 0:
        check_number(v, "version")


def _page(_: object, __: object, v: int) -> None:
    if v.__class__ is not int or v < 0:
        check_number(v, "page")


def _group(_: object, __: object, v: int) -> None:
    if v.__class__ is not int or v < 0:
        check_number(v, "group")


def _frame(_: object, __: object, v: int) -> None:
    if v.__class__ is not int or v < 0:
        check_number(v, "frame")


def _context(_: object, __: object, v: tuple[BlockKey, ...]) -> None:
    check_context(v)


def _named_prefix(_: object, __: object, v: BlockKey | None) -> None:
    if v is not None:
        check_block_key(v)


_frame_kind = attrs.validators.instance_of(FrameKind)


def _kind(inst: object, attribute: Any, v: FrameKind) -> None:
    if v.__class__ is not FrameKind:
        _frame_kind(inst, attribute, v)  # raises attrs' usual TypeError


_is_bool = attrs.validators.instance_of(bool)


def _completes(inst: object, attribute: Any, v: bool) -> None:
    if v is not True and v is not False:
        _is_bool(inst, attribute, v)  # raises attrs' usual TypeError


@attrs.frozen(slots=True)
class Submit:
    """Open a scope at version 0 with its context (the prefix identity of each full block)."""

    scope: ScopeId = attrs.field(validator=_scope)
    tenant: TenantId = attrs.field(validator=_tenant)
    fingerprint: str = attrs.field(validator=attrs.validators.instance_of(str))
    context: tuple[BlockKey, ...] = attrs.field(validator=_context)
    contract: Contract = attrs.field(
        default=DEFAULT_CONTRACT, validator=attrs.validators.instance_of(Contract)
    )


@attrs.frozen(slots=True)
class Supersede:
    """Revision: the scope moves to the next version with a revised context (ADVANCE)."""

    scope: ScopeId = attrs.field(validator=_scope)
    context: tuple[BlockKey, ...] = attrs.field(validator=_context)
    contract: Contract = attrs.field(
        default=DEFAULT_CONTRACT, validator=attrs.validators.instance_of(Contract)
    )


@attrs.frozen(slots=True)
class Pause:
    scope: ScopeId = attrs.field(validator=_scope)


@attrs.frozen(slots=True)
class Unpause:
    scope: ScopeId = attrs.field(validator=_scope)


@attrs.frozen(slots=True)
class Cancel:
    scope: ScopeId = attrs.field(validator=_scope)


@attrs.frozen(slots=True)
class Forget:
    """Drop a cancelled scope's record once nothing of it is left (no participant running, no
    page, and, which only the caller can know, no frame of it still on its way): the core's
    state stays bounded on a server that opens scopes for days. The scope id is unknown
    afterwards, so a later ``Submit`` of it opens a new scope at version 0."""

    scope: ScopeId = attrs.field(validator=_scope)


@attrs.frozen(slots=True)
class ParticipantStarted:
    """The engine started a participant (request, cache group, rank) for a version."""

    scope: ScopeId = attrs.field(validator=_scope)
    version: Version = attrs.field(validator=_version)
    participant: ParticipantId = attrs.field(validator=_participant)


@attrs.frozen(slots=True)
class Receipt:
    """A participant has closed: it will neither write nor emit any more."""

    scope: ScopeId = attrs.field(validator=_scope)
    version: Version = attrs.field(validator=_version)
    participant: ParticipantId = attrs.field(validator=_participant)


@attrs.frozen(slots=True)
class FrameArrived:
    """A frame stamped (scope, version) reached a publication boundary."""

    scope: ScopeId = attrs.field(validator=_scope)
    version: Version = attrs.field(validator=_version)
    frame: FrameId = attrs.field(validator=_frame)
    kind: FrameKind = attrs.field(validator=_kind)


@attrs.frozen(slots=True)
class PageAllocated:
    """The engine gave page ``page`` to a participant, to hold block ``position`` of its context
    in KV cache group ``group`` (an index into the contract's ``kv_windows``)."""

    scope: ScopeId = attrs.field(validator=_scope)
    version: Version = attrs.field(validator=_version)
    participant: ParticipantId = attrs.field(validator=_participant)
    page: PageId = attrs.field(validator=_page)
    position: int = attrs.field(validator=_page)
    group: int = attrs.field(default=0, validator=_group)


@attrs.frozen(slots=True)
class WriteAttempted:
    """A participant is about to write KV into a page (the isolation gate decides);
    ``completes`` when this write fills the block. ``draft`` when the write holds speculative
    tokens not yet verified: the page is then complete only if ``DraftsVerified`` says so."""

    scope: ScopeId = attrs.field(validator=_scope)
    version: Version = attrs.field(validator=_version)
    participant: ParticipantId = attrs.field(validator=_participant)
    page: PageId = attrs.field(validator=_page)
    completes: bool = attrs.field(default=True, validator=_completes)
    draft: bool = attrs.field(default=False, validator=_completes)


@attrs.frozen(slots=True)
class DraftsVerified:
    """The target model verified the draft tokens written into ``page``: ``completes`` when the
    accepted tokens fill the block (rejected drafts leave it incomplete, to be rewritten)."""

    page: PageId = attrs.field(validator=_page)
    completes: bool = attrs.field(validator=_completes)


@attrs.frozen(slots=True)
class WriterClosed:
    """The page's writer closed at a safe boundary, with the digest of its bytes at that moment.

    ``prefix``: for a block past its version's context (the version's own output), the prefix
    identity of the tokens it holds, named by the engine that wrote them. The core keeps it only
    for a completed page whose version is still current and admitted (a later context may then
    inherit the block); otherwise the name is dropped and the page keeps the identity it had."""

    page: PageId = attrs.field(validator=_page)
    digest: str = attrs.field(validator=attrs.validators.instance_of(str))
    prefix: BlockKey | None = attrs.field(default=None, validator=_named_prefix)


@attrs.frozen(slots=True)
class PageDigest:
    page: PageId = attrs.field(validator=_page)
    digest: str = attrs.field(validator=attrs.validators.instance_of(str))


@attrs.frozen(slots=True)
class AdoptionReport:
    """The engine's reading of every certified page's bytes, taken just before installing them."""

    scope: ScopeId = attrs.field(validator=_scope)
    version: Version = attrs.field(validator=_version)
    digests: tuple[PageDigest, ...] = attrs.field(
        validator=attrs.validators.deep_iterable(attrs.validators.instance_of(PageDigest))
    )


@attrs.frozen(slots=True)
class PageEvicted:
    """The engine evicted a page the core gave back to its cache (``ReleaseToCache``) and is
    about to reuse the block."""

    page: PageId = attrs.field(validator=_page)


@attrs.frozen(slots=True)
class PageUnreferenced:
    """No participant of the page's version references the page any more, though the version
    still runs: vLLM's sliding window passed the block (no layer reads it again, and vLLM gives
    it back to its pool). Only for a completed page whose writer has closed. The page goes back
    to the engine's cache: a revision may still certify it, the engine may evict it."""

    page: PageId = attrs.field(validator=_page)


@attrs.frozen(slots=True)
class VersionFinished:
    """The version's work ran to its end (its request completed and was handed to the client):
    nothing of it publishes any more and its pages go back to the engine's cache."""

    scope: ScopeId = attrs.field(validator=_scope)
    version: Version = attrs.field(validator=_version)


@attrs.frozen(slots=True)
class VersionPreempted:
    """The engine preempted the version's work to make room (vLLM's preemption: it dropped
    every reference to the version's pages and will compute the version again from the start,
    as new participants). Reported once every participant of it has delivered its receipt and
    every writer of its pages has closed. The version keeps its authority; its pages are freed."""

    scope: ScopeId = attrs.field(validator=_scope)
    version: Version = attrs.field(validator=_version)


@attrs.frozen(slots=True)
class PageReused:
    """The engine observed a retained page's block id being recycled underneath the core."""

    page: PageId = attrs.field(validator=_page)


Event = (
    Submit
    | Supersede
    | Pause
    | Unpause
    | Cancel
    | Forget
    | ParticipantStarted
    | Receipt
    | FrameArrived
    | PageAllocated
    | WriteAttempted
    | DraftsVerified
    | WriterClosed
    | AdoptionReport
    | PageReused
    | PageEvicted
    | PageUnreferenced
    | VersionFinished
    | VersionPreempted
)
SCOPE_EVENTS: tuple[type, ...] = (
    Submit,
    Supersede,
    Pause,
    Unpause,
    Cancel,
    Forget,
    ParticipantStarted,
    Receipt,
    FrameArrived,
    PageAllocated,
    WriteAttempted,
    AdoptionReport,
    VersionFinished,
    VersionPreempted,
)
PAGE_EVENTS: tuple[type, ...] = (
    DraftsVerified,
    WriterClosed,
    PageReused,
    PageEvicted,
    PageUnreferenced,
)
