"""Classifying late events of versions that no longer hold authority.

Like h2's memory of closed streams, the core remembers a bounded number of drained retired versions
(``CoreState.ledger``). A late frame or launch of a retired version is dropped or fenced, never an
error, and its log line says which case it was: ``retired_draining`` (the version still has
participants or pages), ``retired_drained`` (it has fully drained and is in the ledger) or
``retired_expired`` (older than the ledger remembers). A cancelled scope's own version is
``scope_cancelled``; a finished scope's own version is ``version_finished``.
"""

from __future__ import annotations

from retire_core.ids import ScopeId, Version
from retire_core.reasons import DropReason
from retire_core.state import ScopeState
from retire_core.txn import Txn


def classify_late(txn: Txn, scope: ScopeId, version: Version) -> DropReason:
    rec = txn.read_scope(scope)  # reads only: nothing is thawed
    if rec.state is ScopeState.CANCELLED and version == rec.epoch:
        return DropReason.SCOPE_CANCELLED
    if rec.state is ScopeState.FINISHED and version == rec.epoch:
        return DropReason.VERSION_FINISHED
    if any(r.version == version for r in rec.participants.values()) or any(
        v == version for v, _ in txn.page_kinds(scope)
    ):
        return DropReason.RETIRED_DRAINING
    if (scope, version) in txn.read_ledger():
        return DropReason.RETIRED_DRAINED
    return DropReason.RETIRED_EXPIRED
