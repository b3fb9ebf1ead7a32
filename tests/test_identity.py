"""The prefix identities the core compares (``retire_vllm.identity``), without vLLM: their byte
encoding is part of what a certificate means, so it is pinned here against a plain reference."""

from __future__ import annotations

import hashlib
import random
from typing import Any

import pytest

from retire_vllm.identity import (
    IDENTITY_HEX_CHARS,
    IdentityChain,
    OutputNames,
    adoptable_blocks,
    context_chain,
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


def _context_chain(tokens: tuple[int, ...], block_size: int) -> tuple[tuple[str, ...], Any]:
    return context_chain(
        tokens, tenant="acme", scope="s", numerical_mode="fp32-greedy", block_size=block_size
    )


@pytest.mark.parametrize("block_size", [1, 16])
@pytest.mark.parametrize("prompt_len", [1, 16, 17, 40, 48])
def test_output_names_equal_the_context_of_a_longer_prompt(
    block_size: int, prompt_len: int
) -> None:
    """A request's blocks past its context, named as its tokens grow (one decode token at a time,
    as the engine writes them), are named as the context of the next turn's prompt, which
    continues the request's prompt and output, names them; context blocks get no name."""
    rng = random.Random(prompt_len * 10 + block_size)
    prompt = tuple(rng.randrange(2**32) for _ in range(prompt_len))
    output = tuple(rng.randrange(2**32) for _ in range(5 * block_size + 3))
    context, chain = _context_chain(prompt, block_size)
    assert context == _identities(prompt, block_size) and chain.blocks == len(context)
    names = OutputNames(chain)
    tokens = list(prompt)
    named: dict[int, str] = {}
    for token in output:
        tokens.append(token)
        written = len(tokens) - 1  # the last sampled token's KV is not written yet
        full = written // block_size
        if full and full - 1 not in named:
            key = names.name(full - 1, tokens, written)
            if full - 1 < len(context):
                assert key is None
            else:
                assert key is not None
                named[full - 1] = key
        # a block some of whose tokens are not written (or not known) is never named
        assert names.name(full, tokens, written) is None
        assert names.name(full, tokens[: full * block_size], 10**9) is None
    later = _identities((*tokens, 1, 2, 3), block_size)
    assert named and all(later[i] == key for i, key in named.items())
    assert sorted(named) == list(range(len(context), (len(tokens) - 1) // block_size))
    # an earlier position asked again (another KV cache group's block of it) hashes nothing more
    blocks = chain.blocks
    assert all(names.name(i, tokens, len(tokens)) == key for i, key in named.items())
    assert chain.blocks == blocks


def test_the_chain_extends_block_by_block_without_rehashing_its_prefix() -> None:
    """Extending the chain hashes only the new blocks: the chain keeps the last digest and its
    count, and a longer sequence continues it exactly as one chain over the whole sequence."""
    rng = random.Random(3)
    tokens = tuple(rng.randrange(2048) for _ in range(8 * 16))
    whole = IdentityChain(tenant="acme", scope="s", numerical_mode="fp32-greedy", block_size=16)
    step = IdentityChain(tenant="acme", scope="s", numerical_mode="fp32-greedy", block_size=16)
    keys = whole.extend(tokens, 8)
    got = [*step.extend(tokens[:48], 3), *step.extend(tokens[:50], 3), *step.extend(tokens, 8)]
    assert got == keys and step.blocks == whole.blocks == 8
    assert keys[:7] == list(_identities(tokens, 16))  # the last-token rule: 7 of 8 in a context
    with pytest.raises(ValueError, match="not full"):
        step.extend(tokens, 9)
    with pytest.raises(ValueError, match=r"token ids must be ints"):
        step.extend((*tokens, *([2**32] * 16)), 9)
    assert step.blocks == 8  # a refused extension changes nothing
