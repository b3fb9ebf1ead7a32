"""The concrete interpretation, compiled: spec functions turned into straight-line Python.

``Codegen`` is a third interpretation of the vocabulary in ``expr`` whose values are Python source
fragments (``Src``). Running a guard, an effect or an invariant on it (with the action's
arguments fixed, the sorts' sizes fixed by the ``Bounds``) yields one expression: quantifiers and
``update_where`` unrolled over the bounded universe, ``get`` an index (with ``Concrete.get``'s
out-of-range value where the key is not known to be in range), ``store`` a tuple rebuild, ``and_``
and ``or_`` short-circuit operators that still yield bools. ``Compiler`` compiles that text once
per (bounds, function, arguments) and caches it by the identity of the spec function, so an
alternative action table (a spec mutant) is compiled from its own functions. The source of truth
stays the spec text: nothing here restates a guard, effect or invariant. Differences from
``Concrete``: operands after a false conjunct (true disjunct) and the branch ``ite`` does not
take are not evaluated, which only matters where ``Concrete`` would raise. A function the
generator cannot translate (Python control flow on an interpreted value raises ``TypeError``
here) falls back to ``Concrete``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from .actions import Action, ActionInstance, instances
from .expr import _OUTSIDE, Concrete, Val
from .schema import COLUMN_INDEX, COLUMNS, Bounds, SpecState

_NO_CONST = object()


class Src:
    """A Python expression. ``simple``: a name or literal (safe to repeat); ``boolean``: it
    evaluates to a bool; ``length``: the length of the tuple it evaluates to, when known."""

    __slots__ = ("boolean", "const", "length", "simple", "text")

    def __init__(
        self,
        text: str,
        *,
        boolean: bool = False,
        simple: bool = False,
        length: int | None = None,
        const: Any = _NO_CONST,
    ) -> None:
        self.text = text
        self.boolean = boolean
        self.simple = simple
        self.length = length
        self.const = const

    def __bool__(self) -> bool:
        raise TypeError("spec code branched on an interpreted value")

    def __eq__(self, other: object) -> bool:
        raise TypeError("spec code compared interpreted values with Python ==")

    __hash__ = None  # type: ignore[assignment]


def _const(value: Any) -> Src:
    length = len(value) if isinstance(value, tuple) else None
    return Src(
        f"({value!r})", boolean=isinstance(value, bool), simple=True, length=length, const=value
    )


def _as_bool(x: Src) -> str:
    return x.text if x.boolean else f"(True if {x.text} else False)"


class Codegen:
    """The vocabulary over Python source text (see the module docstring)."""

    def __init__(self, sizes: dict[str, int]) -> None:
        self.sizes = sizes
        self._names = itertools.count()

    def _fresh(self) -> str:
        return f"_t{next(self._names)}"

    def _src(self, x: Any) -> Src:
        if isinstance(x, Src):
            return x
        raise TypeError(f"spec code passed a Python value {x!r} where an expression belongs")

    def lit(self, value: int | bool) -> Val:
        return _const(value)

    def _junction(self, op: str, unit: bool, xs: tuple[Any, ...]) -> Src:
        srcs = [self._src(x) for x in xs]
        if not srcs:
            return _const(unit)
        text = "(" + f" {op} ".join(s.text for s in srcs) + ")"
        if all(s.boolean for s in srcs):
            return Src(text, boolean=True)
        return Src(f"(True if {text} else False)", boolean=True)

    def and_(self, *xs: Val) -> Val:
        return self._junction("and", True, xs)

    def or_(self, *xs: Val) -> Val:
        return self._junction("or", False, xs)

    def not_(self, x: Val) -> Val:
        return Src(f"(not {self._src(x).text})", boolean=True)

    def implies(self, a: Val, b: Val) -> Val:
        return Src(f"(not {self._src(a).text} or {_as_bool(self._src(b))})", boolean=True)

    def ite(self, c: Val, a: Val, b: Val) -> Val:
        sa, sb = self._src(a), self._src(b)
        return Src(
            f"({sa.text} if {self._src(c).text} else {sb.text})",
            boolean=sa.boolean and sb.boolean,
        )

    def _compare(self, op: str, a: Val, b: Val) -> Src:
        return Src(f"({self._src(a).text} {op} {self._src(b).text})", boolean=True)

    def eq(self, a: Val, b: Val) -> Val:
        return self._compare("==", a, b)

    def lt(self, a: Val, b: Val) -> Val:
        return self._compare("<", a, b)

    def le(self, a: Val, b: Val) -> Val:
        return self._compare("<=", a, b)

    def add(self, a: Val, b: Val) -> Val:
        return Src(f"({self._src(a).text} + {self._src(b).text})")

    def get(self, column: Val, key: Val) -> Val:
        col, k = self._src(column), self._src(key)
        known = col.simple and col.length is not None
        if known and isinstance(k.const, int):
            if 0 <= k.const < col.length:  # type: ignore[operator]
                return Src(f"{col.text}[{k.const}]", simple=True)
            return _const(_OUTSIDE)
        i = self._fresh()
        if known:
            bounded = f"0 <= ({i} := {k.text}) < {col.length}"
            return Src(f"({col.text}[{i}] if {bounded} else {_OUTSIDE})")
        c = self._fresh()
        return Src(f"({c}[{i}] if 0 <= ({i} := {k.text}) < len({c} := {col.text}) else {_OUTSIDE})")

    def store(self, column: Val, key: Val, value: Val) -> Val:
        col, k, v = self._src(column), self._src(key), self._src(value)
        n = col.length
        if col.simple and n is not None and isinstance(k.const, int) and 0 <= k.const < n:
            items = [v.text if j == k.const else f"{col.text}[{j}]" for j in range(n)]
            return Src("(" + ", ".join(items) + ",)", length=n)
        return Src(f"_store({col.text}, {k.text}, {v.text})", length=n)

    def update_where(self, column: Val, sort: str, fn: Callable[[Val, Val], Val]) -> Val:
        col = self._src(column)
        if not col.simple or col.length is None:
            raise TypeError("update_where over a column of unknown length")
        items = [
            self._src(fn(_const(j), Src(f"{col.text}[{j}]", simple=True))).text
            for j in range(col.length)
        ]
        return Src("(" + ", ".join(items) + ",)" if items else "()", length=col.length)

    def forall(self, sort: str, fn: Callable[[Val], Val]) -> Val:
        return self._junction("and", True, tuple(fn(_const(k)) for k in range(self.sizes[sort])))

    def exists(self, sort: str, fn: Callable[[Val], Val]) -> Val:
        return self._junction("or", False, tuple(fn(_const(k)) for k in range(self.sizes[sort])))


def _store(column: tuple[Any, ...], key: int, value: Any) -> tuple[Any, ...]:
    items = list(column)
    items[key] = value
    return tuple(items)


class _SrcState(Mapping[str, Any]):
    """A spec state whose columns are the locals of the generated function (records reads)."""

    def __init__(self, sizes: dict[str, int]) -> None:
        self.sizes = sizes
        self.read: set[int] = set()

    def __getitem__(self, name: str) -> Src:
        i = COLUMN_INDEX[name]
        self.read.add(i)
        col = COLUMNS[i]
        return Src(f"c{i}", simple=True, length=self.sizes[col.sort])

    def __iter__(self) -> Iterator[str]:
        return iter(COLUMN_INDEX)

    def __len__(self) -> int:
        return len(COLUMNS)


_NAMESPACE: dict[str, Any] = {"_store": _store, "SpecState": SpecState}


def _define(name: str, lines: list[str]) -> Callable[..., Any]:
    namespace = dict(_NAMESPACE)
    exec(compile("\n".join(lines) + "\n", f"<retire_spec.codegen {name}>", "exec"), namespace)
    fn: Callable[..., Any] = namespace[name]
    return fn


def _prologue(read: set[int]) -> list[str]:
    return ["    cells = st.cells"] + [f"    c{i} = cells[{i}]" for i in sorted(read)]


Predicate = Callable[[SpecState], bool]
Successor = Callable[[SpecState], SpecState | None]


class Compiler:
    """Compiled guards, successor functions and predicates for one ``Bounds``, cached by the
    identity of the spec functions and the action arguments."""

    def __init__(self, bounds: Bounds, codegen: type[Codegen] = Codegen) -> None:
        self.bounds = bounds
        self.codegen = codegen
        self.sizes = bounds.sizes()
        self.concrete = Concrete(self.sizes)
        self._guards: dict[tuple[Any, ...], Predicate] = {}
        self._steps: dict[tuple[Any, ...], Successor] = {}
        self._preds: dict[Callable[..., Any], Predicate] = {}
        self._conjunctions: dict[tuple[Callable[..., Any], ...], Predicate] = {}
        self._instance_lists: dict[tuple[Any, ...], tuple[ActionInstance, ...]] = {}
        self.fallbacks: list[str] = []  # functions evaluated by ``Concrete`` instead

    def guard(self, action: Action, args: tuple[Any, ...]) -> Predicate:
        key = (action.guard, args)
        fn = self._guards.get(key)
        if fn is None:
            fn = self._guards[key] = self._compile_guard(action, args)
        return fn

    def step(self, action: Action, args: tuple[Any, ...]) -> Successor:
        """The successor of a state under the instance, or ``None`` where its guard is false."""
        key = (action.guard, action.effect, args)
        fn = self._steps.get(key)
        if fn is None:
            fn = self._steps[key] = self._compile_step(action, args)
        return fn

    def predicate(self, holds: Callable[..., Val]) -> Predicate:
        """An invariant's ``holds`` as a function of the state alone."""
        fn = self._preds.get(holds)
        if fn is None:
            fn = self._preds[holds] = self._compile_predicate(holds)
        return fn

    def conjunction(self, preds: tuple[Callable[..., Val], ...]) -> Predicate:
        """One function of the state that holds iff every one of ``preds`` (invariants'
        ``holds``) holds: their compiled expressions joined by ``and`` in one body, so a state
        in which all hold costs one call (which of them fails is then asked of ``predicate``).
        Where one cannot be compiled, the compiled predicates are called in turn."""
        fn = self._conjunctions.get(preds)
        if fn is None:
            fn = self._conjunctions[preds] = self._compile_conjunction(preds)
        return fn

    # --- generation -----------------------------------------------------------------------
    def _compile_conjunction(self, preds: tuple[Callable[..., Val], ...]) -> Predicate:
        try:
            st = _SrcState(self.sizes)
            I = self.codegen(self.sizes)
            conds = [I.and_(holds(I, st)).text for holds in preds]
            body = [*_prologue(st.read), f"    return {' and '.join(conds) or 'True'}"]
            return _define("holds", ["def holds(st):", *body])
        except TypeError:
            compiled = tuple(self.predicate(holds) for holds in preds)
            return lambda st: all(holds(st) for holds in compiled)

    def _compile_guard(self, action: Action, args: tuple[Any, ...]) -> Predicate:
        try:
            I = self.codegen(self.sizes)
            st = _SrcState(self.sizes)
            cond = I.and_(action.guard(I, st, *_args(args)))
            body = [*_prologue(st.read), f"    return {cond.text}"]
            return _define("guard", ["def guard(st):", *body])
        except TypeError:
            self.fallbacks.append(f"{action.name} guard")
            C = self.concrete
            return lambda st: bool(action.guard(C, st, *args))

    def _compile_step(self, action: Action, args: tuple[Any, ...]) -> Successor:
        try:
            I = self.codegen(self.sizes)
            st = _SrcState(self.sizes)
            cond = I.and_(action.guard(I, st, *_args(args)))
            updates = action.effect(I, st, *_args(args))
            assigns = [
                f"    out[{COLUMN_INDEX[name]}] = {I._src(value).text}"
                for name, value in updates.items()
            ]
            body = [
                *_prologue(st.read),
                f"    if not {cond.text}:",
                "        return None",
                "    out = list(cells)",
                *assigns,
                "    return SpecState(tuple(out))",
            ]
            return _define("step", ["def step(st):", *body])
        except TypeError:
            self.fallbacks.append(f"{action.name} step")
            C = self.concrete

            def step(st: SpecState) -> SpecState | None:
                if not action.guard(C, st, *args):
                    return None
                return st.replace(action.effect(C, st, *args))

            return step

    def _compile_predicate(self, holds: Callable[..., Val]) -> Predicate:
        try:
            st = _SrcState(self.sizes)
            I = self.codegen(self.sizes)
            cond = I.and_(holds(I, st))
            body = [*_prologue(st.read), f"    return {cond.text}"]
            return _define("holds", ["def holds(st):", *body])
        except TypeError:
            self.fallbacks.append(getattr(holds, "__name__", repr(holds)))
            C = self.concrete
            return lambda st: bool(holds(C, st))

    # --- the spec's successor relation, compiled ------------------------------------------
    def enabled(
        self, st: SpecState, actions: tuple[Action, ...]
    ) -> Iterator[tuple[ActionInstance, SpecState]]:
        """``retire_spec.actions.enabled`` with compiled steps (same instances, same order)."""
        max_epoch = self.bounds.max_epoch
        epoch = COLUMN_INDEX["scope_epoch"]
        for action in actions:
            for inst in self._instances(action):
                nxt = self.step(action, inst.args)(st)
                if nxt is None or any(e > max_epoch for e in nxt.cells[epoch]):
                    continue
                yield inst, nxt

    def _instances(self, action: Action) -> tuple[ActionInstance, ...]:
        key = (action.name, action.params)
        found = self._instance_lists.get(key)
        if found is None:
            found = self._instance_lists[key] = tuple(instances(action, self.bounds))
        return found


def _args(args: tuple[Any, ...]) -> tuple[Src, ...]:
    return tuple(_const(a) for a in args)


_COMPILERS: dict[Bounds, Compiler] = {}


def compiler(bounds: Bounds) -> Compiler:
    """The shared compiler of ``bounds``."""
    found = _COMPILERS.get(bounds)
    if found is None:
        found = _COMPILERS[bounds] = Compiler(bounds)
    return found


__all__ = ["Codegen", "Compiler", "Src", "compiler"]
