"""Block digests of vLLM KV caches computed on the tensors' own device (CPU or CUDA).

A block's digest must not copy whole blocks to the host, and must be the same for the same K/V
values whatever the device or the physical layout. So, per layer: the requested blocks are
gathered along the layout's block axis *on the device* (``index_select``), read in their logical
order (a stride-ordered view is made contiguous on the device), their bytes viewed as int32 words
and reduced with fixed pseudo-random odd int64 weights, multiply-add with int64 wraparound. Only
integer arithmetic is used: sums modulo 2**64 do not depend on the reduction order, so every
device and kernel gives the same lanes. Two linear lanes change for *every* single-word change
(an odd weight is invertible modulo 2**64 and a word's change is below 2**33 in size); a third,
non-linear lane (mixed products) guards against changes that cancel in a linear sum. Only the
small lane vector (``LANES`` int64 per block per layer) comes to the host, where xxh3-128 over
the layers' shapes and lanes gives the usual 32-hex-digit digest string. :data:`LAYOUTS` is the
table of the layouts read: vLLM 0.32's ``KVCacheLayout`` family (every attention layer a logical
``[B, H, N, C]`` view, K and V side by side in ``C``, with the stride order of its layout) and
the shapes of older GPU backends (K/V-first FlashAttention, block-first FlashInfer, MLA).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import xxhash

if TYPE_CHECKING:
    import torch

#: int64 values per block per layer that reach the host.
LANES = 3
#: Per device type: about how many int32 words of blocks one pass reduces.
CHUNK_WORDS = {"cpu": 1 << 15, "cuda": 1 << 22}


@dataclass(frozen=True)
class Layout:
    """One KV cache layout: the per-layer tensor's logical shape, the block axis in it, and the
    physical order of that shape's axes in memory (a permutation; identity when contiguous)."""

    backend: str
    shape: str
    block_axis: int
    stride_order: tuple[int, ...]


#: Backend layout name -> how a block is found in one layer's KV tensor. vLLM 0.32.0 hands the
#: model runner (and KV connectors) one ``[B, H, N, C]`` view per layer for every attention
#: backend (``v1/worker/utils.allocate_kv_cache``, ``v1/kv_cache_interface.create_kv_cache_views``);
#: the backend only picks the stride order (``supported_kv_cache_layouts``; ``v1/kv_cache_layout``),
#: so the block is axis 0 and only the strides differ. Layer-interleaved layouts (``B`` before
#: ``L``) leave each layer's view non-contiguous in ``B``; ``LHBNC`` splits a block across heads.
LAYOUTS: dict[str, Layout] = {
    "LBHNC": Layout("CPU attention, ROCm (HND)", "[B, H, N, C]", 0, (0, 1, 2, 3)),
    "LBNHC": Layout("FlashAttention, FlexAttention, Triton (NHD)", "[B, H, N, C]", 0, (0, 2, 1, 3)),
    "LHBNC": Layout("ROCm attention (heads outermost)", "[B, H, N, C]", 0, (1, 0, 2, 3)),
    "BLHNC": Layout("FlashInfer HND, layer-interleaved", "[B, H, N, C]", 0, (0, 1, 2, 3)),
    "BLNHC": Layout("MLA indexer, layer-interleaved NHD", "[B, H, N, C]", 0, (0, 2, 1, 3)),
    "BHLNC": Layout("layer-interleaved HND, heads before layers", "[B, H, N, C]", 0, (0, 1, 2, 3)),
    "flash_attn_kv_first": Layout(
        "FlashAttention before 0.32", "[2, B, N, H, D]", 1, (0, 1, 2, 3, 4)
    ),
    "flashinfer_block_first": Layout(
        "FlashInfer before 0.32", "[B, 2, N, H, D]", 0, (0, 1, 2, 3, 4)
    ),
    "mla": Layout("MLA backends before 0.32", "[B, N, D]", 0, (0, 1, 2)),
}


