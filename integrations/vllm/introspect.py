"""Read-and-poke access to the internals of an in-process vLLM 0.32 engine.

Every path into vLLM's private objects that the integration uses is written down here once:
from an ``LLMEngine`` built with ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` to its ``EngineCore``,
scheduler, KV cache manager, block pool and model runner; a running request's block ids and
block hashes; a digest of one KV block's bytes (all layers, K and V; computed on the KV tensors'
device, any GPU layout: :mod:`.kv_digest`) and an in-place corruption of those bytes (fault
injection); pinning cached blocks with ``BlockPool.touch`` and releasing them with
``BlockPool.free_blocks``; and a spy on ``BlockPool.get_new_blocks`` that keeps an ownership
generation per block id.  Worker-side helpers (``worker_*``) take the vLLM worker object and are
also usable through ``collective_rpc`` in multi-process executors.  The symbols relied on are
listed (and checked) in :mod:`.hooks`; findings are in ``docs/vllm_research.md``.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from . import kv_digest

if TYPE_CHECKING:
    import torch

    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.kv_cache_utils import KVCacheBlock
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.engine.core import EngineCore
    from vllm.v1.engine.llm_engine import LLMEngine


# --- engine-core side ------------------------------------------------------------------------


def engine_core(engine: LLMEngine) -> EngineCore:
    """The in-process ``EngineCore`` (``engine.engine_core`` is an ``InprocClient``)."""
    client = engine.engine_core
    core = getattr(client, "engine_core", None)
    if core is None:
        raise RuntimeError(
            "engine core is not in-process; build the engine with "
            "VLLM_ENABLE_V1_MULTIPROCESSING=0 (see retire_vllm.engine_config.build_engine)"
        )
    return core  # type: ignore[no-any-return]


# --- several in-process engines in one process ---------------------------------------------

# In-process engine cores not shut down yet. vLLM keeps its distributed state (the world, TP and
# PP groups) in module globals shared by every in-process engine, and ``EngineCore.shutdown``
# tears it down (``cleanup_dist_env_and_memory``): shutting one engine down, or the garbage
# collector finalizing a dropped one, broke every other engine of the process at its next step
# ("pipeline model parallel group is not initialized").
_LIVE_CORES: weakref.WeakSet[Any] = weakref.WeakSet()


def share_distributed_state(engine: LLMEngine) -> None:
    """Let ``engine`` live beside other in-process engines: from now on an engine core's
    shutdown leaves vLLM's process-wide distributed state alone while another registered core
    is still running, and the last one to shut down tears it down as vLLM would. Every engine
    core built after the first call registers itself, however it was built (a plain vLLM
    engine beside a Retire one included). Idempotent."""
    import importlib

    # (typed as Any: this patches vLLM's module and class in place)
    core_module: Any = importlib.import_module("vllm.v1.engine.core")
    _LIVE_CORES.add(engine_core(engine))
    cls: Any = core_module.EngineCore
    if getattr(cls.shutdown, "_retire_shared", False):
        return
    original_init: Callable[..., None] = cls.__init__

    @functools.wraps(original_init)  # (the hooks check reads vLLM's signature through it)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        _LIVE_CORES.add(self)

    cls.__init__ = __init__
    original: Callable[[Any], None] = cls.shutdown

    def shutdown(self: Any) -> None:
        _LIVE_CORES.discard(self)
        if not _LIVE_CORES:
            original(self)
            return
        teardown = core_module.cleanup_dist_env_and_memory
        core_module.cleanup_dist_env_and_memory = _keep_distributed_state
        try:
            original(self)
        finally:
            core_module.cleanup_dist_env_and_memory = teardown

    shutdown._retire_shared = True  # type: ignore[attr-defined]
    cls.shutdown = shutdown


def _keep_distributed_state(*_: Any, **__: Any) -> None:
    """``cleanup_dist_env_and_memory`` while other in-process engines still run: nothing to
    tear down (their groups are the same ones)."""
    return None


def scheduler(engine: LLMEngine) -> Scheduler:
    return engine_core(engine).scheduler  # type: ignore[return-value]


def kv_cache_manager(engine: LLMEngine) -> KVCacheManager:
    return scheduler(engine).kv_cache_manager


def block_pool(engine: LLMEngine) -> BlockPool:
    return kv_cache_manager(engine).block_pool


def request_block_ids(engine: LLMEngine, request_id: str, group: int = 0) -> list[int]:
    """Block ids (in token order) held by a live request (internal id), KV cache group ``group``."""
    return list(kv_cache_manager(engine).get_block_ids(request_id)[group])


#: The managers (by class name, exactly: a subclass may do more) whose per-request block list,
#: between two schedules of the request, only grows at its end or turns entries into the null
#: block (a sliding window passing them); a partial prefix hit's copy-on-write replaces a block
#: within the call that first fills the list. Retire accepts only the groups these serve
#: (``observe.kv_windows``).
APPEND_ONLY_MANAGERS = frozenset({"FullAttentionManager", "SlidingWindowManager"})


def manager_block_lists(kvm: Any, request_id: str) -> list[list[Any]]:
    """The request's block list (``KVCacheBlock``) in every KV cache group: each group
    manager's own list, not a copy (an empty new list where it holds none), so the caller can
    tell by identity whether it is the list it read at an earlier step."""
    return [
        manager.req_to_blocks.get(request_id) or []
        for manager in kvm.coordinator.single_type_managers
    ]


def append_only_groups(kvm: Any) -> tuple[bool, ...]:
    """Per KV cache group, whether its manager is one of :data:`APPEND_ONLY_MANAGERS`."""
    return tuple(
        type(m).__name__ in APPEND_ONLY_MANAGERS for m in kvm.coordinator.single_type_managers
    )


def sliding_window_groups(kvm: Any) -> tuple[int, ...]:
    """The KV cache groups whose manager is a ``SlidingWindowManager``: it replaces the blocks
    its window passed by the null block, in place, and frees them."""
    return tuple(
        g
        for g, m in enumerate(kvm.coordinator.single_type_managers)
        if type(m).__name__ == "SlidingWindowManager"
    )


def manager_block_tables(kvm: Any, request_id: str) -> list[list[int]]:
    """The request's block table in every KV cache group (``kvm.get_block_ids(request_id)``),
    read straight from each group's per-request block list instead of through a
    ``KVCacheBlocks``. A sliding-window group holds the null block (:func:`null_block_id`)
    where its window has passed."""
    return [[b.block_id for b in blocks] for blocks in manager_block_lists(kvm, request_id)]


def null_block_id(kvm: Any) -> int:
    """The id of vLLM's null block: the placeholder a sliding-window group keeps for positions
    its window has passed (it holds no KV of any request and is never a page)."""
    return int(kvm.block_pool.null_block.block_id)


def request_block_hashes(engine: LLMEngine, request_id: str) -> list[bytes]:
    """Chained hashes of the request's *full* blocks (prompt and, later, output tokens)."""
    return list(scheduler(engine).requests[request_id].block_hashes)


