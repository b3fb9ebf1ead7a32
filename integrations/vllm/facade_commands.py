"""``FacadeCommands``: the in-process facade's side of the one command executor.

``RetireEngine`` (``facade``) observes vLLM, builds events and hands them to the core; every command
the core returns is carried out by ``executor.CommandExecutor``, which this class completes for a
hand-stepped ``LLMEngine``: an event the executor's work produces goes through the facade's
``emit`` (so a test's injected fault sees it); ``Fence`` aborts the request in the engine;
``Admit`` adds the version's request to the engine under its cache salt (its record takes the
names of the version's blocks past its context, ``identity.OutputNames``); a byte check always
waits for the next step boundary (``RetireEngine.step`` sends it there, or keeps it back for a scope
whose admission a test holds); and every command's effect is written into the facade's records
and statistics, which the checker and the benchmarks read. Nothing here decides protocol.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from retire_core import (
    Admit,
    Adopt,
    AllowWrite,
    Certificate,
    Command,
    Drop,
    Event,
    Fence,
    ParticipantStarted,
    Publish,
)

from . import observe
from .errors import EngineDeadError, IntegrationError
from .executor import CommandExecutor, participant_names
from .facade_records import FacadeRequest

if TYPE_CHECKING:
    from .facade import RetireEngine


class FacadeCommands(CommandExecutor):
    """Carries out the commands of one ``RetireEngine``'s core, in the order they came."""

    def __init__(self, facade: RetireEngine) -> None:
        super().__init__(
            facade.ledger,
            facade.reqs,
            facade.participant_rid,
            facade.executor,
            facade.kv_windows,
            facade.null_block,
        )
        self.facade = facade

    def run(self, commands: Iterable[Command]) -> None:
        try:
            super().run(commands)
        except EngineDeadError as err:
            # The rest of the queue is never carried out: nothing more runs on a dead engine.
            self.facade.dead = err
            raise

    # ---- what the facade says --------------------------------------------------------------------

    def decide(self, events: list[Event]) -> list[Command]:
        return self.facade.retire.handle_batch(events)

    def report(self, event: Event) -> None:
        self.facade.emit(event)

    def stop(self, req: FacadeRequest, cmd: Fence) -> None:
        f = self.facade
        if req.rid in f.scheduler.requests:
            f.engine.abort_request([req.rid], internal=True)

    def read_digests(self, pages: Sequence[int]) -> dict[int, str]:
        return self.facade.read_digests(pages)

    def digest_for_adoption(self, pages: Sequence[int]) -> dict[int, str]:
        return self.facade.digest_for_adoption(pages)

    def reports_wait_for_a_step(self) -> bool:
        return True

    def cold_salt(self, scope: str) -> str:
        """A fresh physical ``cache_salt`` for a version of ``scope`` that inherits nothing: it
        names the facade, the scope's tenant and the scope, so vLLM's prefix cache can never
        serve one scope's (or tenant's) blocks to another."""
        tenant = self.facade.records[scope].tenant
        return f"retire:{self.facade.uid}:{tenant}:{scope}:{next(self._salts)}"

    def start(self, cmd: Admit, salt: str, adopted: tuple[tuple[int, ...], ...]) -> None:
        from vllm.sampling_params import RequestOutputKind, SamplingParams

        f = self.facade
        rec = f.records[cmd.scope].version(cmd.version)
        params = SamplingParams(
            temperature=0.0,
            max_tokens=rec.max_tokens,
            ignore_eos=True,
            output_kind=RequestOutputKind.DELTA,
        )
        inputs = {"prompt_token_ids": list(rec.prompt), "cache_salt": salt}
        external_id = f"{cmd.scope}@{cmd.version}"
        if external_id in f.internal_ids:
            raise IntegrationError(f"request id {external_id!r} is already in use")
        rid = f.engine.add_request(external_id, inputs, params)  # type: ignore[arg-type]
        f.internal_ids[external_id] = rid
        participants = participant_names(rid, f.tp)
        request = f.scheduler.requests[rid]
        req = FacadeRequest(
            rid,
            cmd.scope,
            cmd.version,
            participants,
            salt,
            rec,
            adopted=adopted,
            names=rec.output_names,
            request=request,
        )
        rec.output_names = None  # the request's now
        # the certificate pins, now handoff pins
        req.handoff_pins = sorted(observe.table_pages(adopted, self.null_block))
        f.reqs[rid] = req
        for participant in participants:
            f.participant_rid[participant] = rid
        rec.request_id, rec.participants, rec.salt = rid, participants, salt
        rec.admitted, rec.admitted_at, rec.cold = True, f.clock(), cmd.cold
        rec.adopted_blocks = cmd.adopted_blocks
        # Only the adopted blocks may be the new request's prefix hit.
        f.stats.uncertified_hashes_evicted += observe.restrict_prefix_hit(
            f.pool, request, req.adopted, self.null_block
        )
        for participant in participants:
            f.emit(ParticipantStarted(cmd.scope, cmd.version, participant))

    # ---- what the facade records -----------------------------------------------------------------

    def on_passed(self, cmd: Command) -> None:
        stats = self.facade.stats  # the frame's caller delivers or discards it
        if isinstance(cmd, Publish):
            stats.frames_published += 1
        elif isinstance(cmd, Drop):
            stats.frames_dropped += 1
        elif isinstance(cmd, AllowWrite):
            stats.writes_allowed += 1
        else:  # pragma: no cover - the Command union is closed
            raise TypeError(f"unknown command {cmd!r}")

    def on_fence(self, cmd: Fence, deferred: bool) -> None:
        if deferred:
            self.facade.stats.fences_deferred += 1
        else:
            self.facade.stats.fences += 1

    def on_fenced(self, req: FacadeRequest) -> None:
        req.record.fenced = True

    def on_rank_receipts(self, req: FacadeRequest, answers: list[dict[str, Any]]) -> None:
        req.record.rank_receipts.extend(answers)

    def on_receipt(self, req: FacadeRequest, participant: str) -> None:
        req.record.receipts[participant] = self.facade.clock()

    def on_closed(self, req: FacadeRequest) -> None:
        rec = req.record
        if rec.closed and rec.closed_at is None:
            rec.closed_at = self.facade.clock()

    def on_pinned(self, certificate: Certificate) -> None:
        f = self.facade
        rec = f.records[certificate.scope].version(certificate.version)
        rec.certificate = tuple(
            (e.page, e.position, e.generation, e.digest, e.group) for e in certificate.entries
        )
        f.stats.pins += len(certificate.entries)

    def on_reported(self, certificate: Certificate, digests: dict[int, str]) -> None:
        rec = self.facade.records[certificate.scope].version(certificate.version)
        rec.adoption_report = dict(digests)

    def on_adopted(self, cmd: Adopt) -> None:
        f = self.facade
        f.records[cmd.scope].version(cmd.version).adopted_pages = tuple(cmd.pages)
        f.stats.adopted_pages += len(cmd.pages)

    def on_unpinned(self, block: int, reason: str, failed: bool) -> None:
        f = self.facade
        page = f.pages.get(block)
        if page is not None and page.pins and page.cert_version is not None:
            f.records[page.scope].version(page.cert_version).released.append((block, reason))
        f.stats.released_pages += 1