def block_axis(shape: Sequence[int], num_blocks: int | None = None) -> int | None:
    """The block axis of a layer's KV tensor of ``shape`` (None if none fits ``num_blocks``):
    1 for the K/V-first ``[2, B, N, H, D]`` shape, else 0 (every other entry of :data:`LAYOUTS`)."""
    if len(shape) < 2:
        return None
    axis = 1 if len(shape) == 5 and shape[0] == 2 and shape[1] != 2 else 0
    if num_blocks is not None and int(shape[axis]) != num_blocks:
        return None
    return axis


def select_block(t: torch.Tensor, block_id: int) -> torch.Tensor:
    """One block of ``t`` (a view: writes through it reach the cache)."""
    axis = block_axis(tuple(t.shape))
    if axis is None:
        raise ValueError(f"KV cache shape {list(t.shape)} has no block axis")
    return t.select(axis, block_id)


_WEIGHTS: dict[tuple[int, str], Any] = {}


def _weights(n: int, device: torch.device) -> torch.Tensor:
    """``[LANES + 1, n]`` odd int64 weights, the same on every device (splitmix64 on the host,
    built once per word count and device)."""
    key = (n, str(device))
    w = _WEIGHTS.get(key)
    if w is None:
        import numpy as np
        import torch

        with np.errstate(over="ignore"):
            x = np.arange(1, (LANES + 1) * n + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
            x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
            x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
            x = (x ^ (x >> np.uint64(31))) | np.uint64(1)
        w = torch.from_numpy(x.view(np.int64).reshape(LANES + 1, n)).to(device)
        _WEIGHTS[key] = w
    return w


def block_lanes(
    t: torch.Tensor, block_ids: Sequence[int], *, engine: str | None = None
) -> torch.Tensor:
    """``[len(block_ids), LANES]`` int64 lanes of the given blocks of one layer, computed where
    ``t`` lives; only the selected blocks are gathered there, nothing goes to the host.
    ``engine``: ``"torch"`` (tensor ops on ``t.device``: what CUDA runs) or ``"numpy"`` (on the
    CPU tensor's own memory: torch's int64 reductions stall on a loaded CPU); default numpy for
    CPU tensors, torch elsewhere. Both give the same integers."""
    import torch

    axis = block_axis(tuple(t.shape))
    if axis is None:
        raise ValueError(f"KV cache shape {list(t.shape)} has no block axis")
    engine = engine or ("numpy" if t.device.type == "cpu" else "torch")
    ids = [int(b) for b in block_ids]
    per_block = max(
        1, math.prod(int(s) for s in t.shape) // int(t.shape[axis]) * t.element_size() // 4
    )
    # Blocks per pass: int64 temporaries of about CHUNK_WORDS words (cache-sized on a CPU).
    step = max(1, CHUNK_WORDS.get(t.device.type, CHUNK_WORDS["cpu"]) // per_block)
    if engine == "numpy":
        import numpy as np

        # the tensor's own memory, viewed as integers of its element size (numpy has no bf16)
        same_size = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
        host = t.detach().view(same_size[t.element_size()]).numpy()
        blocks = np.moveaxis(host, axis, 0)
        parts = [
            _lanes_numpy(_words(blocks[ids[i : i + step]], len(ids[i : i + step])))
            for i in range(0, len(ids), step)
        ]
        return torch.from_numpy(parts[0] if len(parts) == 1 else np.concatenate(parts))
    view = t.movedim(axis, 0)
    out = []
    for i in range(0, len(ids), step):
        index = torch.as_tensor(ids[i : i + step], dtype=torch.long, device=t.device)
        gathered = view.index_select(0, index).contiguous()  # on the device, these blocks only
        raw = gathered.reshape(len(index), -1).view(torch.uint8)
        if raw.shape[1] % 4:
            raw = torch.nn.functional.pad(raw, (0, 4 - raw.shape[1] % 4))
        out.append(_lanes_torch(raw.contiguous().view(torch.int32).to(torch.int64)))
    return out[0] if len(out) == 1 else torch.cat(out)


def _words(blocks: Any, k: int) -> Any:
    """``k`` gathered host blocks (contiguous, logical order) as ``[k, words]`` int32, the last
    word zero-padded."""
    import numpy as np

    raw = blocks.reshape(k, -1).view(np.uint8)
    if raw.shape[1] % 4:
        raw = np.pad(raw, ((0, 0), (0, 4 - raw.shape[1] % 4)))
    return np.ascontiguousarray(raw).view(np.int32)


def _lanes_torch(words: torch.Tensor) -> torch.Tensor:
    import torch

    w = _weights(words.shape[1], words.device)
    buf = torch.empty_like(words)
    lanes = [torch.mul(words, w[i], out=buf).sum(dim=1) for i in range(LANES - 1)]
    torch.mul(words, w[LANES - 1], out=buf)
    buf.bitwise_xor_(buf >> 29).mul_(w[LANES])
    lanes.append(buf.sum(dim=1))
    return torch.stack(lanes, dim=1)


def _lanes_numpy(words32: Any) -> Any:
    import numpy as np
    import torch

    words = words32.astype(np.int64)  # [k, n]
    w = _weights(words.shape[1], torch.device("cpu")).numpy()
    buf = np.empty_like(words)
    with np.errstate(over="ignore"):
        lanes = list((words @ w[: LANES - 1].T).T)
        np.multiply(words, w[LANES - 1], out=buf)
        np.bitwise_xor(buf, buf >> 29, out=buf)
        np.multiply(buf, w[LANES], out=buf)
        lanes.append(buf.sum(axis=1))
    return np.stack(lanes, axis=1).astype(np.int64)


def block_digests(
    layers: Sequence[torch.Tensor], block_ids: Sequence[int], *, engine: str | None = None
) -> dict[int, str]:
    """xxh3-128 hex digest per block over every layer's lanes and logical block shape, in layer
    order; one small device-to-host copy per layer (``engine``: see :func:`block_lanes`). KV
    tensors in host memory (the CPU backend) are hashed as bytes where they lie (``"bytes"``,
    their default): the lanes exist to avoid copying blocks off a device, and on a CPU they cost
    about 100x more than xxh3 over the block's bytes (0.25 ms against 2 us per 16 KiB block)."""
    ids = [int(b) for b in block_ids]
    if not ids:
        return {}
    hashers = [xxhash.xxh3_128() for _ in ids]
    if engine is None and all(t.device.type == "cpu" for t in layers):
        engine = "bytes"
    if engine == "bytes":
        import torch

        for t in layers:
            head = _head(t)
            for h, bid in zip(hashers, ids, strict=True):
                block = select_block(t, bid).contiguous().reshape(-1).view(torch.uint8)
                h.update(head)
                h.update(block.numpy().data)
        return {bid: h.hexdigest() for bid, h in zip(ids, hashers, strict=True)}
    for t in layers:
        lanes = block_lanes(t, ids, engine=engine).cpu().numpy()
        head = _head(t)
        for h, row in zip(hashers, lanes, strict=True):
            h.update(head)
            h.update(row.tobytes())
    return {bid: h.hexdigest() for bid, h in zip(ids, hashers, strict=True)}


def _head(t: torch.Tensor) -> bytes:
    """What the lanes are of: the dtype and one block's logical shape."""
    axis = block_axis(tuple(t.shape))
    return f"{t.dtype}|{[int(s) for i, s in enumerate(t.shape) if i != axis]}|".encode()


def host_reference_digests(
    layers: Sequence[torch.Tensor], block_ids: Sequence[int]
) -> dict[int, str]:
    """The same digests computed the plain way, from a host copy of each whole block (what the
    device digest avoids): the reference the device digest is checked against."""
    import numpy as np
    import torch

    out: dict[int, Any] = {int(b): xxhash.xxh3_128() for b in block_ids}
    for t in layers:
        head = _head(t)
        for bid, h in out.items():
            host = select_block(t, bid).cpu().contiguous().reshape(-1).view(torch.uint8)
            raw = host.numpy().tobytes()
            raw += b"\0" * (-len(raw) % 4)
            lanes = _lanes_numpy(np.frombuffer(raw, dtype=np.int32).reshape(1, -1))
            h.update(head)
            h.update(lanes[0].tobytes())
    return {bid: h.hexdigest() for bid, h in out.items()}
