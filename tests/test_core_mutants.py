"""Seeded bugs in the core: every one must make the lock-step Hypothesis machine fail.

Each mutant patches one decision of ``retire_core`` (the publication gate, the write gate,
certification, the generation or digest check, reclamation, receipt counting) and runs
``retire_checks.fuzz.run_machine`` against it; a mutant the machine does not catch fails this test.
The unpatched core must pass the same run, so the check is not failing for another reason.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import attrs
import pytest

import retire_core as rc
from retire_checks.fuzz import run_machine
from retire_core import gates, handoff, machine, reclaim

_orig_verify = handoff.verify_adoption
_orig_reclaim = reclaim.reclaim


def _verify_ignoring(field: str) -> Callable[[Any, rc.AdoptionReport], None]:
    def verify(txn: Any, ev: rc.AdoptionReport) -> None:
        rec = txn.scopes[ev.scope]
        cert = rec.certificate
        if field == "generation":
            entries = tuple(
                attrs.evolve(e, generation=txn.pages[e.page].generation)
                if e.page in txn.pages
                else e
                for e in cert.entries
            )
            txn.scopes[ev.scope] = attrs.evolve(
                rec, certificate=attrs.evolve(cert, entries=entries)
            )
        else:
            certified = {e.page: e.digest for e in cert.entries}
            ev = attrs.evolve(
                ev, digests=tuple(rc.PageDigest(d.page, certified[d.page]) for d in ev.digests)
            )
        _orig_verify(txn, ev)

    return verify


def _certify_open_writers(txn: Any, scope: str, rec: Any) -> tuple[list[Any], bool]:
    chain = []
    for i in range(len(rec.context)):
        here = [
            (p, pg)
            for p, pg in txn.pages.items()
            if pg.owner == scope
            and pg.version < rec.epoch
            and pg.position == i
            and pg.prefix == rec.context[i]
            and not pg.pinned
        ]
        if not here:
            break
        p, pg = min(here)
        chain.append((p, attrs.evolve(pg, digest=pg.digest or "-1")))
    return chain, False


def _reclaim_freeing_pins(txn: Any, scope: str) -> None:
    for p, page in list(txn.pages.items()):
        if page.owner == scope and page.pinned and not page.held:
            txn.pages[p] = attrs.evolve(page, pinned=False)
    _orig_reclaim(txn, scope)


MUTANTS: dict[str, Callable[[], contextlib.AbstractContextManager[Any]]] = {
    "publish_without_version_check": lambda: mock.patch.object(
        machine, "publication_gate", lambda rec, v, k: (True, None)
    ),
    "cancelled_scope_keeps_publishing": lambda: mock.patch.object(
        machine,
        "publication_gate",
        lambda rec, v, k: (v == rec.epoch, None if v == rec.epoch else "retired_version"),
    ),
    "retired_writer_writes": lambda: mock.patch.object(
        machine,
        "write_gate",
        lambda page, s, v, q: (page is not None and page.owner == s and page.writer_open, "x"),
    ),
    "cross_tenant_write": lambda: mock.patch.object(
        machine, "write_gate", lambda page, s, v, q: (page is not None and page.writer_open, "x")
    ),
    "adopt_open_writer_page": lambda: mock.patch.object(
        handoff, "longest_certifiable_prefix", _certify_open_writers
    ),
    "ignore_generation": lambda: mock.patch.object(
        handoff, "verify_adoption", _verify_ignoring("generation")
    ),
    "ignore_digest": lambda: mock.patch.object(
        handoff, "verify_adoption", _verify_ignoring("digest")
    ),
    "free_pinned_page": lambda: mock.patch.object(reclaim, "reclaim", _reclaim_freeing_pins),
    "closed_before_every_receipt": lambda: mock.patch.object(
        rc.ScopeRecord,
        "drained",
        lambda self, v: (
            any(r.closed for r in self.participants.values() if r.version == v)
            or not any(r.version == v for r in self.participants.values())
        ),
    ),
}


@contextlib.contextmanager
def _nothing() -> Iterator[None]:
    yield


def test_unmutated_core_passes_the_same_run() -> None:
    assert run_machine(max_examples=600) is None


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_mutant_is_caught(name: str) -> None:
    with MUTANTS[name]():
        failure = run_machine(max_examples=600)
    assert failure is not None, f"mutant {name} survived the lock-step Hypothesis machine"
    assert gates.publication_gate is not None  # the patch was undone
