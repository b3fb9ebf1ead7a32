"""``CommandExecutor``: the one executor of ``retire_core`` commands against a vLLM engine.

Both hosts of the core -- the in-process facade (``facade_commands.FacadeCommands``) and the
serving engine side (``serving.engine_commands.EngineCommands``) -- carry commands out through this
class; what is the same in both lives here once: the non-re-entrant queue (a command whose effect
reports an event, a receipt admitting a successor say, queues the commands that event produces
behind the ones in hand), fences and byte checks waiting for the step boundary while a step runs,
the order in which a fenced or finished request closes (handoff pins dropped, open writers closed
with the digests of their bytes -- a block past the request's context also with the prefix identity
of its tokens, ``block_name`` -- then one receipt per participant: ranks first, the request last),
the block ledger's side of ``PinCertified``/``Adopt``/``Unpin``/``Free``/``ReleaseToCache``, and
the checks an ``Admit`` makes before its request may run (the adopted blocks were handed over,
under one cache salt). What differs between the hosts is a handful of methods a host overrides:
how the core hears an event, how a request is stopped, what an admission does, what is recorded.
Nothing here decides protocol, and nothing here observes a scheduler step.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import attrs

from retire_core import (
    Admit,
    Adopt,
    AdoptionReport,
    Certificate,
    Command,
    Event,
    Fence,
    FenceWrite,
    Free,
    PageDigest,
    ParticipantStarted,
    PinCertified,
    Receipt,
    ReleaseToCache,
    Unpin,
    VersionPreempted,
    WriterClosed,
)

from . import observe
from .errors import IntegrationError, IsolationError
from .identity import OutputNames
from .serving.ledger import VERIFICATION_FAILURES, BlockLedger, BlockRef


def participant_names(rid: str, tp: int, preemptions: int = 0) -> tuple[str, ...]:
    """A request's participants: itself (renamed after each preemption: it runs again as new
    participants, ``<rid>#<n>``), then one per tensor-parallel rank, ``<head>/rank<r>``."""
    head = rid if preemptions == 0 else f"{rid}#{preemptions}"
    return (head, *(f"{head}/rank{r}" for r in range(tp) if tp > 1))