def set_cache_salt(request: Any, salt: str) -> None:
    """Put a request that no scheduler holds yet under ``salt``: its block hashes chain from the
    salt (vLLM folds ``cache_salt`` into the first block's hash), so they are computed again."""
    request.cache_salt = salt
    request.block_hashes.clear()
    request.update_block_hashes()


def cached_blocks_for_hashes(
    pool: BlockPool, hashes: Sequence[bytes], group: int = 0
) -> list[KVCacheBlock]:
    """Longest prefix of ``hashes`` still mapped in the prefix cache, as block objects."""
    found: list[KVCacheBlock] = []
    for h in hashes:
        hit = pool.get_cached_block(h, [group])  # type: ignore[arg-type]
        if hit is None:
            break
        found.append(hit[0])
    return found


def pin_blocks(pool: BlockPool, blocks: Sequence[KVCacheBlock]) -> None:
    """Take one reference on each block; a block with ref_cnt > 0 is never evicted or reused."""
    pool.touch(blocks)


def unpin_blocks(pool: BlockPool, blocks: Sequence[KVCacheBlock]) -> None:
    """Drop the references taken by :func:`pin_blocks` (tail first, so tails are evicted first)."""
    pool.free_blocks(list(reversed(blocks)))


class GenerationSpy:
    """Counts (re)allocations per block id by wrapping ``BlockPool.get_new_blocks``.

    Every block handed out by ``get_new_blocks`` (new request blocks, CoW copies, ...) has a new
    owner, so its generation is bumped; ``evicted`` records the ids whose prefix-cache hash was
    dropped at that moment and ``evictions`` counts those drops. Each structure is bounded by
    the pool (one entry per block id), never by how long the engine runs.  Install with
    :meth:`install`, remove with :meth:`uninstall`.
    """

    def __init__(self, pool: BlockPool) -> None:
        self.pool = pool
        self.generation: dict[int, int] = {}
        self.evicted: set[int] = set()
        self.evictions = 0
        self.listeners: list[Callable[[list[int]], None]] = []
        self._orig: Callable[[int], list[KVCacheBlock]] | None = None

    def install(self) -> GenerationSpy:
        if self._orig is not None:
            return self
        orig = self.pool.get_new_blocks
        self._orig = orig
        pool = self.pool

        def get_new_blocks(num_blocks: int) -> list[KVCacheBlock]:
            # Hashed blocks at the LRU head lose their hash inside orig(); note them first.
            head = pool.free_block_queue.fake_free_list_head.next_free_block
            hashed: set[int] = set()
            blk = head
            for _ in range(num_blocks):
                if blk is None or blk.block_id < 0:
                    break
                if blk.block_hash is not None:
                    hashed.add(blk.block_id)
                blk = blk.next_free_block
            blocks = orig(num_blocks)
            ids = [b.block_id for b in blocks]
            for bid in ids:
                self.generation[bid] = self.generation.get(bid, 0) + 1
            if hashed:
                dropped = [bid for bid in ids if bid in hashed]
                self.evicted.update(dropped)
                self.evictions += len(dropped)
            for listener in self.listeners:
                listener(ids)
            return blocks

        pool.get_new_blocks = get_new_blocks  # type: ignore[method-assign]
        return self

    def uninstall(self) -> None:
        if self._orig is not None:
            del self.pool.get_new_blocks  # drop the instance attribute; class method shows again
            self._orig = None

    def gen(self, block_id: int) -> int:
        return self.generation.get(block_id, 0)


