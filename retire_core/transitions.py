"""Transition records: what one core step did, in the spec's vocabulary.

Every state change the core makes is reported as one ``Transition`` whose ``action`` is the name of
the spec action it implements (``publish``, ``certify``, ``adopt``, ``free`` ...), or a *stutter*
that changes no abstract state but is still worth a log line (``fence`` asks the engine to stop
retired work; ``late_report`` ignores a byte check for a superseded successor, ``late_finish`` a
finish report for a version that no longer holds authority, ``late_preempt`` a preemption report for
one, ``late_unreference`` a report that the engine stopped referencing one of its pages,
``stale_verify`` a verification of drafts that a page no longer holds: repeated, or after its
writer closed). Each transition becomes exactly one structlog event, and the same records drive the
refinement check and trace validation. An operation of ALIGN, RESUME or RECLAIM on several pages at
once (certify a prefix, adopt it, release, unhold or free pages) is one transition over all of them
(``pages_transition``): a revision of a long context logs a few lines, not one per page, while
``per_page`` gives the per-page spec steps it stands for, which the checks read. The table of which
events each scope state accepts lives in ``table``.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

from retire_core.ids import PageId, Version


class Stage(enum.Enum):
    SUBMIT = "submit"
    ADVANCE = "advance"
    FENCE = "fence"
    ALIGN = "align"
    RESUME = "resume"
    RECLAIM = "reclaim"
    PUBLISH = "publish"
    RUN = "run"
    CONTROL = "control"


#: Transitions that change no spec state (a late report, a repeated fence, a stale verification):
#: correspondence maps them to no spec action and trace validation checks only their premise.
STUTTERS = frozenset(
    {"fence", "late_report", "late_finish", "late_preempt", "late_unreference", "stale_verify"}
)


class Transition(NamedTuple):
    """Immutable (a named tuple: the core builds one per transition, millions of times in a search,
    and a tuple is several times cheaper to build than a frozen attrs record)."""

    action: str
    stage: Stage
    scope: str | None
    version: Version | None
    args: tuple[tuple[str, Any], ...] = ()
    changed: tuple[tuple[str, Any], ...] = ()
    reason: str | None = None

    def arg(self, name: str) -> Any:
        for key, value in self.args:
            if key == name:
                return value
        raise KeyError(name)

    def as_log(self) -> dict[str, Any]:
        """The structlog event fields (documented in docs/protocol.md, read by trace validation)."""
        out: dict[str, Any] = {
            "transition": self.action,
            "stage": self.stage._value_,  # the member's value without the enum descriptor
            "scope": self.scope,
            "version": self.version,
        }
        for k, v in self.args:
            out[k] = v if type(v) in _PLAIN else _plain(v)
        if self.changed:
            out["changed"] = {k: v if type(v) in _PLAIN else _plain(v) for k, v in self.changed}
        if self.reason is not None:
            out["reason"] = _plain(self.reason)
        return out


_tuple_new = tuple.__new__


def transition(
    action: str,
    stage: Stage,
    scope: str | None,
    version: Version | None,
    args: tuple[tuple[str, Any], ...] = (),
    changed: tuple[tuple[str, Any], ...] = (),
    reason: str | None = None,
) -> Transition:
    """The one builder of the core's transitions: ``Transition(...)`` without the named
    tuple's generated ``__new__`` (a Python function of its own, twice the cost)."""
    return _tuple_new(Transition, (action, stage, scope, version, args, changed, reason))


#: A column of a transition over several pages: a fact's name and its value for each page, in the
#: order of the pages (``None``: the page has no such fact, as a page of group 0 has no ``group``).
Column = tuple[str, tuple[Any, ...]]


def pages_transition(
    action: str,
    stage: Stage,
    scope: str | None,
    version: Version | None,
    pages: tuple[PageId, ...],
    columns: tuple[Column, ...] = (),
    changed: tuple[tuple[str, Any], ...] = (),
    reason: str | None = None,
) -> Transition:
    """The one transition of ``action`` on each of ``pages`` in turn (the same change, the same
    reason): its arguments are ``pages`` and then the ``columns``. One page gives the per-page
    transition itself (arguments ``page`` and that page's facts), as ``per_page`` would."""
    args = _page_args(pages[0], columns, 0) if len(pages) == 1 else (("pages", pages), *columns)
    return _tuple_new(Transition, (action, stage, scope, version, args, changed, reason))


def per_page(transitions: Iterable[Transition]) -> Iterator[Transition]:
    """Each transition as the spec steps it stands for: one over several pages (its first
    argument ``pages``) as one transition per page, in order, with argument ``page`` and that
    page's entry of each column; every other transition as it is."""
    for t in transitions:
        args = t.args
        if not args or args[0][0] != "pages":
            yield t
            continue
        columns = args[1:]
        for i, page in enumerate(args[0][1]):
            each = _page_args(page, columns, i)
            yield _tuple_new(
                Transition, (t.action, t.stage, t.scope, t.version, each, t.changed, t.reason)
            )


def _page_args(page: PageId, columns: tuple[Column, ...], i: int) -> tuple[tuple[str, Any], ...]:
    """The arguments of the per-page step of the ``i``-th page of a transition over several."""
    return (("page", page), *((k, col[i]) for k, col in columns if col[i] is not None))


#: Values a log line carries as they are (most of them: ids, positions, flags, digests).
_PLAIN = frozenset({int, str, bool, type(None)})


def _plain(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, tuple):
        return [v if type(v) in _PLAIN else _plain(v) for v in value]
    return value
