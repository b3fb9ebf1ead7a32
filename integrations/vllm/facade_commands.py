"""``FacadeCommands``: the in-process facade's one executor of ``retire_core`` commands.

``RetireEngine`` (``facade``) observes vLLM, builds events and hands them to the core; every command
the core returns comes here, is queued, and is carried out in order against vLLM and the facade's
records: ``Publish``/``Drop`` are counted (the caller that handed the frame over reads its fate from
the commands it got back), ``Fence`` aborts the requests (deferred to the step boundary while a step
runs), closes their open writers and delivers the receipts, ``PinCertified`` pins the certified
blocks and queues the byte check (sent at the next step boundary), ``Adopt``/``Unpin``/``Free`` move
the block ledger's references, and ``Admit`` adds the version's request to the engine. Nothing here
decides protocol, and nothing here observes a scheduler step: the events it reports (writer closures
and receipts of a fenced or finished request, the byte check, a started participant) are the direct
consequences of carrying out a command or of a request the facade saw finish.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from retire_core import (
    Admit,
    Adopt,
    AdoptionReport,
    AllowWrite,
    Certificate,
    Command,
    Drop,
    Fence,
    FenceWrite,
    Free,
    PageDigest,
    ParticipantStarted,
    PinCertified,
    Publish,
    Receipt,
    Unpin,
)

from . import observe
from .errors import EngineDeadError, IntegrationError, IsolationError
from .facade_records import FacadeRequest
from .serving.ledger import VERIFICATION_FAILURES

if TYPE_CHECKING:
    from .facade import RetireEngine


class FacadeCommands:
    """Carries out the commands of one ``RetireEngine``'s core, in the order they came."""

    def __init__(self, facade: RetireEngine) -> None:
        self.facade = facade
        self._queue: deque[Command] = deque()
        self._draining = False
        self.in_step = False  # fences wait for the step boundary while this is set
        self.deferred: list[Fence] = []
        self.pending_reports: dict[tuple[str, int], Certificate] = {}
        self._salts = itertools.count()

    def run(self, commands: Iterable[Command]) -> None:
        """Carry out ``commands``; a command carried out while another is (a receipt admitting
        a successor, say) waits its turn in the queue."""
        queue = self._queue
        queue.extend(commands)
        if self._draining:
            return
        self._draining = True
        handlers = _HANDLERS
        try:
            while queue:
                cmd = queue.popleft()
                handler = handlers.get(type(cmd))
                if handler is None:  # pragma: no cover - the Command union is closed
                    raise TypeError(f"unknown command {cmd!r}")
                handler(self, cmd)
        except EngineDeadError as err:
            # The rest of the queue is never carried out: nothing more runs on a dead engine.
            self.facade.dead = err
            raise
        finally:
            self._draining = False
            queue.clear()

    def run_deferred(self) -> None:
        """The fences that arrived during the step just ended."""
        deferred, self.deferred = self.deferred, []
        self.run(deferred)

    def _allow_write(self, cmd: AllowWrite) -> None:
        self.facade.stats.writes_allowed += 1

    def _fence_or_defer(self, cmd: Fence) -> None:
        if self.in_step:
            self.deferred.append(cmd)
            self.facade.stats.fences_deferred += 1
        else:
            self._fence(cmd)

    def _fence_write(self, cmd: FenceWrite) -> None:
        raise IsolationError(
            f"the core fenced a write of {cmd.participant} into block {cmd.page} "
            f"({cmd.reason}); vLLM cannot stop a scheduled write"
        )

    # ---- frames ---------------------------------------------------------------------------------

    def _publish(self, cmd: Publish) -> None:
        self.facade.stats.frames_published += 1  # the frame's caller delivers it

    def _drop(self, cmd: Drop) -> None:
        self.facade.stats.frames_dropped += 1  # the frame's caller discards it

    # ---- fencing and receipts ------------------------------------------------------------------

    def _fence(self, cmd: Fence) -> None:
        f = self.facade
        f.stats.fences += 1
        by_request: dict[str, list[str]] = {}
        for participant in cmd.participants:
            by_request.setdefault(f.participant_rid[participant], []).append(participant)
        for rid, participants in by_request.items():
            req = f.reqs[rid]
            req.record.fenced = True
            if rid in f.scheduler.requests:
                f.engine.abort_request([rid], internal=True)
            self.close_request(req, tuple(participants))

    def close_request(self, req: FacadeRequest, participants: Sequence[str]) -> None:
        """Close the writers of the request's open pages, then deliver receipts: ranks first (each
        worker answers after any step in flight), the request last."""
        f = self.facade
        rec = req.record
        self.release_handoff_pins(req)
        f.close_writers(req.pages)
        todo = [p for p in participants if p not in req.closed]
        ranks = [p for p in todo if p != req.rid]
        if ranks:
            rec.rank_receipts.extend(
                observe.rank_receipts(f.executor, req.rid, ranks, req.block_ids)
            )
        for participant in [*ranks, *(p for p in todo if p == req.rid)]:
            req.closed.add(participant)
            rec.receipts[participant] = f.clock()
            f.emit(Receipt(req.scope, req.version, participant))
        if rec.closed and rec.closed_at is None:
            rec.closed_at = f.clock()

    # ---- pins, byte checks, adoption and freeing -------------------------------------------------

    def _pin(self, cmd: PinCertified) -> None:
        f = self.facade
        certificate = cmd.certificate
        rec = f.records[certificate.scope].version(certificate.version)
        rec.certificate = tuple(
            (e.page, e.position, e.generation, e.digest) for e in certificate.entries
        )
        for entry in certificate.entries:
            f.ledger.pin(entry.page, for_version=certificate.version)
            f.stats.pins += 1
        self.pending_reports[(certificate.scope, certificate.version)] = certificate

    def send_reports(self, held: set[str]) -> None:
        """The byte check of every pending certificate whose scope is not in ``held``."""
        f = self.facade
        for key in sorted(self.pending_reports):
            scope, version = key
            if scope in held:
                continue
            certificate = self.pending_reports.pop(key)
            pages = list(certificate.pages)
            digests = f.digest_for_adoption(pages)
            f.records[scope].version(version).adoption_report = dict(digests)
            report = tuple(PageDigest(p, digests[p]) for p in pages)
            f.emit(AdoptionReport(scope, version, report))

    def _adopt(self, cmd: Adopt) -> None:
        f = self.facade
        rec = f.records[cmd.scope].version(cmd.version)
        rec.adopted_pages = tuple(cmd.pages)
        f.stats.adopted_pages += len(cmd.pages)
        for p in cmd.pages:
            f.ledger.adopt(p, cmd.scope, cmd.version)

    def _unpin(self, cmd: Unpin) -> None:
        f = self.facade
        failed = cmd.reason in VERIFICATION_FAILURES
        for p in cmd.pages:
            page = f.pages.get(p)
            if page is not None and page.pins and page.cert_version is not None:
                rec = f.records[page.scope].version(page.cert_version)
                rec.released.append((p, cmd.reason))
            f.ledger.unpin(p, evict=failed)  # a failed page is never a prefix hit again
            f.stats.released_pages += 1

    def release_handoff_pins(self, req: FacadeRequest) -> None:
        pins, req.handoff_pins = req.handoff_pins, []
        for p in pins:
            self.facade.ledger.release_handoff(p)

    def _free(self, cmd: Free) -> None:
        reqs = self.facade.reqs
        for ref in self.facade.ledger.free(cmd.pages):  # all or nothing; one call each to the pool
            req = reqs.get(ref.request)
            if req is not None and ref.block in req.pages:
                req.pages.remove(ref.block)
        for rid in [
            rid
            for rid, r in reqs.items()
            if len(r.closed) == len(r.participants) and not r.pages and not r.handoff_pins
        ]:
            del reqs[rid]

    # ---- admission -----------------------------------------------------------------------------

    def cold_salt(self, scope: str) -> str:
        """A fresh physical ``cache_salt`` for a version of ``scope`` that inherits nothing: it
        names the facade, the scope's tenant and the scope, so vLLM's prefix cache can never
        serve one scope's (or tenant's) blocks to another."""
        tenant = self.facade.records[scope].tenant
        return f"retire:{self.facade.uid}:{tenant}:{scope}:{next(self._salts)}"

    def _admit(self, cmd: Admit) -> None:
        from vllm.sampling_params import RequestOutputKind, SamplingParams

        f = self.facade
        rec = f.records[cmd.scope].version(cmd.version)
        adopted = rec.adopted_pages[: cmd.adopted_blocks]
        if len(adopted) != cmd.adopted_blocks:
            raise IntegrationError(
                f"Admit {cmd.scope}@{cmd.version} with {cmd.adopted_blocks} adopted blocks, "
                f"but only {len(rec.adopted_pages)} were handed over"
            )
        if adopted:
            salts = {f.pages[p].salt for p in adopted}
            if len(salts) != 1:
                raise IntegrationError(f"adopted pages of {cmd.scope} mix cache salts {salts}")
            salt = salts.pop()
        else:
            salt = self.cold_salt(cmd.scope)
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
        ranks = tuple(f"{rid}/rank{r}" for r in range(f.tp)) if f.tp > 1 else ()
        participants = (rid, *ranks)
        req = FacadeRequest(
            rid, cmd.scope, cmd.version, participants, salt, rec, adopted=tuple(adopted)
        )
        req.handoff_pins = list(adopted)  # the certificate pins, now handoff pins
        f.reqs[rid] = req
        for participant in participants:
            f.participant_rid[participant] = rid
        rec.request_id, rec.participants, rec.salt = rid, participants, salt
        rec.admitted, rec.admitted_at, rec.cold = True, f.clock(), cmd.cold
        rec.adopted_blocks = cmd.adopted_blocks
        # Only the adopted blocks may be the new request's prefix hit.
        request = f.scheduler.requests[rid]
        f.stats.uncertified_hashes_evicted += observe.restrict_prefix_hit(
            f.pool, request, req.adopted
        )
        for participant in participants:
            f.emit(ParticipantStarted(cmd.scope, cmd.version, participant))


#: What ``run`` does with each command, by its type (one dict lookup instead of an
#: ``isinstance`` chain and a call to pass through).
_HANDLERS: dict[type, Callable[[FacadeCommands, Any], None]] = {
    Publish: FacadeCommands._publish,
    AllowWrite: FacadeCommands._allow_write,
    Drop: FacadeCommands._drop,
    Fence: FacadeCommands._fence_or_defer,
    FenceWrite: FacadeCommands._fence_write,
    PinCertified: FacadeCommands._pin,
    Adopt: FacadeCommands._adopt,
    Unpin: FacadeCommands._unpin,
    Admit: FacadeCommands._admit,
    Free: FacadeCommands._free,
}
