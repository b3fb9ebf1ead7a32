"""The symbolic interpretation of the spec's expression vocabulary, over Z3.

``Symbolic`` implements ``retire_spec.expr.Interp`` with Z3 terms: the four sorts ``Scope``,
``Part``, ``Frame`` and ``Page`` are *uninterpreted* sorts (so a proof holds for any number of
them), every column is an array from its sort to a Boolean, an integer, a ``Scope`` element or a
context (itself an ``Int -> Int`` array), ``update_where`` is a Z3 ``Lambda`` and the
quantifiers are ``ForAll``/``Exists`` over a fresh bound variable. ``symbolic_state`` makes a
spec state whose cells are fresh array constants; ``initial_constraint`` is the initial state of
``retire_spec.schema`` as a constraint (columns whose initial value is a ``Scope`` slot or a
context are left free: a weaker assumption, hence sound); ``action_params`` makes fresh
constants for an action's parameters. The guards, effects and invariants evaluated over this
interpretation are the spec's own functions: nothing here restates the protocol. Proof
obligations live in ``proofs``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

import z3  # type: ignore[import-untyped]

from retire_spec.actions import Action
from retire_spec.schema import COLUMNS, FRAME_KINDS, Column, Kind, SpecState

_fresh = itertools.count()

# Integer columns whose initial value is a per-slot choice of the bounds (each scope's
# configuration fingerprint): any value is allowed initially.
FREE_AT_INIT = frozenset({"scope_fp"})


class Symbolic:
    """``Interp`` over Z3. One instance owns the sorts; states built with it share them."""

    def __init__(self, ctx: z3.Context | None = None) -> None:
        self.ctx = ctx or z3.main_ctx()
        self.sorts: dict[str, z3.SortRef] = {
            name: z3.DeclareSort(name, self.ctx) for name in ("Scope", "Part", "Frame", "Page")
        }
        self.ctx_sort = z3.ArraySort(z3.IntSort(self.ctx), z3.IntSort(self.ctx))

    # --- the vocabulary ----------------------------------------------------------------------
    def lit(self, value: int | bool) -> Any:
        if isinstance(value, bool):
            return z3.BoolVal(value, self.ctx)
        return z3.IntVal(value, self.ctx)

    def _b(self, x: Any) -> Any:
        return self.lit(x) if isinstance(x, bool) else x

    def and_(self, *xs: Any) -> Any:
        if not xs:
            return self.lit(True)
        return z3.And(*[self._b(x) for x in xs])

    def or_(self, *xs: Any) -> Any:
        if not xs:
            return self.lit(False)
        return z3.Or(*[self._b(x) for x in xs])

    def not_(self, x: Any) -> Any:
        return z3.Not(self._b(x))

    def implies(self, a: Any, b: Any) -> Any:
        return z3.Implies(self._b(a), self._b(b))

    def ite(self, c: Any, a: Any, b: Any) -> Any:
        return z3.If(self._b(c), a, b)

    def eq(self, a: Any, b: Any) -> Any:
        return a == b

    def lt(self, a: Any, b: Any) -> Any:
        return a < b

    def le(self, a: Any, b: Any) -> Any:
        return a <= b

    def add(self, a: Any, b: Any) -> Any:
        return a + b

    def get(self, column: Any, key: Any) -> Any:
        return z3.Select(column, key)

    def store(self, column: Any, key: Any, value: Any) -> Any:
        return z3.Store(column, key, value)

    def update_where(self, column: Any, sort: str, fn: Callable[[Any, Any], Any]) -> Any:
        x = self.fresh(sort, "u")
        return z3.Lambda([x], fn(x, z3.Select(column, x)))

    def forall(self, sort: str, fn: Callable[[Any], Any]) -> Any:
        x = self.fresh(sort, "a")
        return z3.ForAll([x], self._b(fn(x)))

    def exists(self, sort: str, fn: Callable[[Any], Any]) -> Any:
        x = self.fresh(sort, "e")
        return z3.Exists([x], self._b(fn(x)))

    # --- building states and parameters ----------------------------------------------------
    def fresh(self, sort: str, prefix: str) -> Any:
        return z3.Const(f"{prefix}{next(_fresh)}_{sort}", self.sorts[sort])

    def range_sort(self, col: Column) -> z3.SortRef:
        if col.kind is Kind.BOOL:
            return z3.BoolSort(self.ctx)
        if col.kind is Kind.INT:
            return z3.IntSort(self.ctx)
        if col.kind is Kind.SCOPE:
            return self.sorts["Scope"]
        return self.ctx_sort

    def column_sort(self, col: Column) -> z3.SortRef:
        return z3.ArraySort(self.sorts[col.sort], self.range_sort(col))

    def symbolic_state(self, tag: str) -> SpecState:
        """A state whose every column is a fresh array constant named ``<column>@<tag>``."""
        return SpecState(tuple(z3.Const(f"{c.name}@{tag}", self.column_sort(c)) for c in COLUMNS))

    def initial_constraint(self, st: SpecState) -> Any:
        """``st`` is the spec's initial state (up to the free columns named above)."""
        parts = []
        for col, cell in zip(COLUMNS, st.cells, strict=True):
            if col.kind in (Kind.BOOL, Kind.INT) and col.name not in FREE_AT_INIT:
                parts.append(cell == z3.K(self.sorts[col.sort], self.lit(col.initial)))
        return z3.And(*parts)

    def action_params(self, action: Action, tag: str) -> list[Any]:
        out = []
        for name, ptype in action.params:
            label = f"{action.name}.{name}@{tag}"
            if ptype in self.sorts:
                out.append(z3.Const(label, self.sorts[ptype]))
            elif ptype in ("Pos", "FrameKind", "Ver", "Name"):
                out.append(z3.Int(label, self.ctx))
            elif ptype == "Bool":
                out.append(z3.Bool(label, self.ctx))
            elif ptype == "Ctx":
                out.append(z3.Const(label, self.ctx_sort))
            else:  # pragma: no cover - a new parameter type must be added here
                raise ValueError(f"no symbolic domain for parameter type {ptype}")
        return out

    def param_domains(self, action: Action, params: Sequence[Any]) -> list[Any]:
        """The finite choices of the concrete checks (frame kinds, non-negative positions and
        versions), for runs that are to be replayed concretely. The induction proofs do not
        use them: they hold for any integer (a weaker assumption)."""
        out = []
        for (_, ptype), p in zip(action.params, params, strict=True):
            if ptype == "FrameKind":
                out.append(z3.Or(*[p == k for k in FRAME_KINDS]))
            elif ptype in ("Pos", "Ver"):
                out.append(p >= 0)
        return out

    def successor(self, st: SpecState, action: Action, params: Sequence[Any]) -> SpecState:
        return st.replace(action.effect(self, st, *params))

    def same(self, a: SpecState, b: SpecState) -> Any:
        """Column-wise equality of two symbolic states."""
        return z3.And(*[x == y for x, y in zip(a.cells, b.cells, strict=True)])