class CommandExecutor:
    """Carries out one core's commands, in the order they came. ``reqs`` and ``by_participant``
    are the host's maps of the requests it manages (request id -> request, participant ->
    request id); a request is either host's record of one (``rid``, ``scope``, ``version``,
    ``participants``, ``adopted``, ``handoff_pins``, ``tables``, ``pages``, ``closed``,
    ``names`` and ``request``: see ``block_name``). The
    executor forgets a request once every participant delivered its receipt and it holds no
    page."""

    def __init__(
        self,
        ledger: BlockLedger,
        reqs: dict[str, Any],
        by_participant: dict[str, str],
        model_executor: Any,
        kv_windows: tuple[int, ...],
        null_block: int,
    ) -> None:
        self.ledger = ledger
        self.kv_windows = kv_windows  # the engine's KV cache groups (``observe.kv_windows``)
        self.null_block = null_block
        self.reqs = reqs
        self.by_participant = by_participant
        self.model_executor = model_executor
        self.in_step = False  # fences and byte checks wait for the step boundary while set
        self.deferred: list[Fence] = []
        self.pending_reports: dict[tuple[str, int], Certificate] = {}
        self._queue: deque[Command] = deque()
        self._draining = False
        self._salts = itertools.count()

    # ---- what each host says ---------------------------------------------------------------------

    def decide(self, events: list[Event]) -> list[Command]:
        """The core's commands for ``events`` (raises, changing nothing, on bad input)."""
        raise NotImplementedError

    def report(self, event: Event) -> None:
        """An event this executor's work produced (a receipt, a byte check): to the core, and its
        commands carried out."""
        self.run(self.decide([event]))

    def stop(self, req: Any, cmd: Fence) -> None:
        """End ``req`` in vLLM (it runs no further step)."""
        raise NotImplementedError

    def start(self, cmd: Admit, salt: str, adopted: tuple[tuple[int, ...], ...]) -> None:
        """Let the admitted version's request run under ``salt`` with ``adopted`` as its
        prefix (one block table per KV cache group: ``observe.adoption_tables``)."""
        raise NotImplementedError

    def adopted_pages(self, cmd: Admit) -> tuple[int, ...]:
        """The blocks ``Adopt`` handed to the admitted version, in position order (every
        group's)."""
        refs = self.ledger.refs
        mine = (p for p, r in refs.items() if r.scope == cmd.scope and r.version == cmd.version)
        return tuple(sorted(mine, key=lambda p: refs[p].position))

    def cold_salt(self, scope: str) -> str:
        """A fresh physical ``cache_salt`` for a version that inherits nothing."""
        raise NotImplementedError

    def read_digests(self, pages: Sequence[int]) -> dict[int, str]:
        """sha256 of the KV bytes of each block on every rank."""
        return observe.read_digests(self.model_executor, pages)

    def digest_for_adoption(self, pages: Sequence[int]) -> dict[int, str]:
        """The byte check reported in ``AdoptionReport``."""
        return self.read_digests(pages)

    def reports_wait_for_a_step(self) -> bool:
        """Whether a byte check waits for the next step boundary even outside a step."""
        return self.in_step

    # what a host records (nothing by default)
    def on_fence(self, cmd: Fence, deferred: bool) -> None: ...
    def on_fenced(self, req: Any) -> None: ...
    def on_closing(self, req: Any) -> None: ...
    def on_digests_taken(self, count: int) -> None: ...
    def on_rank_receipts(self, req: Any, answers: list[dict[str, Any]]) -> None: ...
    def on_receipt(self, req: Any, participant: str) -> None: ...
    def on_closed(self, req: Any) -> None: ...
    def on_pinned(self, certificate: Certificate) -> None: ...
    def on_reported(self, certificate: Certificate, digests: dict[int, str]) -> None: ...
    def on_adopted(self, cmd: Adopt) -> None: ...
    def on_unpinned(self, block: int, reason: str, failed: bool) -> None: ...
    def on_released(self, cmd: ReleaseToCache) -> None: ...
    def on_passed(self, cmd: Command) -> None: ...

    # ---- the queue -------------------------------------------------------------------------------

    def run(self, commands: Iterable[Command]) -> None:
        """Carry out ``commands``; a command carried out while another is waits its turn."""
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
                if handler is None:
                    self.on_passed(cmd)  # Publish, Drop, AllowWrite: the caller reads them
                else:
                    handler(self, cmd)
        finally:
            self._draining = False
            queue.clear()

    def run_deferred(self) -> None:
        """The fences that arrived during the step just ended."""
        deferred, self.deferred = self.deferred, []
        self.run(deferred)

    def pending_work(self) -> int:
        return len(self._queue) + len(self.deferred) + len(self.pending_reports)

    # ---- fencing and receipts --------------------------------------------------------------------

    def _fence(self, cmd: Fence) -> None:
        if self.in_step:
            self.deferred.append(cmd)
            self.on_fence(cmd, deferred=True)
            return
        self.on_fence(cmd, deferred=False)
        by_request: dict[str, list[str]] = {}
        for participant in cmd.participants:
            # Gone: it closed after the core fenced it and before this fence was carried out
            # (a fence that waited for the step boundary, while vLLM's abort of a client that
            # left closed it; or fenced again by a later revision decided before the first
            # fence's commands ran, ``EngineSide.open_early``): its receipts are in.
            rid = self.by_participant.get(participant)
            if rid is not None:
                by_request.setdefault(rid, []).append(participant)
        for rid, participants in by_request.items():
            req = self.reqs[rid]
            self.on_fenced(req)
            self.stop(req, cmd)
            self.close_request(req, tuple(participants))

    def _fence_write(self, cmd: FenceWrite) -> None:
        raise IsolationError(
            f"the core fenced a write of {cmd.participant} into block {cmd.page} ({cmd.reason}); "
            "vLLM cannot stop a scheduled write"
        )

    def close_request(
        self, req: Any, participants: Sequence[str], read: Mapping[int, str] | None = None
    ) -> None:
        """Drop the request's handoff pins, close the writers of its open pages (``read``: as in
        ``close_writers``), then deliver receipts: ranks first (each worker answers after any
        step in flight), the request last."""
        self.on_closing(req)
        self.release_handoff_pins(req)
        self.close_writers(req.pages, read)
        req.request = None  # every writer is closed: nothing is named from its tokens again
        todo = [p for p in participants if p not in req.closed]
        me = req.participants[0]  # the request's own participant; the others are its ranks'
        ranks = [p for p in todo if p != me]
        if ranks:
            # every page the request holds: its block tables, and the pages of a sliding-window
            # group its window passed since the last schedule (vLLM drops them from the table at
            # a request's end too, before any schedule reports them; earlier ones went back)
            blocks = sorted(req.tables.pages(self.null_block) | set(req.pages))
            answers = observe.rank_receipts(self.model_executor, me, ranks, blocks)
            self.on_rank_receipts(req, answers)
        for participant in [*ranks, *(p for p in todo if p == me)]:
            req.closed.add(participant)
            self.on_receipt(req, participant)
            self.report(Receipt(req.scope, req.version, participant))
        self.on_closed(req)
        self.forget_closed_requests()

    def preempt(self, req: Any, request: Any) -> None:
        """vLLM preempted ``req`` (its vLLM ``request``) to make room and dropped its blocks: its
        writers close, its participants deliver their receipts and the core hears
        ``VersionPreempted``, which frees the version's pages, so the allocation that preempted
        it can have their blocks in the same schedule. The host manages it again (``restart``)
        once the schedule returns."""
        self.close_request(req, req.participants)
        self.report(VersionPreempted(req.scope, req.version))
        req.request = request

    def restart(self, old: Any, participants: tuple[str, ...]) -> tuple[Any, int]:
        """A request ``preempt`` ended, managed again under new ``participants``: a fresh record
        with no page, no adoption and no prefix hit (the blocks cached on its hash chain are
        evicted: its old pages went back to vLLM, and under its version's cache salt no other
        request has that chain), so it computes everything again into pages of its own. The core
        hears its participants start (if its version lost authority meanwhile, it fences them).
        Returns the record and how many cached blocks were evicted."""
        req = attrs.evolve(
            old,
            participants=participants,
            adopted=tuple(() for _ in self.kv_windows),
            handoff_pins=[],
            tables=observe.BlockTables(),
            pages=[],
            scheduled=False,
            closed=set(),
            preemptions=old.preemptions + 1,
        )
        for p in old.participants:
            self.by_participant.pop(p, None)
        self.reqs[req.rid] = req
        for p in participants:
            self.by_participant[p] = req.rid
        evicted = observe.restrict_prefix_hit(
            self.ledger.pool, req.request, req.adopted, self.null_block
        )
        self.run(self.decide([ParticipantStarted(req.scope, req.version, p) for p in participants]))
        return req, evicted

    def close_writers(self, blocks: Iterable[int], read: Mapping[int, str] | None = None) -> None:
        """``WriterClosed`` with the digest of its KV bytes for each of ``blocks`` whose writer is
        still open, to the core in one batch; ``read``: digests the workers already took of
        these bytes (within the step that wrote them), the rest are read now."""
        refs = self.ledger.refs
        todo = [b for b in dict.fromkeys(blocks) if b in refs and refs[b].writer_open]
        if not todo:
            return
        known = {b: read[b] for b in todo if b in read} if read else {}
        if known:
            self.on_digests_taken(len(known))
        digests = {**known, **self.read_digests([b for b in todo if b not in known])}
        events: list[Event] = []
        for block in sorted(digests):
            ref = refs[block]
            ref.writer_open = False
            events.append(WriterClosed(block, digests[block], self.block_name(ref)))
        self.run(self.decide(events))

    def block_name(self, ref: BlockRef) -> str | None:
        """The prefix identity of the tokens ``ref``'s block holds, named with its writer's close
        (``WriterClosed.prefix``), or None. Named only for a block past its request's context whose
        tokens are all known and have their KV written (``identity.OutputNames``): the request
        record's ``names`` continue its context's chain over vLLM's ``Request`` (``request``), its
        token ids and ``num_computed_tokens``. The core decides whether the name counts."""
        req = self.reqs.get(ref.request)
        if req is None or req.request is None:
            return None
        names: OutputNames | None = req.names
        if names is None:
            return None
        request = req.request
        return names.name(ref.position, request.all_token_ids, int(request.num_computed_tokens))

    def release_handoff_pins(self, req: Any) -> None:
        """The successor's own references hold its adopted blocks: drop the handoff pins."""
        pins, req.handoff_pins = list(req.handoff_pins), []
        for block in pins:
            self.ledger.release_handoff(block)

    def forget_closed_requests(self) -> None:
        reqs = self.reqs
        done = [
            rid
            for rid, r in reqs.items()
            if len(r.closed) == len(r.participants) and not r.pages and not r.handoff_pins
        ]
        for rid in done:
            for participant in reqs.pop(rid).participants:
                self.by_participant.pop(participant, None)

    # ---- pins, byte checks, adoption and freeing -------------------------------------------------

    def _pin(self, cmd: PinCertified) -> None:
        certificate = cmd.certificate
        for entry in certificate.entries:
            self.ledger.pin(entry.page, for_version=certificate.version)
        self.on_pinned(certificate)
        self.pending_reports[(certificate.scope, certificate.version)] = certificate
        if not self.reports_wait_for_a_step():
            self.send_reports(set())

    def send_reports(self, held: set[str]) -> None:
        """The byte check of every pending certificate whose scope is not in ``held``."""
        for key in sorted(self.pending_reports):
            scope, version = key
            if scope in held:
                continue
            certificate = self.pending_reports.pop(key)
            pages = list(certificate.pages)
            digests = self.digest_for_adoption(pages)
            self.on_reported(certificate, digests)
            report = tuple(PageDigest(p, digests[p]) for p in pages)
            self.report(AdoptionReport(scope, version, report))

    def _adopt(self, cmd: Adopt) -> None:
        for block in cmd.pages:
            self.ledger.adopt(block, cmd.scope, cmd.version)
        self.on_adopted(cmd)

    def _unpin(self, cmd: Unpin) -> None:
        failed = cmd.reason in VERIFICATION_FAILURES
        for block in cmd.pages:
            self.on_unpinned(block, cmd.reason, failed)
            self.ledger.unpin(block, evict=failed)  # a failed page is never a prefix hit again

    def _free(self, cmd: Free) -> None:
        self._forget_pages(self.ledger.free(cmd.pages))  # all or nothing; one call to the pool

    def _release_to_cache(self, cmd: ReleaseToCache) -> None:
        self._forget_pages(self.ledger.release_to_cache(cmd.pages))
        self.on_released(cmd)

    def _forget_pages(self, refs: Iterable[BlockRef]) -> None:
        reqs = self.reqs
        for ref in refs:
            req = reqs.get(ref.request)
            if req is not None and ref.block in req.pages:
                req.pages.remove(ref.block)
        self.forget_closed_requests()

    # ---- admission -------------------------------------------------------------------------------

    def _admit(self, cmd: Admit) -> None:
        pages = self.adopted_pages(cmd)
        refs = self.ledger.refs
        slots = {p: (refs[p].group, refs[p].position) for p in pages}
        tables = observe.adoption_tables(
            pages, slots, self.kv_windows, cmd.adopted_blocks, self.null_block
        )
        if pages:
            salts = {refs[p].salt for p in pages}
            if len(salts) != 1:
                raise IntegrationError(f"adopted pages of {cmd.scope} mix cache salts {salts}")
            salt = salts.pop()
        else:
            salt = self.cold_salt(cmd.scope)
        self.start(cmd, salt, tables)


#: What ``run`` does with each command, by its type (one dict lookup, no ``isinstance`` chain);
#: the others (``Publish``, ``Drop``, ``AllowWrite``) go to ``on_passed``.
_HANDLERS: dict[type, Callable[[CommandExecutor, Any], None]] = {
    Fence: CommandExecutor._fence,
    FenceWrite: CommandExecutor._fence_write,
    PinCertified: CommandExecutor._pin,
    Adopt: CommandExecutor._adopt,
    Unpin: CommandExecutor._unpin,
    Admit: CommandExecutor._admit,
    Free: CommandExecutor._free,
    ReleaseToCache: CommandExecutor._release_to_cache,
}
