"""The core's state: scopes, participants, pages and the ledger of retired versions.

All of it is immutable (frozen attrs records and ``PageRecord`` named tuples inside
``FrozenMap``s and ``PageMap``s), so a whole ``CoreState`` can be snapshotted by keeping a
reference, restored by handing it back, and hashed canonically in constant time after the first
hash. ``ScopeState`` is the enum the transition table is keyed on. The rules that change this
state live in ``machine``, ``gates``, ``handoff`` and ``reclaim``.
"""

from __future__ import annotations

import enum
import operator
from typing import Any, NamedTuple, TypeVar

import attrs

from retire_core.commands import Certificate
from retire_core.contract import Contract
from retire_core.frozen import FrozenMap, PageMap
from retire_core.ids import BlockKey, PageId, ParticipantId, ScopeId, Version

_EMPTY: FrozenMap[object, object] = FrozenMap()
_EMPTY_PAGES: PageMap[Any, Any] = PageMap()


def _empty() -> FrozenMap[object, object]:
    return _EMPTY  # immutable, so one shared empty map serves every default


def _no_pages() -> PageMap[Any, Any]:
    return _EMPTY_PAGES


class ScopeState(enum.Enum):
    ACTIVE = "active"  # the current version is admitted and runs
    ALIGNING = "aligning"  # advanced; the successor waits for FENCE/ALIGN/RESUME
    PAUSED = "paused"  # the current version keeps authority; the engine runs no step of it
    CANCELLED = "cancelled"  # terminal: no successor, nothing publishes
    # the current version ran to its end: nothing more publishes, its pages go back to the
    # engine; a revision starts the next version (cold), a cancel ends the scope
    FINISHED = "finished"


@attrs.frozen(slots=True, cache_hash=True)
class ParticipantRecord:
    version: Version
    closed: bool = False


@attrs.frozen(slots=True, cache_hash=True)
class ScopeRecord:
    tenant: str
    fingerprint: str
    state: ScopeState
    epoch: Version
    admitted: bool
    context: tuple[BlockKey, ...]
    contract: Contract
    participants: FrozenMap[ParticipantId, ParticipantRecord] = attrs.field(factory=_empty)
    certificate: Certificate | None = None

    def running(self, version: Version) -> tuple[ParticipantId, ...]:
        return tuple(
            q for q, r in self.participants.items() if r.version == version and not r.closed
        )

    def drained(self, version: Version) -> bool:
        return all(r.closed for r in self.participants.values() if r.version == version)

    def has_authority(self, version: Version) -> bool:
        return version == self.epoch and self.state in (ScopeState.ACTIVE, ScopeState.PAUSED)


class PageRecord(NamedTuple):
    """One KV page the core tracks. A named tuple, not a frozen attrs record: a revision of a
    long context builds one per page certified, unheld or adopted (thousands), and a tuple is
    several times cheaper to build (see ``evolve``)."""

    owner: ScopeId
    version: Version
    participant: ParticipantId
    generation: int
    position: int
    prefix: BlockKey | None  # None: allocated for work without authority, never inheritable
    fingerprint: str
    writer_open: bool = True
    full: bool = False
    draft: bool = False  # holds speculative tokens not yet verified (never certifiable)
    digest: str | None = None
    held: bool = True
    pinned: bool = False
    group: int = 0  # the KV cache group (see ``Contract.kv_windows``)


# For the one ``pages`` map it was computed from (see ``CoreState``): each scope's page ids, and
# how many of its pages have each (version, ``held``) pair (see ``txn.PageDict``).
PageIndex = tuple[
    PageMap[PageId, PageRecord],
    dict[ScopeId, PageMap[PageId, None]],  # a persistent set of ids per scope
    dict[ScopeId, dict[tuple[Version, bool], int]],
]


@attrs.frozen(slots=True, cache_hash=True)
class CoreState:
    scopes: FrozenMap[ScopeId, ScopeRecord] = attrs.field(factory=_empty)
    pages: PageMap[PageId, PageRecord] = attrs.field(factory=_no_pages)
    generations: PageMap[PageId, int] = attrs.field(factory=_no_pages)
    ledger: tuple[tuple[ScopeId, Version], ...] = ()  # drained retired versions, newest last
    ledger_size: int = 1024
    # Derived, not part of the state's value (no equality, hash or repr): an index of each
    # scope's pages, with the very ``pages`` map it describes. ``Txn`` uses it only for that
    # map (a state built or evolved by hand gets its index built when a step needs it).
    page_index: PageIndex | None = attrs.field(default=None, eq=False, repr=False)


_R = TypeVar("_R", ScopeRecord, PageRecord, ParticipantRecord)
# Per attrs record class: a getter of every field in order, and each field's position.
_LAYOUT: dict[type, tuple[Any, dict[str, int]]] = {
    cls: (
        operator.attrgetter(*(a.name for a in attrs.fields(cls))),
        {a.name: i for i, a in enumerate(attrs.fields(cls))},
    )
    for cls in (ScopeRecord, ParticipantRecord)
}
_PAGE_FIELD = {name: i for i, name in enumerate(PageRecord._fields)}
_tuple_new = tuple.__new__


def evolve(record: _R, **changes: Any) -> _R:
    """``attrs.evolve`` (``_replace`` for a ``PageRecord``) for the core's state records (every
    field an ``__init__`` argument, no validators), several times cheaper: the core evolves a
    record on most steps, and one per page in a revision."""
    values: list[Any]
    if isinstance(record, PageRecord):
        values = list(record)
        for name, value in changes.items():
            values[_PAGE_FIELD[name]] = value
        return _tuple_new(PageRecord, values)
    cls = type(record)
    getter, index = _LAYOUT[cls]
    values = list(getter(record))
    for name, value in changes.items():
        values[index[name]] = value
    return cls(*values)
