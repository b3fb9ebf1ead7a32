"""Shared pieces of the vLLM facade tests: engines built with ``RetireScheduler``, token
generators, and the "no leak" check that runs after every test."""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from retire_vllm import introspect as ix


def build(num_blocks: int = 256, **kwargs: Any) -> Any:
    """An in-process ``LLMEngine`` over the tiny default model with ``RetireScheduler``."""
    from retire_vllm.engine_config import build_engine
    from retire_vllm.scheduler import RetireScheduler

    return build_engine(num_blocks=num_blocks, scheduler_cls=RetireScheduler, **kwargs)


def module_engine(num_blocks: int = 256, **kwargs: Any) -> Iterator[Any]:
    """A module fixture's engine (``build``), shut down once the module's tests are done."""
    eng = build(num_blocks, **kwargs)
    try:
        yield eng
    finally:
        shutdown(eng)


def build_reference(num_blocks: int = 256) -> Any:
    """A second engine for clean references: shares nothing with the engine under test."""
    from retire_vllm.engine_config import build_engine

    return build_engine(num_blocks=num_blocks)


def shutdown(engine: Any) -> None:
    engine.engine_core.shutdown()


def tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(1, 2048) for _ in range(n)]


def assert_engine_clean(engine: Any) -> None:
    """Every usable block is free and nothing is pinned: no request, pin or reference left."""
    pool = ix.block_pool(engine)
    assert not ix.scheduler(engine).has_unfinished_requests()
    assert pool.get_num_free_blocks() == pool.num_gpu_blocks - 1, (
        f"{pool.num_gpu_blocks - 1 - pool.get_num_free_blocks()} blocks still referenced"
    )
    assert all(b.ref_cnt == 0 for b in pool.blocks[1:])


@contextmanager
def attached(engine: Any, **kwargs: Any) -> Iterator[Any]:
    """A ``RetireEngine`` over ``engine`` for one test; closing it checks for leaks (raises
    ``LeakError``), and the engine must then be completely free."""
    from retire_vllm.facade import RetireEngine

    facade = RetireEngine(engine=engine, **kwargs)
    try:
        yield facade
    finally:
        facade.close()
    assert_engine_clean(engine)


def flood(facade: Any, rng: random.Random, block_size: int = 32) -> None:
    """External co-tenants that together allocate more blocks than are free: every unpinned,
    unreferenced cached block is evicted and its id handed to someone else."""
    free = facade.pool.get_num_free_blocks()
    per = 100
    n = free // per + 1
    for i in range(n):
        facade.add_external(f"cotenant-{id(facade)}-{i}", tokens(rng, per * block_size - 40), 2)
    facade.run_until_idle()
    for rid in list(facade.external):
        assert facade.external.pop(rid).finished
