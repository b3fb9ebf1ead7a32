"""Fault injection against a running :class:`~retire_vllm.facade.RetireEngine` (tests only).

* :func:`corrupt_page` changes the KV bytes of one block in place on every rank: same block id,
  same counts, same hashes, other bytes (what a buggy kernel, a bad transfer or a stray write
  would leave behind).  The byte check at adoption must catch it.
* :func:`drop_references` releases every reference the facade holds on a block *without telling
  the core* (what a buggy release path would do): vLLM may then hand the block to someone else,
  and generation tracking (``GenerationSpy`` -> ``PageReused``) must catch it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import introspect as ix

if TYPE_CHECKING:
    from .facade import RetireEngine


def corrupt_page(facade: RetireEngine, block_id: int, layer: int = 0, value: float = 0.5) -> None:
    facade.executor.collective_rpc(ix.worker_corrupt_block, args=(block_id, layer, value))


def drop_references(facade: RetireEngine, block_id: int) -> int:
    """Release the facade's pin and retention references on ``block_id``; returns how many."""
    page: Any = facade._pages[block_id]
    block = facade.pool.blocks[block_id]
    refs = len(page.pins) + 1  # the pins and the retention reference
    for _ in range(refs):
        facade.pool.free_blocks([block])
    return refs
