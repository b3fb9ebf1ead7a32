"""``EngineCommands``: the serving engine side's part of the one command executor.

``executor.CommandExecutor`` carries the commands out; this class completes it for vLLM's
engine-core process: ``Fence`` finishes the requests in the scheduler and sends each a terminal
output whose ``stop_reason`` names the fence (the API process ends the stream with it); ``Admit``
records the admission (the cache salt the version runs under, its adopted blocks) and answers
the pending ``open``; the version's request, sent right behind the ``open``, gets the salt when it
reaches the scheduler (``EngineSide.holds``; one that came before the ``Admit`` is let in now)
and ``EngineSide.on_add_request`` hands it the names of its blocks past its context that
``open`` prepared (``identity.OutputNames``); a byte check runs at once outside
a step (no step is in flight during a utility call) and at the step boundary inside one; what the
API answers with (per-scope facts, counters) is recorded on the ``EngineSide``. Nothing here
decides protocol.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from retire_core import (
    Admit,
    Adopt,
    Certificate,
    Command,
    Event,
    Fence,
    ReleaseToCache,
)

from ..executor import CommandExecutor
from . import wire
from .records import Admission, ManagedRequest

if TYPE_CHECKING:
    from .engine_side import EngineSide


class EngineCommands(CommandExecutor):
    def __init__(self, side: EngineSide) -> None:
        super().__init__(
            side.ledger,
            side.reqs,
            side.by_participant,
            side.executor,
            side.kv_windows,
            side.null_block,
        )
        self.side = side

    def decide(self, events: list[Event]) -> list[Command]:
        return self.side.decide(events)

    def read_digests(self, pages: Sequence[int]) -> dict[int, str]:
        if not pages:
            return {}
        began = time.perf_counter()
        try:
            return super().read_digests(pages)
        finally:
            self.side.engine_time.worker_seconds += time.perf_counter() - began

    def stop(self, req: ManagedRequest, cmd: Fence) -> None:
        reason = wire.finish_reason(self.side.core.revocation(cmd.scope, cmd.version))
        # an open decided while a step ran sent the terminal output already (``open_early``)
        self.side.finish_from_here(req.rid, req.client_index, reason, announce=not req.announced)
        if self.side.first_fence_output is None and not req.announced:
            self.side.first_fence_output = time.time()  # wall clock, for Server-Timing
        req.announced = True

    def cold_salt(self, scope: str) -> str:
        info = self.side.scopes.get(scope)
        tenant = info.tenant if info is not None else self.side.core.scope(scope).tenant
        return f"retire:{tenant}:{scope}:{next(self._salts)}"

    def start(self, cmd: Admit, salt: str, adopted: tuple[tuple[int, ...], ...]) -> None:
        side = self.side
        key = (cmd.scope, cmd.version)
        info = side.scopes.get(cmd.scope)
        names = None
        if info is not None:
            # only the admitted version's figures are ever read again: keep nothing older
            info.adopted_blocks = {cmd.version: cmd.adopted_blocks}
            recomputed = info.context_blocks.get(cmd.version, 0) - cmd.adopted_blocks
            info.context_blocks = {v: n for v, n in info.context_blocks.items() if v >= cmd.version}
            names = info.names.pop(cmd.version, None)
            info.names = {v: n for v, n in info.names.items() if v > cmd.version}
            side.count("recomputed_blocks", max(0, recomputed))
        side.admissions[key] = Admission(cmd.scope, cmd.version, salt, adopted, cmd.cold, names)
        side.count("cold_admissions" if cmd.cold else "warm_admissions")
        future = side.opening.pop(key, None)
        if future is not None:
            future.set_result(
                {
                    "ok": True,
                    "scope": cmd.scope,
                    "version": cmd.version,
                    "adopted_blocks": cmd.adopted_blocks,
                    "cold": cmd.cold,
                }
            )
        side.release_held(cmd.scope, cmd.version)  # its request came before the Admit

    # ---- what the engine side records ------------------------------------------------------------

    def on_fence(self, cmd: Fence, deferred: bool) -> None:
        if not deferred:
            self.side.count("fences")

    def on_fenced(self, req: ManagedRequest) -> None:
        req.fenced = True

    def on_closing(self, req: ManagedRequest) -> None:
        info = self.side.scopes.get(req.scope)
        if info is not None:
            info.last_active = time.monotonic()

    def on_digests_taken(self, count: int) -> None:
        self.side.count("step_digests", count)

    def on_rank_receipts(self, req: ManagedRequest, answers: list[dict[str, Any]]) -> None:
        self.side.count("rank_receipts", len(answers))

    def on_pinned(self, certificate: Certificate) -> None:
        self.side.count("pins", len(certificate.entries))

    def on_adopted(self, cmd: Adopt) -> None:
        self.side.count("adopted_blocks", len(cmd.pages))

    def on_unpinned(self, block: int, reason: str, failed: bool) -> None:
        if failed:
            self.side.count("verification_failures")

    def on_released(self, cmd: ReleaseToCache) -> None:
        self.side.count("blocks_released_to_cache", len(cmd.pages))