# --- worker side -----------------------------------------------------------------------------


def driver_worker(engine: LLMEngine) -> Any:
    """The rank-0 worker (``CPUWorker``) of a ``UniProcExecutor`` (in-process, TP=1)."""
    executor: Any = engine_core(engine).model_executor
    wrapper = executor.driver_worker
    return wrapper.worker


def kv_caches(worker: Any) -> list[torch.Tensor]:
    """Per-layer KV tensors of a worker, layer order.

    vLLM 0.32 gives every attention layer a logical view ``[num_blocks, num_kv_heads_per_rank,
    block_size, 2 * head_size]`` (K and V side by side) whose strides follow the backend's
    ``KVCacheLayout`` (CPU: ``LBHNC``, contiguous); ``t[block_id]`` is one block. The layouts
    read are listed in :data:`.kv_digest.LAYOUTS`.
    """
    return list(worker.model_runner.kv_caches)


def worker_block_digest(worker: Any, block_id: int) -> str:
    """Digest of block ``block_id`` over every layer (K and V), layer order: see
    :mod:`.kv_digest` (computed on the KV tensors' device, any vLLM GPU layout). The digest
    detects bytes that changed by accident (a stale writer, a reused block); it does not have
    to resist an adversary choosing KV bytes."""
    return kv_digest.block_digests(kv_caches(worker), [block_id])[block_id]


def worker_block_digests(worker: Any, block_ids: Iterable[int]) -> dict[int, str]:
    """:func:`worker_block_digest` of many blocks at once (one gather per layer)."""
    return kv_digest.block_digests(kv_caches(worker), list(block_ids))


def worker_kv_layout_problem(worker: Any, num_blocks: int) -> str | None:
    """Why this worker's KV caches cannot be read block by block as the digests and the fault
    injection read them (None if they can): each layer must hold data (any device: CPU, CUDA)
    and have a block axis of the pool's ``num_blocks`` blocks in one of the layouts of
    :data:`.kv_digest.LAYOUTS`."""
    for i, t in enumerate(kv_caches(worker)):
        if t.device.type == "meta":
            return f"layer {i}: the KV cache is on {t.device} and holds no bytes to digest"
        if kv_digest.block_axis(tuple(t.shape), num_blocks) is None:
            return (
                f"layer {i}: KV cache shape {list(t.shape)} has no axis of the pool's "
                f"{num_blocks} blocks in a known layout (retire_vllm.kv_digest.LAYOUTS)"
            )
    return None


def worker_corrupt_block(worker: Any, block_id: int, layer: int = 0, value: float = 0.5) -> None:
    """Overwrite block ``block_id`` of one layer in place (same id, same counts, other bytes)."""
    with __import__("torch").no_grad():
        kv_digest.select_block(kv_caches(worker)[layer], block_id).add_(value)


def worker_receipt(worker: Any, block_ids: Sequence[int]) -> dict[str, Any]:
    """A per-rank receipt: rank, KV shapes and digests of ``block_ids`` (for collective_rpc)."""
    return {
        "rank": int(getattr(worker, "rank", -1)),
        "local_rank": int(getattr(worker, "local_rank", -1)),
        "kv_shape": [list(t.shape) for t in kv_caches(worker)],
        "digests": worker_block_digests(worker, block_ids),
    }


def block_digest(engine: LLMEngine, block_id: int) -> str:
    """:func:`worker_block_digest` on the in-process driver worker."""
    return worker_block_digest(driver_worker(engine), block_id)


def corrupt_block(engine: LLMEngine, block_id: int, layer: int = 0, value: float = 0.5) -> None:
    """:func:`worker_corrupt_block` on the in-process driver worker."""
    worker_corrupt_block(driver_worker(engine), block_id, layer, value)