class FiniteSymbolic(Symbolic):
    """``Symbolic`` over a bounded universe, for bounded model checking: each sort is an
    enumeration of ``size`` elements, quantifiers expand into conjunctions and disjunctions and
    ``update_where`` into a chain of stores, so the queries are quantifier-free (model finding
    with quantifiers over uninterpreted sorts is slow). The induction proofs use ``Symbolic``."""

    def __init__(self, sizes: dict[str, int], ctx: z3.Context | None = None) -> None:
        self.ctx = ctx or z3.main_ctx()
        self.elements: dict[str, list[Any]] = {}
        self.sorts = {}
        for name in ("Scope", "Part", "Frame", "Page"):
            n = max(1, sizes.get(name, 1))
            sort, elems = z3.EnumSort(
                f"{name}{n}_{next(_fresh)}", [f"{name}{i}" for i in range(n)], ctx=self.ctx
            )
            self.sorts[name] = sort
            self.elements[name] = list(elems)
        self.ctx_sort = z3.ArraySort(z3.IntSort(self.ctx), z3.IntSort(self.ctx))

    def update_where(self, column: Any, sort: str, fn: Callable[[Any, Any], Any]) -> Any:
        out = column
        for e in self.elements[sort]:
            out = z3.Store(out, e, fn(e, z3.Select(column, e)))
        return out

    def forall(self, sort: str, fn: Callable[[Any], Any]) -> Any:
        return z3.And(*[self._b(fn(e)) for e in self.elements[sort]])

    def exists(self, sort: str, fn: Callable[[Any], Any]) -> Any:
        return z3.Or(*[self._b(fn(e)) for e in self.elements[sort]])
