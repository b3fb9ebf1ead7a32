"""``Txn``: the scratch pad one core step (or one batch of steps) builds the next state in.

A step thaws the maps it needs (scopes into a plain dict, the page maps into mutations of their
trie), records every change as a ``Transition`` and every order to the engine as a command, and
freezes the result into a new ``CoreState``. The old state is never touched, which is what makes
a failed step (an error raised half-way) leave the core exactly as it was. Maps are thawed on
first use only: a map a step never looks at, or only reads, is handed on to the next state as
the same (already hashed) map, and a step that changes nothing hands back the very same state.
Protocol rules do not live here; only the bookkeeping of one step does.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Mapping
from types import MappingProxyType
from typing import Any

from immutables import MapMutation

from retire_core.commands import Command
from retire_core.frozen import FrozenMap, PageMap
from retire_core.ids import PageId, ScopeId, Version
from retire_core.state import CoreState, PageIndex, PageRecord, ScopeRecord
from retire_core.transitions import Column, Stage, Transition, pages_transition, transition


class PageDict:
    """The thawed page map: a ``MapMutation`` of the frozen state's ``PageMap`` (a write copies
    O(log n) trie nodes, never the whole map), plus what RECLAIM, ALIGN and the classification
    of late frames need to look at one scope instead of every page of the engine:

    * ``owned``: the ids of each scope's pages, each scope's as a ``PageMap`` of id -> None (a
      persistent set: a step that adds one page to a scope of 10,000 copies O(log n) trie
      nodes, not the scope's ids);
    * ``kinds``: per scope, how many of its pages have each (version, ``held``) pair, so that
      RECLAIM sees in a few lookups that a scope has no obsolete or unheld page (and a late
      frame whether its version still has pages) without reading the scope's pages;
    * ``changes``: how many writes could have made a page obsolete or unheld for RECLAIM (a new
      page, or a new owner, version or ``held`` flag), so that RECLAIM's check of a scope can
      be skipped while nothing it looks at has changed (``Txn.clean``). Removing a page never
      counts: it cannot make a clean scope unclean.

    A scope without pages has no entry in ``owned`` or ``kinds``: the index holds the scopes
    that own pages now, not every scope that ever did (a server that serves scopes for hours
    would otherwise copy an ever longer index on each step).

    The index of the state it was thawed from is shared scope by scope: a scope's ids are
    edited through a mutation of its map, and its counts copied on their first change; the next
    state keeps this one (``CoreState.page_index``), never written again."""

    __slots__ = ("_ids_edits", "_m", "_own_counts", "changes", "kinds", "owned")

    def __init__(self, index: PageIndex) -> None:
        """Thaw ``index``'s page map, sharing its ids and counts."""
        self._m: MapMutation[PageId, PageRecord] = index[0].mutate()
        self.changes = 0
        self.owned: dict[ScopeId, PageMap[PageId, None]] = dict(index[1])
        self.kinds: dict[ScopeId, dict[tuple[Version, bool], int]] = dict(index[2])
        # the scopes whose ids this step is editing (folded back into ``owned`` when read), and
        # the scopes whose counts this dict has its own copy of
        self._ids_edits: dict[ScopeId, MapMutation[PageId, None]] = {}
        self._own_counts: set[ScopeId] = set()

    def _ids(self, scope: ScopeId) -> MapMutation[PageId, None]:
        edits = self._ids_edits.get(scope)
        if edits is None:
            edits = self._ids_edits[scope] = self.owned.get(scope, _NO_IDS).mutate()
        return edits

    def owned_ids(self, scope: ScopeId) -> PageMap[PageId, None]:
        """The ids of ``scope``'s pages as they are now (a frozen map: later edits go to a new
        mutation and leave it alone)."""
        edits = self._ids_edits.pop(scope, None)
        if edits is not None:
            self._seal_ids(scope, edits)
        return self.owned.get(scope, _NO_IDS)

    def _seal_ids(self, scope: ScopeId, edits: MapMutation[PageId, None]) -> None:
        """Fold ``scope``'s edited ids back into ``owned``; a scope left without pages has no
        entry (the index must not grow with every scope that ever held a page)."""
        ids = edits.finish()
        if ids:
            self.owned[scope] = ids
        else:
            self.owned.pop(scope, None)

    def _count(self, scope: ScopeId, kind: tuple[Version, bool], delta: int) -> None:
        if scope in self._own_counts:
            counts = self.kinds[scope]
        else:
            self._own_counts.add(scope)
            counts = self.kinds[scope] = dict(self.kinds.get(scope, ()))
        left = counts.get(kind, 0) + delta
        if left:
            counts[kind] = left
        else:
            del counts[kind]
            if not counts:  # no page left: no entry (see ``_seal_ids``)
                del self.kinds[scope]
                self._own_counts.discard(scope)

    def __setitem__(self, key: PageId, value: PageRecord) -> None:
        m = self._m
        old = m.get(key)
        if (
            old is None
            or old.held is not value.held
            or old.version != value.version
            or old.owner != value.owner
        ):
            self.changes += 1
            owner = value.owner
            if old is not None:
                self._count(old.owner, (old.version, old.held), -1)
                if old.owner != owner:
                    self._ids(old.owner).pop(key, None)
                    self._ids(owner)[key] = None
            else:
                self._ids(owner)[key] = None
            self._count(owner, (value.version, value.held), 1)
        m[key] = value

    def __delitem__(self, key: PageId) -> None:
        old = self._m[key]
        del self._m[key]
        self._ids(old.owner).pop(key, None)
        self._count(old.owner, (old.version, old.held), -1)

    def __getitem__(self, key: PageId) -> PageRecord:
        return self._m[key]

    def get(self, key: PageId, default: PageRecord | None = None) -> PageRecord | None:
        return self._m.get(key, default)

    def __contains__(self, key: object) -> bool:
        return key in self._m

    def __len__(self) -> int:
        return len(self._m)

    def snapshot(self) -> PageMap[PageId, PageRecord]:
        """The pages as they are now, as a frozen map (edits after this go to a new mutation
        and leave it alone): what iterating a thawed map reads."""
        frozen = self._m.finish()
        self._m = frozen.mutate()
        return frozen

    def __iter__(self) -> Iterator[PageId]:
        return iter(self.snapshot())

    def keys(self) -> Iterable[PageId]:
        return self.snapshot().keys()

    def items(self) -> Iterable[tuple[PageId, PageRecord]]:
        return self.snapshot().items()

    def values(self) -> Iterable[PageRecord]:
        return self.snapshot().values()

    def finish(self) -> PageIndex:
        """Seal the map for the next state, with its index."""
        for scope, edits in self._ids_edits.items():
            self._seal_ids(scope, edits)
        self._ids_edits = {}
        return (self._m.finish(), self.owned, self.kinds)


_NO_IDS: PageMap[Any, None] = PageMap()


def build_index(pages: PageMap[PageId, PageRecord]) -> PageIndex:
    """The index of ``pages`` by a scan of every page (only for a map that came without one)."""
    owned: dict[ScopeId, dict[PageId, None]] = {}
    kinds: dict[ScopeId, dict[tuple[Version, bool], int]] = {}
    for p, page in pages.items():
        owned.setdefault(page.owner, {})[p] = None
        counts = kinds.setdefault(page.owner, {})
        kind = (page.version, page.held)
        counts[kind] = counts.get(kind, 0) + 1
    return (pages, {scope: PageMap(ids) for scope, ids in owned.items()}, kinds)


class Txn:
    __slots__ = (
        "_built",
        "_generations",
        "_ledger",
        "_pages",
        "_scopes",
        "clean",
        "commands",
        "rpages",
        "rscopes",
        "state",
        "transitions",
    )

    def __init__(self, state: CoreState) -> None:
        self.state = state
        self._scopes: dict[ScopeId, ScopeRecord] | None = None
        self._pages: PageDict | None = None
        self._generations: MapMutation[PageId, int] | None = None
        self._ledger: list[tuple[ScopeId, Version]] | None = None
        self._built: PageIndex | None = None  # the index of a state that came without one
        # Read views: the frozen maps until a map is thawed, the thawed one after. Writes go
        # through ``scopes`` / ``pages``; the scopes' view is read-only (a ``MappingProxyType``:
        # C-level reads, no write path into the old state).
        self.rscopes: Mapping[ScopeId, ScopeRecord] = state.scopes.view()
        self.rpages: Mapping[PageId, PageRecord] | PageDict = state.pages
        self.commands: list[Command] = []
        self.transitions: list[Transition] = []
        # RECLAIM's memo: scope -> (its record, the page view, that view's change count) when
        # RECLAIM last found nothing of the scope obsolete (see ``reclaim.reclaim``).
        self.clean: dict[ScopeId, tuple[ScopeRecord, Any, int]] = {}

    @property
    def ledger_size(self) -> int:
        return self.state.ledger_size

    # Each map is thawed the first time the step writes to it (or asks for it).

    @property
    def scopes(self) -> dict[ScopeId, ScopeRecord]:
        d = self._scopes
        if d is None:
            d = self._scopes = self.state.scopes.thaw()
            self.rscopes = MappingProxyType(d)
        return d

    @property
    def pages(self) -> PageDict:
        d = self._pages
        if d is None:
            d = self._pages = PageDict(self._index())
            self.rpages = d
        return d

    @property
    def generations(self) -> MapMutation[PageId, int]:
        d = self._generations
        if d is None:
            d = self._generations = self.state.generations.mutate()
        return d

    def _index(self) -> PageIndex:
        """The index of the frozen state's page map: the state's own, or (a state built or
        evolved by hand comes without a valid one) built once for this step."""
        index = self.state.page_index
        if index is not None and index[0] is self.state.pages:
            return index
        if self._built is None:
            self._built = build_index(self.state.pages)
        return self._built

    @property
    def ledger(self) -> list[tuple[ScopeId, Version]]:
        d = self._ledger
        if d is None:
            d = self._ledger = list(self.state.ledger)
        return d

    # Reads that do not thaw a map (a step that only reads leaves the map as it was).

    def read_scope(self, scope: ScopeId) -> ScopeRecord:
        """``self.scopes[scope]`` without thawing the map (KeyError if there is none)."""
        return self.rscopes[scope]

    def read_pages(self) -> Mapping[PageId, PageRecord] | PageDict:
        """``self.pages`` for reading only, without thawing the map."""
        return self.rpages

    def owned_pages(self, scope: ScopeId) -> Collection[PageId]:
        """The ids of the pages ``scope`` owns, in the current view (in no particular order),
        without scanning the others (see ``PageDict``)."""
        pages = self._pages
        if pages is not None:
            return pages.owned_ids(scope)
        return self._index()[1].get(scope, ())

    def page_kinds(self, scope: ScopeId) -> Collection[tuple[Version, bool]]:
        """The (version, ``held``) pairs of the pages ``scope`` owns, in the current view,
        without reading its pages (see ``PageDict``)."""
        pages = self._pages
        if pages is not None:
            return pages.kinds.get(scope, {}).keys()
        return self._index()[2].get(scope, {}).keys()

    def read_ledger(self) -> Any:
        """``self.ledger`` for reading only (a list or a tuple), without copying it."""
        d = self._ledger
        return d if d is not None else self.state.ledger

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
            transition(
                action,
                stage,
                scope,
                version,
                tuple(args.items()),
                tuple(changed.items()) if changed else (),
                reason,
            )
        )

    def record_pages(
        self,
        action: str,
        stage: Stage,
        scope: ScopeId,
        version: Version,
        pages: tuple[PageId, ...],
        changed: tuple[tuple[str, Any], ...] = (),
        columns: tuple[Column, ...] = (),
        reason: str | None = None,
    ) -> None:
        """One transition of ``action`` on each of ``pages`` in turn (``pages_transition``;
        nothing for no page): a revision certifies, adopts, unholds and frees thousands of
        pages of a long context in a few transitions. (A step on one page of its own, as an
        eviction, is ``record(..., page=p)``.)"""
        if pages:
            self.transitions.append(
                pages_transition(action, stage, scope, version, pages, columns, changed, reason)
            )

    def emit(self, command: Command) -> None:
        self.commands.append(command)

    def trim_ledger(self) -> None:
        """Bound the ledger as ``freeze`` does (between the events of one batch)."""
        ledger = self._ledger
        size = self.state.ledger_size
        if ledger is None:
            if len(self.state.ledger) <= size:
                return
            ledger = self.ledger
        if len(ledger) > size:
            del ledger[: len(ledger) - size]

    def freeze(self) -> CoreState:
        state = self.state
        if self._ledger is None and len(state.ledger) > state.ledger_size:
            self.trim_ledger()  # a hand-built state with an over-long ledger: bound it as always
        scopes, pages, generations, ledger = (
            self._scopes,
            self._pages,
            self._generations,
            self._ledger,
        )
        if scopes is None and pages is None and generations is None and ledger is None:
            return state
        size = state.ledger_size
        if pages is None:
            page_map, index = state.pages, self._index()
        else:
            index = pages.finish()
            page_map = index[0]
        return CoreState(
            state.scopes if scopes is None else FrozenMap.freeze(scopes),
            page_map,
            state.generations if generations is None else generations.finish(),
            state.ledger if ledger is None else (tuple(ledger[-size:]) if size else ()),
            size,
            index,
        )
