"""Prefix identities, configuration fingerprints and cache salts for the vLLM integration.

The core compares predecessor pages with a revised context block by block, using a *prefix
identity* per full block.  We use our own chained sha256 over the token ids, not vLLM's
``hash_block_tokens`` chain:

* ``identity[i] = sha256(identity[i-1] || tokens[i*B:(i+1)*B])`` with a seed that names the
  lineage (tenant, scope) and the numerical mode of the version's contract.  Two versions of a
  scope that share a token prefix share the identities of that prefix, *whatever physical cache
  salt each ran under*; a version under another numerical mode shares nothing.
* vLLM's own block hashes include the request's ``cache_salt`` (the *physical* salt, which
  decides which cached blocks vLLM may find as a prefix hit).  Keeping the salt out of the
  identity lets a cold successor run under an independent salt and still have its pages
  certified later; which physical salt a warm successor must use is then a facade concern (the
  salt of the certified pages), and the facade checks before scheduling the successor that
  vLLM's hit is exactly the adopted block ids.
* Our chain does not depend on vLLM internals (hash function, NONE_HASH seed, extra keys), so
  an upgrade of vLLM cannot silently change what the core compares.

Only blocks that vLLM can serve as a prefix hit for the prompt get an identity:
vLLM caps a hit at ``len(prompt) - 1`` tokens (a prompt of exactly ``k`` full blocks reuses at
most ``k - 1``), so the context of a prompt of ``n`` tokens has ``(n - 1) // B`` entries.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

IDENTITY_HEX_CHARS = 32  # 128 bits of sha256 per block key: short log lines, no collisions


def lineage_seed(tenant: str, scope: str, numerical_mode: str, block_size: int) -> bytes:
    text = f"retire-identity-v1|tenant={tenant}|scope={scope}|mode={numerical_mode}|B={block_size}"
    return hashlib.sha256(text.encode()).digest()


def adoptable_blocks(num_tokens: int, block_size: int) -> int:
    """Full blocks of a prompt that vLLM may serve from the prefix cache (last-token rule)."""
    return max(0, (num_tokens - 1) // block_size)


def prefix_identities(
    tokens: Sequence[int], *, tenant: str, scope: str, numerical_mode: str, block_size: int
) -> tuple[str, ...]:
    """The core's context for a prompt: one chained identity per adoptable full block."""
    n = adoptable_blocks(len(tokens), block_size)
    prev = lineage_seed(tenant, scope, numerical_mode, block_size)
    # each token id as 4 bytes, little-endian, unsigned: one ``struct.pack`` per block (a
    # revision of a 4,000-token prompt hashes its context on the revision's critical path)
    pack = struct.Struct(f"<{block_size}I").pack
    sha256 = hashlib.sha256
    out: list[str] = []
    for i in range(n):
        h = sha256(prev)
        try:
            h.update(pack(*tokens[i * block_size : (i + 1) * block_size]))
        except struct.error as err:
            raise ValueError(f"token ids must be ints in [0, 2**32): {err}") from None
        prev = h.digest()
        out.append(prev.hex()[:IDENTITY_HEX_CHARS])
    return tuple(out)


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def expected_adopted_blocks(
    predecessor: Sequence[int], successor: Sequence[int], block_size: int
) -> int:
    """Blocks a warm successor adopts when nothing fails: the common prefix rounded down to full
    blocks, within the last-token rule of both prompts (a predecessor block has an identity
    only if vLLM could have served it for the predecessor's prompt)."""
    return min(
        common_prefix_len(predecessor, successor) // block_size,
        adoptable_blocks(len(predecessor), block_size),
        adoptable_blocks(len(successor), block_size),
    )


def fingerprint(
    *, model: str, dtype: str, block_size: int, tenant: str, tensor_parallel_size: int
) -> str:
    """The configuration fingerprint of a scope's pages (the core compares it verbatim)."""
    return (
        f"model={model}|dtype={dtype}|block={block_size}|adapter=none|layout=LBHNC"
        f"|tp={tensor_parallel_size}|tenant={tenant}"
    )
