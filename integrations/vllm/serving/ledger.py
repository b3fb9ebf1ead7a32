"""``BlockLedger``: every reference Retire holds on a vLLM block, each with its generation stamp.

Three kinds of reference, one owner: the *retention* reference taken when a managed request is
given a block (it keeps every page the core tracks alive in vLLM's pool until the core frees it),
the *certificate pin* taken by ``PinCertified`` (it becomes the *handoff pin* once the page is
adopted, and is dropped when the successor's own reference holds the block). A finished
version's pages given back by ``ReleaseToCache`` keep no reference: they sit in vLLM's free
queue with their hash (its prefix cache, evictable) and the ledger remembers them (``cached``)
until the core frees them, a pin takes them back, or vLLM hands the block out. Each reference
records the block's generation (``GenerationSpy``) when it was taken: a reference whose block was
recycled underneath it is gone, and dropping it must not touch the new owner's block. The ledger
never decides whether a page may be pinned, adopted or freed: the core does; it carries the
decision out on the block pool and refuses what would corrupt the pool.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import attrs

from retire_core import ReleaseReason

from .. import introspect as ix
from ..errors import LedgerError

#: Unpin reasons that mean "the page failed verification": its hash is evicted.
VERIFICATION_FAILURES = frozenset(ReleaseReason)


@attrs.define
class BlockRef:
    block: int
    scope: str
    version: int
    request: str
    position: int
    salt: str
    retained_at: int  # generation when the retention reference was taken
    pins: list[int] = attrs.field(factory=list)  # generation per pin reference, oldest first
    writer_open: bool = True
    cert_version: int | None = None  # the successor version of the newest certificate pin
    group: int = 0  # the KV cache group the block holds a position of


class BlockLedger:
    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self.spy = ix.GenerationSpy(pool).install()
        self.refs: dict[int, BlockRef] = {}
        self.cached: dict[int, BlockRef] = {}  # given back to vLLM's cache, no reference held
        self.lost = 0  # references whose block was recycled underneath them

    def close(self) -> None:
        self.spy.uninstall()

    def retain(
        self,
        block: int,
        scope: str,
        version: int,
        request: str,
        position: int,
        salt: str,
        group: int = 0,
    ) -> None:
        if block in self.refs:
            raise LedgerError(f"block {block} is already retained for {self.refs[block].request}")
        self.pool.touch([self.pool.blocks[block]])
        self.refs[block] = BlockRef(
            block, scope, version, request, position, salt, self.spy.gen(block), group=group
        )

    def pin(self, block: int, for_version: int | None = None) -> None:
        if block in self.cached:
            self._take_back(block)
        ref = self.refs.get(block)
        if ref is None:
            raise LedgerError(f"certified block {block} is not retained")
        self.pool.touch([self.pool.blocks[block]])
        ref.pins.append(self.spy.gen(block))
        ref.cert_version = for_version

    def _take_back(self, block: int) -> None:
        """A cached block certified for a successor: retain it again (it must still be the block
        that was given back: an eviction is reported before the block is reused)."""
        ref = self.cached.pop(block)
        if self.spy.gen(block) != ref.retained_at:
            raise LedgerError(f"cached block {block} was reused without an eviction report")
        self.pool.touch([self.pool.blocks[block]])
        self.refs[block] = ref

    def release_to_cache(self, blocks: Iterable[int]) -> list[BlockRef]:
        """Drop the retention references of ``blocks`` (all or nothing) but keep their hashes:
        the blocks go to vLLM's prefix cache, evictable."""
        todo = list(blocks)
        for block in todo:
            ref = self.refs.get(block)
            if ref is None or ref.pins:
                what = "not retained" if ref is None else "pinned"
                raise LedgerError(
                    f"the core gives block {block} back to the cache, but it is {what}"
                )
        given = [self.refs.pop(block) for block in todo]
        for ref in given:
            self.cached[ref.block] = ref
        ours = [r.block for r in given if self._ours(r.block, r.retained_at)]
        if ours:
            self.pool.free_blocks([self.pool.blocks[b] for b in reversed(ours)])
        return given

    def evicted(self, block: int) -> bool:
        """vLLM handed ``block`` out again: forget it if it was a cached page (True then)."""
        return self.cached.pop(block, None) is not None

    def adopt(self, block: int, scope: str, version: int) -> None:
        ref = self.refs[block]
        ref.scope, ref.version = scope, version

    def unpin(self, block: int, *, evict: bool) -> None:
        """Drop the newest pin; ``evict`` (a failed verification) also drops the block's hash so
        vLLM never serves it as a prefix hit again."""
        ref = self.refs.get(block)
        if ref is None or not ref.pins:
            raise LedgerError(f"the core unpins block {block}, which holds no pin")
        if self._ours(block, ref.pins.pop()):
            if evict:
                self.pool.evict_blocks({block})
            self.pool.free_blocks([self.pool.blocks[block]])

    def release_handoff(self, block: int) -> None:
        """The successor's own reference holds the block: drop the oldest pin (the handoff pin)."""
        ref = self.refs.get(block)
        if ref is None or not ref.pins:
            raise LedgerError(f"handoff pin on block {block} is missing")
        if self._ours(block, ref.pins.pop(0)):
            self.pool.free_blocks([self.pool.blocks[block]])

    def free(self, blocks: Iterable[int]) -> list[BlockRef]:
        """Drop the retention references of ``blocks`` (all or nothing) and their hashes (a
        cached block has no reference left: only its hash goes)."""
        todo = list(blocks)
        retained = [block for block in todo if block not in self.cached]
        for block in retained:
            ref = self.refs.get(block)
            if ref is None:
                raise LedgerError(f"the core frees block {block}, which is not retained")
            if ref.pins:
                raise LedgerError(f"the core freed block {block} while it is pinned")
        cached = [self.cached.pop(block) for block in todo if block in self.cached]
        gone = [r.block for r in cached if self.spy.gen(r.block) == r.retained_at]
        if gone:  # in vLLM's free queue already: only its hash goes
            self.pool.evict_blocks(set(gone))
        freed = [self.refs.pop(block) for block in retained]
        ours = [r.block for r in freed if self._ours(r.block, r.retained_at)]
        if ours:
            self.pool.evict_blocks(set(ours))
            self.pool.free_blocks([self.pool.blocks[b] for b in reversed(ours)])
        return cached + freed

    def _ours(self, block: int, gen: int) -> bool:
        if self.spy.gen(block) != gen:
            self.lost += 1
            return False
        return True

    def pinned(self) -> list[int]:
        return sorted(b for b, r in self.refs.items() if r.pins)
