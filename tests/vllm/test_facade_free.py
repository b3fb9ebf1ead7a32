"""``BlockLedger.free`` (a ``Free`` command, for the facade and the serving path alike) hands the
blocks back to vLLM's ``BlockPool`` in one ``evict_blocks`` and one ``free_blocks`` call, and the
blocks must come out where one call per block put them: at the front of the free queue, the
last freed first (which blocks the next allocations get is the same as before the batching)."""

from __future__ import annotations

from typing import Any

import pytest

from retire_vllm.errors import IntegrationError
from retire_vllm.serving.ledger import BlockLedger

pytestmark = pytest.mark.vllm


def _pool_with_cached_blocks() -> tuple[Any, list[int]]:
    from vllm.v1.core.block_pool import BlockPool

    pool = BlockPool(num_gpu_blocks=10, enable_caching=True, hash_block_size=16)
    blocks = pool.get_new_blocks(6)  # one reference each, as the facade's retention holds
    return pool, [b.block_id for b in blocks]


def _free_queue(pool: Any) -> list[int]:
    return [b.block_id for b in pool.free_block_queue.get_all_free_blocks()]


def _one_call_per_block(freed: list[int]) -> list[int]:
    pool, _ = _pool_with_cached_blocks()
    for p in freed:
        pool.evict_blocks({p})
        pool.free_blocks([pool.blocks[p]])
    return _free_queue(pool)


def _ledger(pool: Any, ids: list[int]) -> BlockLedger:
    """A ledger retaining each block (it takes its own reference, as at allocation)."""
    ledger = BlockLedger(pool)
    for i, p in enumerate(ids):
        ledger.retain(p, "s", 0, "r", i, "salt")
        pool.free_blocks([pool.blocks[p]])  # the allocation's own reference: the request's
    return ledger


def _through_the_facade(freed: list[int]) -> tuple[list[int], dict[int, Any]]:
    pool, ids = _pool_with_cached_blocks()
    ledger = _ledger(pool, ids)
    ledger.free(freed)
    return _free_queue(pool), ledger.refs


def test_free_returns_blocks_in_the_order_of_one_call_per_block() -> None:
    _, ids = _pool_with_cached_blocks()
    freed = [ids[3], ids[0], ids[4], ids[1]]
    queue, pages = _through_the_facade(freed)
    assert queue == _one_call_per_block(freed)
    assert queue[:4] == list(reversed(freed))  # the last freed is handed out first
    assert sorted(pages) == sorted(set(ids) - set(freed))


def test_free_of_a_pinned_block_is_refused_and_changes_nothing() -> None:
    pool, ids = _pool_with_cached_blocks()
    ledger = _ledger(pool, ids)
    ledger.pin(ids[2])
    before = _free_queue(pool)
    with pytest.raises(IntegrationError, match="while it is pinned"):
        ledger.free((ids[0], ids[2]))
    assert sorted(ledger.refs) == sorted(ids) and _free_queue(pool) == before
