"""Block digests on vLLM's GPU KV cache layouts, tested on CPU tensors shaped and strided like
each layout (``retire_vllm.kv_digest``): the layout table agrees with vLLM 0.32's own
``KVCacheLayout``; the same K/V values give the same digests in every layout, on the torch path
(what CUDA runs) and the numpy path alike, and equal the digests computed from host copies;
changing one element of one block changes that block's digest and no other."""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch

from retire_bench.gpu_digest import layer_in_layout
from retire_vllm import introspect as ix
from retire_vllm import kv_digest as kd

B, H, N, D = 6, 2, 16, 8  # blocks, KV heads, tokens per block, head size
VLLM_LAYOUTS = ["LBHNC", "LBNHC", "LHBNC", "BLHNC", "BLNHC", "BHLNC"]
LEGACY = ["flash_attn_kv_first", "flashinfer_block_first"]


def _values(dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """Logical K/V of one layer: ``[B, H, N, 2 * D]`` (K then V on the content axis)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, H, N, 2 * D, generator=g).to(dtype)


def _layer(values: torch.Tensor, name: str) -> torch.Tensor:
    """Layer 1 of a two-layer cache in layout ``name`` (stride-ordered as vLLM allocates it)."""
    return layer_in_layout(values, name, layers=2, layer=1)  # type: ignore[no-any-return]


def test_the_layout_table_matches_vllm() -> None:
    from vllm.v1.kv_cache_layout import KVCacheLayout

    assert {m.name for m in KVCacheLayout} == set(VLLM_LAYOUTS)
    for name in VLLM_LAYOUTS:
        assert kd.LAYOUTS[name].stride_order == KVCacheLayout[name].layer_view_order
        assert tuple("LBHNC".index(c) for c in name) == KVCacheLayout[name].stride_order
        t = _layer(_values(torch.float32), name)
        assert kd.block_axis(tuple(t.shape), B) == kd.LAYOUTS[name].block_axis == 0
        assert t.is_contiguous() == (name == "LBHNC")  # the others are stride-ordered views
    for name in LEGACY:
        t = _layer(_values(torch.float32), name)
        assert kd.block_axis(tuple(t.shape), B) == kd.LAYOUTS[name].block_axis
    assert kd.block_axis((B, N, D), B) == kd.LAYOUTS["mla"].block_axis
    assert kd.block_axis((3, B, N), B) is None and kd.block_axis((B,), B) is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_same_values_give_the_same_digests_in_every_layout(dtype: torch.dtype) -> None:
    values, other = _values(dtype), _values(dtype, seed=1)
    ids = list(range(B))
    for family in (VLLM_LAYOUTS, LEGACY):
        seen, seen_bytes = set(), set()
        for name in family:
            layers = [_layer(values, name), _layer(other, name)]
            digests = kd.block_digests(layers, ids, engine="numpy")
            assert kd.block_digests(layers, ids, engine="torch") == digests
            assert kd.host_reference_digests(layers, ids) == digests
            assert len(set(digests.values())) == B
            seen.add(tuple(digests[b] for b in ids))
            # host memory: the bytes as they lie, in the block's logical order
            seen_bytes.add(tuple(kd.block_digests(layers, ids)[b] for b in ids))
        assert len(seen) == 1, family
        assert len(seen_bytes) == 1, family


@pytest.mark.parametrize("name", [*VLLM_LAYOUTS, *LEGACY, "mla"])
@pytest.mark.parametrize("engine", ["torch", "numpy", "bytes"])
def test_one_changed_element_changes_exactly_its_blocks_digest(name: str, engine: str) -> None:
    rng = random.Random(name)
    if name == "mla":
        layers = [torch.randn(B, N, D), torch.randn(B, N, D)]
    else:
        layers = [_layer(_values(torch.bfloat16), name), _layer(_values(torch.bfloat16, 1), name)]
    ids = list(range(B))
    before = kd.block_digests(layers, ids, engine=engine)
    for _ in range(4):
        layer, block = rng.randrange(len(layers)), rng.randrange(B)
        cell = kd.select_block(layers[layer], block)
        index = tuple(rng.randrange(s) for s in cell.shape)
        old = cell[index].item()
        cell[index] = old + 1.0
        after = kd.block_digests(layers, ids, engine=engine)
        assert [b for b in ids if after[b] != before[b]] == [block]
        if engine != "bytes":
            assert kd.host_reference_digests(layers, ids) == after
        cell[index] = old
        assert kd.block_digests(layers, ids, engine=engine) == before


def test_one_flipped_bit_is_seen_in_every_word_position() -> None:
    """Every byte of a block counts: flipping any single bit of one block's bytes changes it."""
    t = torch.zeros(3, 1, 2, 6, dtype=torch.uint8)  # 12 bytes a block: three int32 words
    base = kd.block_digests([t], [0, 1, 2], engine="torch")
    for i in range(12):
        for bit in (0, 7):
            t.view(3, -1)[1, i] ^= 1 << bit
            now = kd.block_digests([t], [0, 1, 2], engine="torch")
            assert now[1] != base[1] and now[0] == base[0] and now[2] == base[2]
            t.view(3, -1)[1, i] ^= 1 << bit


def test_odd_sized_blocks_and_many_blocks_per_pass() -> None:
    """Blocks whose bytes are not whole words are padded; many blocks split into passes."""
    t = torch.arange(7 * 3, dtype=torch.uint8).reshape(7, 3)
    assert kd.block_digests([t], range(7), engine="numpy") == kd.host_reference_digests(
        [t], range(7)
    )
    big = torch.randn(40, 4, 64, 64)  # 64 KiB blocks: one block per pass on a CPU
    ids = [39, 0, 5, 5]
    assert kd.block_digests([big], ids, engine="torch") == kd.host_reference_digests([big], ids)


def _worker(*caches: torch.Tensor) -> Any:
    return type("W", (), {"model_runner": type("R", (), {"kv_caches": list(caches)})()})()


@pytest.mark.parametrize("name", [*VLLM_LAYOUTS, *LEGACY])
def test_workers_with_gpu_layouts_are_read_and_corrupted_block_by_block(name: str) -> None:
    """The attach check accepts each layout; the campaign's corruption reaches exactly the
    block, and the receipts' digests see it."""
    worker = _worker(_layer(_values(torch.float32), name), _layer(_values(torch.float32), name))
    assert ix.worker_kv_layout_problem(worker, B) is None
    assert ix.worker_kv_layout_problem(worker, B + 1) is not None
    before = ix.worker_block_digests(worker, range(B))
    ix.worker_corrupt_block(worker, 3, layer=1)
    after = ix.worker_receipt(worker, list(range(B)))["digests"]
    assert [b for b in range(B) if after[b] != before[b]] == [3]
    assert ix.worker_block_digest(worker, 3) == after[3]
