"""``Txn``: the scratch pad one core step (or one batch of steps) builds the next state in.

A step thaws the maps it needs into plain dicts, records every change as a ``Transition`` and
every order to the engine as a command, and freezes the result into a new ``CoreState``. The old
state is never touched, which is what makes a failed step (an error raised half-way) leave the
core exactly as it was. Maps are thawed on first use only: a map a step never looks at, or only
reads, is handed on to the next state as the same (already hashed) ``FrozenMap``, and a step
that changes nothing hands back the very same state. Protocol rules do not live here; only the
bookkeeping of one step does.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from retire_core.commands import Command
from retire_core.frozen import FrozenMap
from retire_core.ids import PageId, ScopeId, Version
from retire_core.state import CoreState, PageRecord, ScopeRecord
from retire_core.transitions import Stage, Transition

_tuple_new = tuple.__new__


class PageDict(dict[PageId, PageRecord]):
    """The thawed page map. It counts the writes that could make a page obsolete or unheld for
    RECLAIM (a new page, or a new owner, version or ``held`` flag), so that RECLAIM's check of
    a scope can be skipped while nothing it looks at has changed (``Txn.clean``). Removing a
    page never counts: it cannot make a clean scope unclean. It also keeps the ids of each
    scope's pages (``owned``), so that RECLAIM, ALIGN and the classification of late frames look
    at one scope's pages instead of scanning every page of the engine. The index of the dict a
    frozen state was built in is shared with the next step's copy, scope by scope, and a
    scope's set is copied on its first change. A frozen state keeps the dict it was built in
    (it is never written again)."""

    # class defaults: unpickling fills the items before any instance state
    changes = 0
    owned: dict[ScopeId, set[PageId]] | None = None
    _copied: set[ScopeId] | None = None  # scopes whose set this dict has its own copy of

    @classmethod
    def thaw(cls, source: dict[PageId, PageRecord]) -> PageDict:
        """A copy of a frozen state's page dict, with its index (built if ``source`` has none:
        the empty initial map, or a hand-built one)."""
        d = cls(source)
        index = getattr(source, "owned", None)
        if index is not None:
            d.owned = dict(index)
            d._copied = set()
        else:
            built: dict[ScopeId, set[PageId]] = {}
            for p, page in source.items():
                built.setdefault(page.owner, set()).add(p)
            d.owned = built
            d._copied = set(built)
        return d

    def _scope_set(self, scope: ScopeId) -> set[PageId]:
        owned, copied = self.owned, self._copied
        assert owned is not None and copied is not None
        if scope in copied:
            return owned[scope]
        mine = owned[scope] = set(owned.get(scope, ()))
        copied.add(scope)
        return mine

    def __setitem__(self, key: PageId, value: PageRecord) -> None:
        old = self.get(key)
        if (
            old is None
            or old.held is not value.held
            or old.version != value.version
            or old.owner != value.owner
        ):
            self.changes += 1
            if self.owned is not None and (old is None or old.owner != value.owner):
                if old is not None:
                    self._scope_set(old.owner).discard(key)
                self._scope_set(value.owner).add(key)
        dict.__setitem__(self, key, value)

    def __delitem__(self, key: PageId) -> None:
        old = self[key]
        dict.__delitem__(self, key)
        if self.owned is not None:
            self._scope_set(old.owner).discard(key)

    def update(self, *args: Any, **kwargs: Any) -> None:
        for key, value in dict(*args, **kwargs).items():
            self[key] = value

    def setdefault(self, key: PageId, default: Any = None) -> Any:
        if key not in self:
            self[key] = default
        return self[key]

    def pop(self, key: PageId, *default: Any) -> Any:
        if key not in self and default:
            return default[0]
        value = self[key]
        del self[key]
        return value

    def __ior__(self, other: Any) -> PageDict:  # type: ignore[override,misc]
        self.update(other)
        return self


class Txn:
    __slots__ = (
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
        self._pages: dict[PageId, PageRecord] | None = None
        self._generations: dict[PageId, int] | None = None
        self._ledger: list[tuple[ScopeId, Version]] | None = None
        # Read views: the frozen maps' own dicts until a map is thawed, the thawed dict after.
        # Never write through these (writes go through ``scopes`` / ``pages``).
        self.rscopes: Mapping[ScopeId, ScopeRecord] = state.scopes._d
        self.rpages: Mapping[PageId, PageRecord] = state.pages._d
        self.commands: list[Command] = []
        self.transitions: list[Transition] = []
        # RECLAIM's memo: scope -> (its record, the page view, that view's change count) when
        # RECLAIM last found nothing of the scope obsolete (see ``reclaim.reclaim``).
        self.clean: dict[ScopeId, tuple[ScopeRecord, Mapping[PageId, PageRecord], int]] = {}

    @property
    def ledger_size(self) -> int:
        return self.state.ledger_size

    # Each map is thawed into a plain dict the first time the step writes to it (or asks for it).

    @property
    def scopes(self) -> dict[ScopeId, ScopeRecord]:
        d = self._scopes
        if d is None:
            d = self._scopes = self.state.scopes.thaw()
            self.rscopes = d
        return d

    @property
    def pages(self) -> dict[PageId, PageRecord]:
        d = self._pages
        if d is None:
            d = self._pages = PageDict.thaw(self.state.pages._d)
            self.rpages = d
        return d

    @property
    def generations(self) -> dict[PageId, int]:
        d = self._generations
        if d is None:
            d = self._generations = self.state.generations.thaw()
        return d

    @property
    def ledger(self) -> list[tuple[ScopeId, Version]]:
        d = self._ledger
        if d is None:
            d = self._ledger = list(self.state.ledger)
        return d

    # Reads that do not thaw a map (a step that only reads leaves the map as it was).

    def scope_record(self, scope: ScopeId) -> ScopeRecord | None:
        return self.rscopes.get(scope)

    def read_scope(self, scope: ScopeId) -> ScopeRecord:
        """``self.scopes[scope]`` without thawing the map (KeyError if there is none)."""
        return self.rscopes[scope]

    def read_pages(self) -> Mapping[PageId, PageRecord]:
        """``self.pages`` for reading only, without thawing the map."""
        return self.rpages

    def read_page(self, page: PageId) -> PageRecord | None:
        """``self.pages.get(page)`` without thawing the map."""
        return self.rpages.get(page)

    def owned_pages(self, scope: ScopeId) -> Collection[PageId]:
        """The ids of the pages ``scope`` owns, in the current view (in no particular order),
        without scanning the others when the view carries the index (see ``PageDict``)."""
        pages = self.rpages
        index = getattr(pages, "owned", None)
        if index is not None:
            return index.get(scope, ())  # type: ignore[no-any-return]
        return [p for p, page in pages.items() if page.owner == scope]

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
            _tuple_new(
                Transition,
                (
                    action,
                    stage,
                    scope,
                    version,
                    tuple(args.items()),
                    tuple(changed.items()) if changed else (),
                    reason,
                ),
            )
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
        return CoreState(
            state.scopes if scopes is None else FrozenMap.freeze(scopes),
            state.pages if pages is None else FrozenMap.freeze(pages),
            state.generations if generations is None else FrozenMap.freeze(generations),
            state.ledger if ledger is None else (tuple(ledger[-size:]) if size else ()),
            size,
        )
