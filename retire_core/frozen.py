"""The immutable, hashable mappings the core's state is built from.

Every update returns a new map and never touches the old one, so a core state can be kept,
shared, compared and hashed freely: the explorer branches on it millions of times. The hash is
computed once and cached. ``FrozenMap`` (a dict inside, insertion-ordered) holds the small maps
whose order the core's commands follow (scopes, a scope's participants); ``PageMap``
(``immutables.Map``) the maps that grow with the engine's KV pool. Nothing protocol-specific
lives here.
"""

from __future__ import annotations

from collections.abc import ItemsView, Iterable, Iterator, KeysView, Mapping, ValuesView
from types import MappingProxyType
from typing import Any, Generic, TypeVar

from immutables import Map

K = TypeVar("K")
V = TypeVar("V")


class FrozenMap(Mapping[K, V], Generic[K, V]):
    __slots__ = ("_d", "_h", "_view")

    def __init__(self, items: Mapping[K, V] | Iterable[tuple[K, V]] = ()) -> None:
        self._d: dict[K, V] = dict(items)
        self._h: int | None = None
        # a read-only view of ``_d`` (``MappingProxyType``), made once, on first use
        self._view: Mapping[K, V] | None = None

    @classmethod
    def _own(cls, d: dict[K, V]) -> FrozenMap[K, V]:
        m: FrozenMap[K, V] = cls.__new__(cls)
        m._d = d
        m._h = None
        m._view = None
        return m

    def __getitem__(self, key: K) -> V:
        return self._d[key]

    def __iter__(self) -> Iterator[K]:
        return iter(self._d)

    def __len__(self) -> int:
        return len(self._d)

    def __contains__(self, key: object) -> bool:
        return key in self._d

    # Delegated to the dict: ``Mapping``'s defaults go through ``__getitem__`` key by key.
    def get(self, key: K, default: Any = None) -> Any:
        return self._d.get(key, default)

    def items(self) -> ItemsView[K, V]:
        return self._d.items()

    def keys(self) -> KeysView[K]:
        return self._d.keys()

    def values(self) -> ValuesView[V]:
        return self._d.values()

    def __hash__(self) -> int:
        if self._h is None:
            self._h = hash(frozenset(self._d.items()))
        return self._h

    def __eq__(self, other: object) -> bool:
        if isinstance(other, FrozenMap):
            return self._d == other._d
        return NotImplemented

    def __repr__(self) -> str:
        return f"FrozenMap({self._d!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled as its items alone: the cached hash is only valid in the process that
        # computed it (string hashes are salted per process).
        return (FrozenMap, (self._d,))

    def set(self, key: K, value: V) -> FrozenMap[K, V]:
        d = dict(self._d)
        d[key] = value
        return FrozenMap._own(d)

    def remove(self, key: K) -> FrozenMap[K, V]:
        d = dict(self._d)
        del d[key]
        return FrozenMap._own(d)

    def view(self) -> Mapping[K, V]:
        """The map's entries, read-only, at dict speed (``Txn``'s read view of a frozen map)."""
        view = self._view
        if view is None:
            view = self._view = MappingProxyType(self._d)
        return view

    def thaw(self) -> dict[K, V]:
        """A mutable copy, for building the next state inside one step."""
        return dict(self._d)

    @classmethod
    def freeze(cls, d: dict[K, V]) -> FrozenMap[K, V]:
        """Take ownership of ``d`` (the caller must not mutate it afterwards)."""
        return cls._own(d)


# The maps that grow with the engine's KV pool (pages, generations) are ``immutables.Map``s: a
# hash array mapped trie in C, whose updates copy O(log n) nodes and share the rest, so a step
# that changes one page of an engine with 100,000 pages does not copy the other 99,999 (a
# ``FrozenMap`` update copies its whole dict). Its iteration order is not insertion order; the
# core never depends on the order of pages. A step edits one through a ``MapMutation``
# (``PageMap.mutate()``) and seals it with ``finish()``; the old map is never touched.
PageMap = Map
