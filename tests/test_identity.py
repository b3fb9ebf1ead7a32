"""The prefix identities the core compares (``retire_vllm.identity``), without vLLM: their byte
encoding is part of what a certificate means, so it is pinned here against a plain reference."""

from __future__ import annotations

import hashlib
import random

import pytest

from retire_vllm.identity import (
    IDENTITY_HEX_CHARS,
    adoptable_blocks,
    lineage_seed,
    prefix_identities,
)


def _reference(tokens: tuple[int, ...], block_size: int) -> tuple[str, ...]:
    """``identity[i] = sha256(identity[i-1] || token ids as 4 bytes little-endian unsigned)``."""
    prev = lineage_seed("acme", "s", "fp32-greedy", block_size)
    out = []
    for i in range(adoptable_blocks(len(tokens), block_size)):
        block = tokens[i * block_size : (i + 1) * block_size]
        encoded = b"".join(t.to_bytes(4, "little", signed=False) for t in block)
        prev = hashlib.sha256(prev + encoded).digest()
        out.append(prev.hex()[:IDENTITY_HEX_CHARS])
    return tuple(out)


def _identities(tokens: tuple[int, ...], block_size: int) -> tuple[str, ...]:
    return prefix_identities(
        tokens, tenant="acme", scope="s", numerical_mode="fp32-greedy", block_size=block_size
    )


@pytest.mark.parametrize("block_size", [1, 16, 32])
@pytest.mark.parametrize("length", [0, 1, 16, 17, 33, 4000])
def test_identities_hash_each_block_as_little_endian_uint32(block_size: int, length: int) -> None:
    rng = random.Random(length * 100 + block_size)
    tokens = tuple(rng.randrange(2**32) for _ in range(length))
    got = _identities(tokens, block_size)
    assert got == _reference(tokens, block_size)
    assert len(got) == adoptable_blocks(length, block_size)


def test_a_shared_token_prefix_shares_identities_and_nothing_after() -> None:
    rng = random.Random(7)
    a = tuple(rng.randrange(2048) for _ in range(100))
    b = a[:40] + tuple(rng.randrange(2048) for _ in range(60))
    ia, ib = _identities(a, 16), _identities(b, 16)
    assert ia[:2] == ib[:2] and ia[2] != ib[2]  # 40 shared tokens: two full blocks
    # byte order matters: 1 and 256 swapped within a block changes the identity
    assert _identities((1, 256) * 8 + (0,), 16) != _identities((256, 1) * 8 + (0,), 16)


@pytest.mark.parametrize("bad", [-1, 2**32])
def test_a_token_id_outside_uint32_is_refused(bad: int) -> None:
    with pytest.raises(ValueError, match=r"token ids must be ints in \[0, 2\*\*32\)"):
        _identities((5,) * 20 + (bad,) + (5,) * 20, 16)
