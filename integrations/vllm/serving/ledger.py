"""``BlockLedger``: every reference Retire holds on a vLLM block, each with its generation stamp.

Three kinds of reference, one owner: the *retention* reference taken when a managed request is
given a block (it keeps every page the core tracks alive in vLLM's pool until the core frees it),
the *certificate pin* taken by ``PinCertified`` (it becomes the *handoff pin* once the page is
adopted, and is dropped when the successor's own reference holds the block). Each reference
records the block's generation (``GenerationSpy``) when it was taken: a reference whose block was
recycled underneath it is gone, and dropping it must not touch the new owner's block. The ledger
never decides whether a page may be pinned, adopted or freed: the core does; it carries the
decision out on the block pool and refuses what would corrupt the pool.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import attrs

from .. import introspect as ix
from ..errors import LedgerError


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


class BlockLedger:
    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self.spy = ix.GenerationSpy(pool).install()
        self.refs: dict[int, BlockRef] = {}
        self.lost = 0  # references whose block was recycled underneath them

    def close(self) -> None:
        self.spy.uninstall()

    def retain(
        self, block: int, scope: str, version: int, request: str, position: int, salt: str
    ) -> None:
        if block in self.refs:
            raise LedgerError(f"block {block} is already retained for {self.refs[block].request}")
        self.pool.touch([self.pool.blocks[block]])
        self.refs[block] = BlockRef(
            block, scope, version, request, position, salt, self.spy.gen(block)
        )

    def pin(self, block: int, for_version: int | None = None) -> None:
        ref = self.refs.get(block)
        if ref is None:
            raise LedgerError(f"certified block {block} is not retained")
        self.pool.touch([self.pool.blocks[block]])
        ref.pins.append(self.spy.gen(block))
        ref.cert_version = for_version

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
        """Drop the retention references of ``blocks`` (all or nothing) and their hashes."""
        todo = list(blocks)
        for block in todo:
            ref = self.refs.get(block)
            if ref is None:
                raise LedgerError(f"the core frees block {block}, which is not retained")
            if ref.pins:
                raise LedgerError(f"the core freed block {block} while it is pinned")
        freed = [self.refs.pop(block) for block in todo]
        ours = [r.block for r in freed if self._ours(r.block, r.retained_at)]
        if ours:
            self.pool.evict_blocks(set(ours))
            self.pool.free_blocks([self.pool.blocks[b] for b in reversed(ours)])
        return freed

    def _ours(self, block: int, gen: int) -> bool:
        if self.spy.gen(block) != gen:
            self.lost += 1
            return False
        return True

    def pinned(self) -> list[int]:
        return sorted(b for b, r in self.refs.items() if r.pins)
