"""Fault injection against a running :class:`~retire_vllm.facade.RetireEngine` (tests only).

* :func:`corrupt_page` changes the KV bytes of one block in place on every rank: same block id,
  same counts, same hashes, other bytes (what a buggy kernel, a bad transfer or a stray write
  would leave behind).  The byte check at adoption must catch it.
* :func:`drop_references` releases every reference the facade holds on a block *without telling
  the core* (what a buggy release path would do): vLLM may then hand the block to someone else,
  and generation tracking (``GenerationSpy`` -> ``PageReused``) must catch it.
* :func:`inject_frame` hands the core, at the facade's engine boundary, a TOKEN frame of any
  version (what a transport delivering late, twice or out of order would hand it) and reports
  the core's decision; a published frame reaches the consumer queue like any other.
* :func:`redeliver_receipt` hands the core a participant's receipt again (a duplicated closure
  report); the core must refuse it with a typed error and change nothing.
* :func:`lose_receipt` swallows a participant's next receipt on its way to the core (a closure
  report lost with its worker's message): the core must keep every page that participant may
  still write, and take the receipt when it is delivered late.
* :func:`shared_cold_salt` makes every version that inherits nothing run under one physical
  ``cache_salt``, whatever its tenant and scope (a salt derived without them): vLLM's prefix
  cache may then offer one scope's blocks to another (the isolation campaign's mutant).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from retire_core import Receipt

from . import introspect as ix

if TYPE_CHECKING:
    from .facade import RetireEngine


def corrupt_page(facade: RetireEngine, block_id: int, layer: int = 0, value: float = 0.5) -> None:
    facade.executor.collective_rpc(ix.worker_corrupt_block, args=(block_id, layer, value))


def drop_references(facade: RetireEngine, block_id: int) -> int:
    """Release the facade's pin and retention references on ``block_id``; returns how many."""
    page: Any = facade.pages[block_id]
    block = facade.pool.blocks[block_id]
    refs = len(page.pins) + 1  # the pins and the retention reference
    for _ in range(refs):
        facade.pool.free_blocks([block])
    return refs


def inject_frame(facade: RetireEngine, scope: str, version: int, token_ids: Sequence[int]) -> str:
    """A TOKEN frame of ``scope@version`` carrying ``token_ids``, handed to the core at the
    engine boundary; returns ``"publish"`` or the ``Drop`` reason."""
    from .facade_records import Chunk

    chunk = Chunk(scope, version, tuple(int(t) for t in token_ids), False, None)
    (fate,) = facade.deliver_engine_frames([chunk])
    return fate


def redeliver_receipt(facade: RetireEngine, scope: str, version: int, participant: str) -> None:
    """Hand the core ``participant``'s receipt once more (raises the core's typed error)."""
    facade.emit(Receipt(scope, version, participant))


@attrs.define
class LostReceipt:
    """What :func:`lose_receipt` swallowed: the receipt, once it has gone by."""

    participant: str
    receipt: Receipt | None = None


def lose_receipt(facade: RetireEngine, participant: str) -> LostReceipt:
    """Swallow ``participant``'s next ``Receipt`` on its way from the facade to the core (the
    facade believes it delivered it); ``redeliver_receipt`` delivers it late."""
    lost = LostReceipt(participant)
    emit: Callable[..., Any] = facade.emit

    def lossy(event: Any, *args: Any, **kwargs: Any) -> Any:
        if lost.receipt is None and isinstance(event, Receipt) and event.participant == participant:
            lost.receipt = event
            return []
        return emit(event, *args, **kwargs)

    facade.emit = lossy  # type: ignore[method-assign]
    return lost


def shared_cold_salt(facade: RetireEngine, salt: str = "retire:shared") -> None:
    """From now on every cold version of every scope runs under ``salt``."""
    facade.commands.cold_salt = lambda scope: salt  # type: ignore[method-assign]
