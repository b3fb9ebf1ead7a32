"""The modelled engine's side of the commands: what each command allows, obliges and forbids.

The checks' engine (the explorer's, the lock-step harness's and the Hypothesis machine's) does
only what the core's commands let it do, and every command the core emits must be one such an
engine can carry out. ``obey`` takes one core step (the state before, the event, the state after,
the commands and the transitions) and plays the commands on the engine's own books, in order:

* ``Publish`` / ``Drop``: a delivered frame gets exactly one of them, naming the frame's own
  scope, version and kind; no other event gets any.
* ``AllowWrite`` / ``FenceWrite``: a write attempt gets exactly one of them, for its own page
  and participant; no other event gets any.
* ``PinCertified``: the engine pins the certified pages (each must be allocated and not yet
  pinned; the certificate is for the scope's current version); ``Unpin`` releases pins (each
  page must be pinned); ``Adopt`` hands pinned pages to the successor (each must be pinned, the
  version must be the scope's current one): adoption happens through ``Adopt`` only.
* ``Free``: the engine takes the pages back (each must be allocated and carry no pin: a page
  with a pin is never freed, so never reused by a later allocation either).
* ``ReleaseToCache``: the engine drops its references to a finished version's pages but keeps
  them in its cache (each must be tracked, unpinned and not cached already); from then on, and
  only then, it may evict them (``PageEvicted``); a ``PinCertified`` takes one back out of the
  cache, a ``Free`` or an eviction forgets it.
* ``Admit``: the engine may launch participants of that version from now on; the pages
  ``Adopt`` handed over for that version in this step fill exactly the slots its layers read
  below the adopted blocks (none for a cold start): in every full-attention KV cache group each
  block before the cut, in a group with a sliding window of ``w`` blocks the last ``w`` of them
  (a rule restated here, not imported from the core it checks); and every ``open``/``resume``
  transition has its ``Admit`` (same scope, version, adopted blocks and cold flag) and no other
  ``Admit`` is emitted.
* ``Fence``: names running participants of a version without authority; after it the engine
  launches nothing more for that version. Every participant that is running for a version
  without authority after the step, and was not before it, must have been named by a
  ``Fence`` of this step (the engine would otherwise never stop it).

After the commands, the engine's pins are exactly the core's pinned pages, the pages it
holds allocated exactly the core's pages and the pages in its cache exactly the core's pages
that nothing references or pins (so a dropped ``PinCertified``, ``Unpin``, ``Adopt``, ``Free``
or ``ReleaseToCache`` is caught). Any disagreement raises ``CommandViolation``. ``obey`` returns the
changes to the set of versions the engine may launch for (``("admit", slot, v)``,
``("fence", slot, v)``), which the harness applies with ``launchable_after``: the environment
offers a launch of version ``v`` only while ``(slot, v)`` is in that set (admitted, not fenced).

Faults (``corrupt``, ``reuse_id``: the fault budget) are the one exception on purpose: they
model an engine that breaks its word (bytes change, a retained block id is recycled underneath
the core, pinned or not) and are what the byte check at adoption exists to catch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

import retire_core as rc

#: Every command class ``obey`` checks (``retire check --json`` reports the ones the run met).
COMMANDS_CHECKED: tuple[str, ...] = (
    "Publish",
    "Drop",
    "Fence",
    "AllowWrite",
    "FenceWrite",
    "PinCertified",
    "Adopt",
    "Unpin",
    "Admit",
    "Free",
    "ReleaseToCache",
)

EngineOp = tuple[str, int, int]  # ("admit" | "fence", scope slot, version)


class Books(NamedTuple):
    """What the engine's books must say about one core state: the pinned pages, the pages it
    holds, those in its cache, and the running participants of versions without authority."""

    pins: frozenset[int]
    held: frozenset[int]
    cached: frozenset[int]
    unfenced: frozenset[tuple[str, str, int]]


def books_of(state: rc.CoreState) -> Books:
    pages = state.pages
    return Books(
        frozenset(p for p, r in pages.items() if r.pinned),
        frozenset(pages),
        frozenset(_cached(state)),
        frozenset(_unfenced(state)),
    )


class CommandViolation(AssertionError):
    """The core emitted a command the modelled engine cannot carry out, or failed to emit one
    the engine needs."""


def obey(
    before: rc.CoreState,
    event: Any,
    after: rc.CoreState,
    commands: Sequence[rc.Command],
    transitions: Sequence[rc.Transition],
    scope_slot: Callable[[str], int],
    books: Callable[[rc.CoreState], Books] = books_of,
    kv_windows: tuple[int, ...] = (0,),
    page_group: Callable[[int], int] = lambda page: 0,
) -> tuple[EngineOp, ...]:
    """Check one core step's commands against the engine's books (see the module docstring);
    return the changes to the set of launchable versions. ``books``: ``books_of``, or a memo
    of it (a search meets each core state in many steps); ``kv_windows`` and ``page_group``:
    the engine's KV cache groups and the group it allocated each page in."""
    was = books(before)
    pins = set(was.pins)
    held = set(was.held)
    cached = set(was.cached)
    if type(event) is rc.PageAllocated:
        held.add(event.page)  # the engine allocated it: that is the event
    elif type(event) is rc.PageEvicted:
        if event.page not in cached:
            raise CommandViolation(f"the engine evicted page {event.page}, not in its cache")
        cached.discard(event.page)  # the engine evicted it: that is the event
        held.discard(event.page)
    adopted: dict[tuple[str, int], list[int]] = {}
    fenced: set[tuple[str, str]] = set()
    admits: list[tuple[Any, Any, Any, Any]] = []
    frames: list[tuple[Any, ...]] = []
    writes: list[tuple[Any, ...]] = []
    ops: list[EngineOp] = []
    for c in commands:
        t = type(c)
        if t is rc.Publish or t is rc.Drop:
            frames.append((c.frame, c.scope, c.version, c.kind))  # type: ignore[union-attr]
        elif t is rc.AllowWrite or t is rc.FenceWrite:
            writes.append((c.page, c.participant))  # type: ignore[union-attr]
        elif t is rc.PinCertified:
            cert = c.certificate  # type: ignore[union-attr]
            rec = after.scopes.get(cert.scope)
            if rec is None or rec.epoch != cert.version:
                raise CommandViolation(
                    f"PinCertified for {cert.scope}@{cert.version}, which is not the scope's "
                    "current version"
                )
            for p in cert.pages:
                if p not in held or p in pins:
                    what = "not allocated" if p not in held else "already pinned"
                    raise CommandViolation(f"PinCertified pins page {p}, which is {what}")
                pins.add(p)
                cached.discard(p)
        elif t is rc.Unpin:
            for p in c.pages:  # type: ignore[union-attr]
                if p not in pins:
                    raise CommandViolation(f"Unpin of page {p}, which the engine has not pinned")
                pins.discard(p)
        elif t is rc.Adopt:
            scope, version = c.scope, c.version  # type: ignore[union-attr]
            rec = after.scopes.get(scope)
            if rec is None or rec.epoch != version:
                raise CommandViolation(
                    f"Adopt for {scope}@{version}, which is not the scope's current version"
                )
            for p in c.pages:  # type: ignore[union-attr]
                if p not in pins:
                    raise CommandViolation(f"Adopt of page {p}, which the engine has not pinned")
                pins.discard(p)
            adopted.setdefault((scope, version), []).extend(c.pages)  # type: ignore[union-attr]
        elif t is rc.Free:
            for p in c.pages:  # type: ignore[union-attr]
                if p in pins:
                    raise CommandViolation(f"Free of page {p}, which carries a pin")
                if p not in held:
                    raise CommandViolation(f"Free of page {p}, which the engine does not hold")
                held.discard(p)
                cached.discard(p)
        elif t is rc.ReleaseToCache:
            for p in c.pages:  # type: ignore[union-attr]
                if p not in held or p in pins or p in cached:
                    what = "pinned" if p in pins else "cached already" if p in cached else "gone"
                    raise CommandViolation(f"ReleaseToCache of page {p}, which is {what}")
                cached.add(p)
        elif t is rc.Admit:
            scope, version = c.scope, c.version  # type: ignore[union-attr]
            blocks, cold = c.adopted_blocks, c.cold  # type: ignore[union-attr]
            pages = after.pages
            got = sorted(
                (pages[p].position if p in pages else -1, page_group(p))
                for p in adopted.get((scope, version), ())
            )
            read = sorted(
                (i, g)
                for g, w in enumerate(kv_windows)
                for i in range(max(0, blocks - w) if w else 0, blocks)
            )
            if got != read or (cold and blocks):
                raise CommandViolation(
                    f"Admit of {scope}@{version} with {blocks} adopted blocks (cold={cold}): "
                    f"its layers read (position, group) {read}, Adopt handed over {got}"
                )
            admits.append((scope, version, blocks, cold))
            ops.append(("admit", scope_slot(scope), version))
        elif t is rc.Fence:
            scope, version = c.scope, c.version  # type: ignore[union-attr]
            rec = after.scopes.get(scope)
            if rec is None or rec.has_authority(version):
                raise CommandViolation(f"Fence of {scope}@{version}, which still has authority")
            for q in c.participants:  # type: ignore[union-attr]
                part = rec.participants.get(q)
                if part is None or part.version != version or part.closed:
                    raise CommandViolation(
                        f"Fence of {q!r} for {scope}@{version}, which is not running there"
                    )
                fenced.add((scope, q))
            ops.append(("fence", scope_slot(scope), version))
        else:
            raise CommandViolation(f"a command the engine does not know: {c!r}")
    _check_answers(event, frames, writes)
    now = books(after)
    want_pins = now.pins
    if pins != want_pins:
        raise CommandViolation(
            f"after the commands the engine pins pages {sorted(pins)}, but the core has "
            f"{sorted(want_pins)} pinned"
        )
    if held != now.held:
        raise CommandViolation(
            f"after the commands the engine holds pages {sorted(held)}, but the core tracks "
            f"{sorted(after.pages)}"
        )
    want_cached = now.cached
    if cached != want_cached:
        raise CommandViolation(
            f"after the commands the engine caches pages {sorted(cached)}, but the core has "
            f"{sorted(want_cached)} with no reference and no pin"
        )
    want_admits: list[tuple[Any, Any, Any, Any]] = []
    for tr in transitions:
        if tr.action == "open":
            want_admits.append((tr.scope, 0, 0, True))
        elif tr.action == "resume":
            want_admits.append((tr.scope, tr.version, tr.arg("adopted_blocks"), tr.arg("cold")))
    if sorted(admits, key=repr) != sorted(want_admits, key=repr):
        raise CommandViolation(
            f"Admit commands {admits} disagree with the admissions taken {want_admits}"
        )
    _check_fenced(was.unfenced, now.unfenced, fenced)
    return tuple(ops)


