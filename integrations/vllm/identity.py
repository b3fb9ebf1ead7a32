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
The blocks past it -- a version's own output, and a last full prompt block the rule leaves out --
are named by the engine when their writers close (``OutputNames``: the same chain, continued
incrementally over the request's token ids), so that the next turn of a conversation, whose prompt
continues the previous prompt and output, may inherit them; the core decides whether a name counts.
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


class IdentityChain:
    """The chained identities of one token sequence's full blocks, computed block by block as
    the sequence grows: it keeps only the last block's full digest and how many blocks it has
    chained (``blocks``), so extending it by a block hashes that block's tokens alone, whatever
    its position. ``prefix_identities`` is a chain extended over a prompt's adoptable blocks;
    the same chain extended over a request's generated tokens names the blocks of its output
    exactly as the context of a later prompt that starts with those tokens names them."""

    __slots__ = ("_digest", "_pack", "block_size", "blocks")

    def __init__(self, *, tenant: str, scope: str, numerical_mode: str, block_size: int) -> None:
        self.block_size = block_size
        self.blocks = 0
        self._digest = lineage_seed(tenant, scope, numerical_mode, block_size)
        # each token id as 4 bytes, little-endian, unsigned: one ``struct.pack`` per block (a
        # revision of a 4,000-token prompt hashes its context on the revision's critical path)
        self._pack = struct.Struct(f"<{block_size}I").pack

    def extend(self, tokens: Sequence[int], blocks: int) -> list[str]:
        """Chain blocks ``self.blocks`` to ``blocks - 1`` of ``tokens`` (the sequence this chain
        has read so far, grown; each of those blocks full in it): their identities, in order. All
        or nothing: a token id outside uint32 raises ``ValueError`` and changes nothing."""
        size = self.block_size
        if blocks > self.blocks and blocks * size > len(tokens):
            raise ValueError(f"block {blocks - 1} is not full in {len(tokens)} tokens")
        prev, pack, sha256 = self._digest, self._pack, hashlib.sha256
        out: list[str] = []
        for i in range(self.blocks, blocks):
            h = sha256(prev)
            try:
                h.update(pack(*tokens[i * size : (i + 1) * size]))
            except struct.error as err:
                raise ValueError(f"token ids must be ints in [0, 2**32): {err}") from None
            prev = h.digest()
            out.append(prev.hex()[:IDENTITY_HEX_CHARS])
        if out:
            self._digest, self.blocks = prev, blocks
        return out


def context_chain(
    tokens: Sequence[int], *, tenant: str, scope: str, numerical_mode: str, block_size: int
) -> tuple[tuple[str, ...], IdentityChain]:
    """A prompt's context (``prefix_identities``) and the chain that computed it, positioned
    after the context's last block (what ``OutputNames`` continues from)."""
    chain = IdentityChain(
        tenant=tenant, scope=scope, numerical_mode=numerical_mode, block_size=block_size
    )
    return tuple(chain.extend(tokens, adoptable_blocks(len(tokens), block_size))), chain


def prefix_identities(
    tokens: Sequence[int], *, tenant: str, scope: str, numerical_mode: str, block_size: int
) -> tuple[str, ...]:
    """The core's context for a prompt: one chained identity per adoptable full block."""
    context, _ = context_chain(
        tokens, tenant=tenant, scope=scope, numerical_mode=numerical_mode, block_size=block_size
    )
    return context


class OutputNames:
    """The prefix identities an engine names, at writer close (``WriterClosed.prefix``), for the
    blocks of one version's request past its context: its own output, and a last full prompt
    block that the last-token rule keeps out of the context. It continues the chain of the
    version's context (``context_chain``) over the request's token ids as their blocks fill, so
    block ``i``'s name is ``prefix_identities(p)[i]`` for any later prompt ``p`` that starts
    with the request's first ``(i + 1) * B`` tokens. The names of the blocks past the context
    are kept (a block of each KV cache group holds the same position), never a context's."""

    __slots__ = ("chain", "first", "keys")

    def __init__(self, chain: IdentityChain) -> None:
        self.chain = chain
        self.first = chain.blocks  # the first position past the context
        self.keys: list[str] = []  # the names of positions first, first + 1, ...

    def name(self, position: int, tokens: Sequence[int], written: int) -> str | None:
        """The identity of block ``position`` of the request's ``tokens`` (its prompt and what it
        generated so far), of which the first ``written`` have their KV written; None for a
        context block (its identity is the context's) and for a block some of whose tokens are
        not written or not known (nothing is named from tokens the engine does not have)."""
        if position < self.first:
            return None
        if (position + 1) * self.chain.block_size > min(written, len(tokens)):
            return None
        if position >= self.chain.blocks:
            self.keys += self.chain.extend(tokens, position + 1)
        return self.keys[position - self.first]


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
    blocks, within the successor's last-token rule (it inherits only what vLLM could serve as
    its prompt's prefix hit). ``predecessor``: the tokens whose KV the predecessor wrote -- its
    prompt, and, for a version that ran, its output but the last token; each full block of them
    has an identity (its context's, or the one the engine named at its writer's close)."""
    return min(
        common_prefix_len(predecessor, successor) // block_size,
        len(predecessor) // block_size,
        adoptable_blocks(len(successor), block_size),
    )


def written_tokens(prompt: Sequence[int], output: Sequence[int]) -> tuple[int, ...]:
    """The tokens whose KV a version that ran wrote: its prompt and its output but the last
    token (sampled in the last step, never computed)."""
    return (*prompt, *output[:-1])


def fingerprint(
    *, model: str, dtype: str, block_size: int, tenant: str, tensor_parallel_size: int
) -> str:
    """The configuration fingerprint of a scope's pages (the core compares it verbatim)."""
    return (
        f"model={model}|dtype={dtype}|block={block_size}|adapter=none|layout=LBHNC"
        f"|tp={tensor_parallel_size}|tenant={tenant}"
    )
