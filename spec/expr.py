"""The expression vocabulary the spec is written in, and its concrete interpretation.

Guards, effects and invariants are ordinary Python functions that take an interpretation ``I`` as
their first argument and build every boolean, arithmetic and array expression through it
(``I.and_``, ``I.eq``, ``I.get``, ``I.store``, ``I.forall`` ...). ``Concrete`` evaluates them on
Python ints, bools and tuples (used by the core's refinement check, trace validation and the
explorer); ``retire_checks.z3_interp.Symbolic`` builds Z3 terms from the very same functions, so
there is one spec and no second hand-written model. Plain Python ``and``/``if`` on interpreted
values is forbidden in spec code for that reason: it would silently work concretely and break
symbolically.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

Val = Any


class Interp(Protocol):
    """Operations every interpretation provides; the spec uses nothing else."""

    def lit(self, value: int | bool) -> Val: ...
    def and_(self, *xs: Val) -> Val: ...
    def or_(self, *xs: Val) -> Val: ...
    def not_(self, x: Val) -> Val: ...
    def implies(self, a: Val, b: Val) -> Val: ...
    def ite(self, c: Val, a: Val, b: Val) -> Val: ...
    def eq(self, a: Val, b: Val) -> Val: ...
    def lt(self, a: Val, b: Val) -> Val: ...
    def le(self, a: Val, b: Val) -> Val: ...
    def add(self, a: Val, b: Val) -> Val: ...
    def get(self, column: Val, key: Val) -> Val: ...
    def store(self, column: Val, key: Val, value: Val) -> Val: ...
    def update_where(self, column: Val, sort: str, fn: Callable[[Val, Val], Val]) -> Val: ...
    def forall(self, sort: str, fn: Callable[[Val], Val]) -> Val: ...
    def exists(self, sort: str, fn: Callable[[Val], Val]) -> Val: ...


class Concrete:
    """Evaluates spec expressions on Python values.

    Columns are tuples indexed by the element number of their sort; ``sizes`` gives each sort's
    number of elements (the bounded universe of a concrete check).
    """

    __slots__ = ("sizes",)

    def __init__(self, sizes: dict[str, int]) -> None:
        self.sizes = sizes

    def lit(self, value: int | bool) -> Val:
        return value

    def and_(self, *xs: Val) -> Val:
        return all(xs)

    def or_(self, *xs: Val) -> Val:
        return any(xs)

    def not_(self, x: Val) -> Val:
        return not x

    def implies(self, a: Val, b: Val) -> Val:
        return (not a) or bool(b)

    def ite(self, c: Val, a: Val, b: Val) -> Val:
        return a if c else b

    def eq(self, a: Val, b: Val) -> Val:
        return a == b

    def lt(self, a: Val, b: Val) -> Val:
        return bool(a < b)

    def le(self, a: Val, b: Val) -> Val:
        return bool(a <= b)

    def add(self, a: Val, b: Val) -> Val:
        return a + b

    def get(self, column: Val, key: Val) -> Val:
        if 0 <= key < len(column):
            return column[key]
        return _OUTSIDE

    def store(self, column: Val, key: Val, value: Val) -> Val:
        items = list(column)
        items[key] = value
        return tuple(items)

    def update_where(self, column: Val, sort: str, fn: Callable[[Val, Val], Val]) -> Val:
        return tuple(fn(k, column[k]) for k in range(len(column)))

    def forall(self, sort: str, fn: Callable[[Val], Val]) -> Val:
        return all(fn(k) for k in range(self.sizes[sort]))

    def exists(self, sort: str, fn: Callable[[Val], Val]) -> Val:
        return any(fn(k) for k in range(self.sizes[sort]))


# Reading a context beyond its length yields a value no page prefix identity ever takes, so a
# page at that position can never match (the symbolic reading is an unconstrained array cell,
# which is the weaker, hence sound, assumption for the proofs).
_OUTSIDE = -(2**31)
