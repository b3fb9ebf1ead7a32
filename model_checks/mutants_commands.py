"""Command mutants: the core decides right but tells the engine something else.

Each runs every event as the core does and then rewrites the commands it emits (``_commands``): a
missing ``Fence``, ``Admit``, ``PinCertified``, ``Adopt``, ``Unpin``, ``Free``, ``Publish``,
``AllowWrite`` or ``ReleaseToCache``, or one distorted (an ``Admit`` of the wrong version, a
``Drop`` sent as ``Publish`` ...). The core's state and transitions are left alone, so only the
modelled engine's check of the commands against its books (``engine.obey``) can see them. What
does not live here: the mutants of the core's decisions (``mutants_core``, which joins both into
``CORE_MUTANTS``), the ``Mutant`` record (``mutant_kind``) and judging (``mutants``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

import retire_core as rc
from retire_checks.mutant_kind import CONFIGS, Mutant, patched
from retire_core import machine

_dispatch = machine.dispatch


def _commands(edit: Callable[[Any, Any], list[Any]]) -> Callable[[], Any]:
    """A mutant that runs every event as the core does and then rewrites the commands it
    emits (``edit(txn, commands)`` returns the new list); the core's state and transitions are
    left alone, so only the check of the commands against the engine's books can see it."""

    def apply(txn: Any, event: Any) -> None:
        _dispatch(txn, event)
        if txn.commands:
            txn.commands[:] = edit(txn, list(txn.commands))

    return patched(machine, "dispatch", apply)


def _without(cls: type) -> Callable[[], Any]:
    return _commands(lambda txn, cmds: [c for c in cmds if not isinstance(c, cls)])


def _mapped(cls: type, fn: Callable[[Any, Any], Any]) -> Callable[[], Any]:
    return _commands(lambda txn, cmds: [fn(txn, c) if isinstance(c, cls) else c for c in cmds])


def _fence_first_only(txn: Any, c: rc.Fence) -> rc.Fence:
    return attrs.evolve(c, participants=c.participants[:1])


def _admit_next_version(txn: Any, c: rc.Admit) -> rc.Admit:
    return attrs.evolve(c, version=c.version + 1)


def _admit_claiming_blocks(txn: Any, c: rc.Admit) -> rc.Admit:
    blocks = len(txn.scopes[c.scope].context)
    return attrs.evolve(c, adopted_blocks=blocks, cold=False)


def _admit_counting_pages(txn: Any, c: rc.Admit) -> rc.Admit:
    adopted = sum(
        len(a.pages) for a in txn.commands if isinstance(a, rc.Adopt) and a.scope == c.scope
    )
    return c if c.cold else attrs.evolve(c, adopted_blocks=adopted)


def _adopt_previous_version(txn: Any, c: rc.Adopt) -> rc.Adopt:
    return attrs.evolve(c, version=c.version - 1)


def _drop_as_publish(txn: Any, c: rc.Drop) -> rc.Publish:
    return rc.Publish(c.frame, c.scope, c.version, c.kind)


def _fence_write_as_allow(txn: Any, c: rc.FenceWrite) -> rc.AllowWrite:
    return rc.AllowWrite(c.page, c.participant)


def _free_with_pinned(txn: Any, cmds: list[Any]) -> list[Any]:
    pinned = tuple(p for p, page in txn.pages.items() if page.pinned)
    return [
        attrs.evolve(c, pages=c.pages + tuple(p for p in pinned if p not in c.pages))
        if isinstance(c, rc.Free) and pinned
        else c
        for c in cmds
    ]


_C = CONFIGS
COMMAND_MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        "fence_dropped",
        "command dropped (Fence)",
        "core",
        "the core fences retired participants in its state but never tells the engine",
        (_C["chain"],),
        _without(rc.Fence),
    ),
    Mutant(
        "fence_partial",
        "command distorted (Fence)",
        "core",
        "a Fence names only the first of the retired version's running participants",
        (_C["chain"],),
        _mapped(rc.Fence, _fence_first_only),
    ),
    Mutant(
        "admit_dropped",
        "command dropped (Admit)",
        "core",
        "the core admits a version but never tells the engine to start it",
        (_C["chain"],),
        _without(rc.Admit),
    ),
    Mutant(
        "admit_wrong_version",
        "command distorted (Admit)",
        "core",
        "Admit names the version after the one admitted",
        (_C["chain"],),
        _mapped(rc.Admit, _admit_next_version),
    ),
    Mutant(
        "admit_claims_adoption",
        "command distorted (Admit)",
        "core",
        "Admit tells the engine every block of the context was adopted",
        (_C["chain"],),
        _mapped(rc.Admit, _admit_claiming_blocks),
    ),
    Mutant(
        "admit_counts_pages",
        "command distorted (Admit)",
        "core",
        "Admit counts the pages adopted as blocks: with two KV cache groups, twice the cut",
        (_C["groups"],),
        _mapped(rc.Admit, _admit_counting_pages),
    ),
    Mutant(
        "pin_certified_dropped",
        "command dropped (PinCertified)",
        "core",
        "ALIGN pins the certificate in the core's state but never asks the engine to pin",
        (_C["chain"],),
        _without(rc.PinCertified),
    ),
    Mutant(
        "adopt_dropped",
        "command dropped (Adopt)",
        "core",
        "RESUME adopts pages in the core's state but never hands them to the engine",
        (_C["chain"],),
        _without(rc.Adopt),
    ),
    Mutant(
        "adopt_wrong_version",
        "command distorted (Adopt)",
        "core",
        "Adopt hands the pages to the predecessor's version instead of the successor's",
        (_C["chain"],),
        _mapped(rc.Adopt, _adopt_previous_version),
    ),
    Mutant(
        "unpin_dropped",
        "command dropped (Unpin)",
        "core",
        "released handoff pins are never released in the engine",
        (_C["chain"],),
        _without(rc.Unpin),
    ),
    Mutant(
        "free_dropped",
        "command dropped (Free)",
        "core",
        "RECLAIM forgets pages but never gives them back to the engine",
        (_C["chain"],),
        _without(rc.Free),
    ),
    Mutant(
        "free_pinned_page",
        "command distorted (Free)",
        "core",
        "a Free also names every page that still carries a handoff pin",
        (_C["handoff"],),
        _commands(_free_with_pinned),
    ),
    Mutant(
        "drop_published",
        "command distorted (Drop)",
        "core",
        "a frame the gate dropped is sent to the engine as Publish",
        (_C["chain"],),
        _mapped(rc.Drop, _drop_as_publish),
    ),
    Mutant(
        "publish_dropped",
        "command dropped (Publish)",
        "core",
        "a frame the gate published never reaches the engine",
        (_C["chain"],),
        _without(rc.Publish),
    ),
    Mutant(
        "fence_write_allowed",
        "command distorted (FenceWrite)",
        "core",
        "a write the isolation gate fenced is sent to the engine as AllowWrite",
        (_C["chain"],),
        _mapped(rc.FenceWrite, _fence_write_as_allow),
    ),
    Mutant(
        "allow_write_dropped",
        "command dropped (AllowWrite)",
        "core",
        "a write the gate allowed is never answered",
        (_C["chain"],),
        _without(rc.AllowWrite),
    ),
    Mutant(
        "release_to_cache_dropped",
        "command dropped (ReleaseToCache)",
        "core",
        "a finished version's pages are never given back to the engine's cache",
        (_C["control"],),
        _without(rc.ReleaseToCache),
    ),
)
