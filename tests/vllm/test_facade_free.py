"""``RetireEngine._free`` hands a whole ``Free`` command's blocks back to vLLM's ``BlockPool``
in one ``evict_blocks`` and one ``free_blocks`` call, and the blocks must come out where one
call per block put them: at the front of the free queue, the last freed first (which blocks
the next allocations get is the same as before the batching)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

import retire_core as rc
from retire_vllm.facade import RetireEngine, _Page

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


def _facade(pool: Any, ids: list[int]) -> Any:
    """What ``RetireEngine._free`` reads of a facade: the pool, a retained page per block id."""
    return SimpleNamespace(
        pool=pool,
        _pages={p: _Page(p, "s", 0, "r", i, "salt", 0) for i, p in enumerate(ids)},
        _reqs={},
        _ours=lambda page, gen: True,
        _forget_closed_requests=lambda: None,
    )


def _through_the_facade(freed: list[int]) -> tuple[list[int], dict[int, Any]]:
    pool, ids = _pool_with_cached_blocks()
    facade = _facade(pool, ids)
    RetireEngine._free(facade, rc.Free(tuple(freed)))
    return _free_queue(pool), facade._pages


def test_free_returns_blocks_in_the_order_of_one_call_per_block() -> None:
    _, ids = _pool_with_cached_blocks()
    freed = [ids[3], ids[0], ids[4], ids[1]]
    queue, pages = _through_the_facade(freed)
    assert queue == _one_call_per_block(freed)
    assert queue[:4] == list(reversed(freed))  # the last freed is handed out first
    assert sorted(pages) == sorted(set(ids) - set(freed))


def test_free_of_a_pinned_block_is_refused_and_changes_nothing() -> None:
    from retire_vllm.facade import IntegrationError

    pool, ids = _pool_with_cached_blocks()
    facade = _facade(pool, ids)
    facade._pages[ids[2]].pins.append(0)
    before = _free_queue(pool)
    with pytest.raises(IntegrationError, match="while the facade pins it"):
        RetireEngine._free(facade, rc.Free((ids[0], ids[2])))
    assert sorted(facade._pages) == sorted(ids) and _free_queue(pool) == before