def _check_answers(
    event: Any, frames: list[tuple[Any, ...]], writes: list[tuple[Any, ...]]
) -> None:
    t = type(event)
    if t is rc.FrameArrived:
        want = [(event.frame, event.scope, event.version, event.kind)]
        if frames != want:
            raise CommandViolation(
                f"frame {event.frame} of {event.scope}@{event.version} was answered by "
                f"{frames or 'nothing'}: exactly one Publish or Drop for it is due"
            )
    elif frames:
        raise CommandViolation(f"Publish/Drop {frames} without a frame delivered")
    if t is rc.WriteAttempted:
        if writes != [(event.page, event.participant)]:
            raise CommandViolation(
                f"the write of {event.participant!r} into page {event.page} was answered by "
                f"{writes or 'nothing'}: exactly one AllowWrite or FenceWrite for it is due"
            )
    elif writes:
        raise CommandViolation(f"AllowWrite/FenceWrite {writes} without a write attempted")


def _cached(state: rc.CoreState) -> set[int]:
    """The pages the core tracks with neither a reference nor a pin: given back to the cache."""
    return {p for p, r in state.pages.items() if not r.held and not r.pinned}


def _unfenced(state: rc.CoreState) -> set[tuple[str, str, int]]:
    """Running participants of versions without authority."""
    out = set()
    for sid, rec in state.scopes.items():
        for q, part in rec.participants.items():
            if not part.closed and not rec.has_authority(part.version):
                out.add((sid, q, part.version))
    return out


def _check_fenced(
    before: frozenset[tuple[str, str, int]],
    after: frozenset[tuple[str, str, int]],
    fenced: set[tuple[str, str]],
) -> None:
    for sid, q, v in sorted(after - before):
        if (sid, q) not in fenced:
            raise CommandViolation(
                f"participant {q!r} of {sid}@{v} runs without authority and was never fenced"
            )


def launchable_after(
    launchable: frozenset[tuple[int, int]], ops: Iterable[EngineOp]
) -> frozenset[tuple[int, int]]:
    """The versions the engine may launch participants for, after a step's ``Admit`` and
    ``Fence`` commands (in order)."""
    out = set(launchable)
    for kind, s, v in ops:
        if kind == "admit":
            out.add((s, v))
        else:
            out.discard((s, v))
    return frozenset(out)


__all__ = [
    "COMMANDS_CHECKED",
    "Books",
    "CommandViolation",
    "books_of",
    "launchable_after",
    "obey",
]
