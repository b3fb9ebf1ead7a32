"""The observation glue both engines share: the in-process facade and the serving engine side.

What a scheduled step allocates and writes (``schedule_events``: the ``PageAllocated`` and
``WriteAttempted`` events of a step, in every KV cache group, in the order one by one would send
them), what the step's verification made of the speculative drafts it wrote
(``verify_drafts``), the engine's KV cache groups as the contract's ``kv_windows``, an
admitted version's block tables (``adoption_tables``) and its prefix-hit checks
(``restrict_prefix_hit`` before it can be scheduled, ``check_prefix_hit`` at its first
schedule), the KV digests of blocks on every rank (``read_digests``) and the rank receipts of a
closing request (``rank_receipts``). Each reads vLLM and builds events or raises
``IntegrationError``; none calls the core or decides protocol.

Every call to the workers (``collective``) is bounded: vLLM's ``MultiprocExecutor`` waits for a
rank's answer without a deadline unless given one. A rank that died surfaces at once -- vLLM's
worker monitor (a thread waiting on the worker processes' sentinels) sets ``is_failed``, shuts
the executor down and wakes the waiting reader, which raises ``RuntimeError`` -- and a rank that
stops answering surfaces after ``RPC_TIMEOUT_S``; both as :class:`EngineDeadError`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import attrs

from retire_core import DraftsVerified, Event, PageAllocated, PageUnreferenced, WriteAttempted
from retire_core.handoff import required_slots

from . import introspect as ix
from .errors import EngineDeadError, IntegrationError

#: The longest Retire waits for the workers' answer to one of its calls (digests, receipts):
#: twice the bound vLLM puts on a model step by default (``VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS``,
#: 300 s), since a receipt is answered after any step in flight.
RPC_TIMEOUT_S = 600.0


class Managed(Protocol):
    """A request under Retire, as both engines keep it."""

    rid: str
    scope: str
    version: int
    participants: tuple[str, ...]  # the request's own first, then its ranks'
    adopted: tuple[tuple[int, ...], ...]  # one block table per KV cache group
    tables: BlockTables
    pages: list[int]
    scheduled: bool


@attrs.define(slots=True)
class BlockTables:
    """A request's block table in every KV cache group as vLLM holds it: each group manager's
    own list of blocks, held by reference (never copied), and how many of its entries had been
    read when the request was last scheduled. A step then reads only what vLLM appended since
    (``schedule_events``): a long context costs nothing per step. For a sliding-window group,
    also the block ids as they were read (``ids``: vLLM puts its null block in place of a block
    its window passed) and how many leading entries are null already (``passed``)."""

    lists: list[list[Any]] = attrs.field(factory=list)
    seen: list[int] = attrs.field(factory=list)
    ids: dict[int, list[int]] = attrs.field(factory=dict)
    passed: dict[int, int] = attrs.field(factory=dict)

    def pages(self, null: int) -> set[int]:
        """The blocks in the tables (the null block is no page)."""
        return {b.block_id for blocks in self.lists for b in blocks} - {null}

    def __len__(self) -> int:
        return sum(map(len, self.lists))


class Retained(Protocol):
    request: str


@attrs.frozen(slots=True)
class DraftWrite:
    """A block this step writes speculative (not yet verified) tokens into: ``request`` is
    vLLM's request object, whose ``num_computed_tokens`` the commit lowers by the rejected
    drafts."""

    rid: str
    request: Any
    block: int
    index: int


def schedule_events(
    reqs: Mapping[str, Managed],
    scheduler: Any,
    scheduler_output: Any,
    retained: Mapping[int, Retained],
    block_size: int,
) -> tuple[
    list[Event],
    list[tuple[Any, int, int, int]],
    list[tuple[Any, int, int, bool]],
    list[tuple[Any, list[list[int]], int]],
    list[DraftWrite],
]:
    """The step's events, its allocations ``(request, block, index, group)``, its writes
    ``(request, block, index, the write fills the block with verified tokens)``, the requests
    scheduled for the first time with their block tables (whose prefix hit the caller checks) and
    the blocks it writes drafts into (complete only if ``verify_drafts`` says so after the
    commit). Every KV cache group is read: a position's block in each group is a page of that
    group, and the null block a sliding-window group puts where its window has passed is no page.
    A block of the request's own (``pages``, or adopted) that its window passed since the last
    schedule is a ``PageUnreferenced``, first among the events: vLLM dropped it from the table and
    freed its reference, having processed and committed every token that reads it
    (``SlidingWindowManager.remove_skipped_blocks``). Updates each request's ``tables`` and
    ``scheduled``. Raises if vLLM hands a request a block that is still retained for another.

    A request's blocks are reported once, when they first appear in its tables. In a group
    whose manager only appends to the list it read last time (``ix.APPEND_ONLY_MANAGERS``) they
    are the entries past those it had read: O(the step's new blocks). Any other list (the first
    schedule, one vLLM made anew after a preemption, another kind of manager) is read whole,
    skipping the blocks the request already holds."""
    events: list[Event] = []
    allocations: list[tuple[Any, int, int, int]] = []
    writes: list[tuple[Any, int, int, bool]] = []
    first_time: list[tuple[Any, list[list[int]], int]] = []
    drafts: list[DraftWrite] = []
    claimed: dict[int, str] = {}  # block id -> request, for this step's allocations
    kvm = scheduler.kv_cache_manager
    null = ix.null_block_id(kvm)
    append_only = ix.append_only_groups(kvm)
    sliding = ix.sliding_window_groups(kvm)
    passed: list[Event] = []
    requests = scheduler.requests
    spec_tokens: Mapping[str, Sequence[int]] = scheduler_output.scheduled_spec_decode_tokens
    for rid, n in scheduler_output.num_scheduled_tokens.items():
        req = reqs.get(rid)
        if req is None:
            continue
        lists = ix.manager_block_lists(kvm, rid)
        request = requests[rid]
        end = int(request.num_computed_tokens)
        start = end - int(n)
        # The step's last ``len(spec_tokens[rid])`` positions hold drafts.
        verified_end = end - len(spec_tokens.get(rid, ()))
        me = req.participants[0]  # the request's own participant (a new one after a preemption)
        if not req.scheduled:
            req.scheduled = True
            first_time.append((req, [[b.block_id for b in blocks] for blocks in lists], start))
        held = req.tables
        known: set[int] | None = None
        for group in sliding:
            passed.extend(_passed(req, held, group, lists[group], null))
        for group, blocks in enumerate(lists):
            skip: set[int] | None = None
            if append_only[group] and group < len(held.lists) and blocks is held.lists[group]:
                first = held.seen[group]  # vLLM only appended to this list since
            else:
                if known is None:
                    known = set(req.pages) | table_pages(req.adopted, null)
                first, skip = 0, known
            for idx in range(first, len(blocks)):
                bid = blocks[idx].block_id
                if bid == null or (skip is not None and bid in skip):
                    continue
                if bid in retained or bid in claimed:
                    owner = retained[bid].request if bid in retained else claimed[bid]
                    raise IntegrationError(
                        f"block {bid} handed to {rid} while it is still retained for {owner}"
                    )
                claimed[bid] = rid
                events.append(PageAllocated(req.scope, req.version, me, bid, idx, group))
                allocations.append((req, bid, idx, group))
        held.lists, held.seen = lists, [len(blocks) for blocks in lists]
        for idx in range(start // block_size, (end - 1) // block_size + 1):
            completes = end >= (idx + 1) * block_size
            draft = verified_end < end and (idx + 1) * block_size > verified_end
            for blocks in lists:
                bid = blocks[idx].block_id
                events.append(WriteAttempted(req.scope, req.version, me, bid, completes, draft))
                writes.append((req, bid, idx, completes and not draft))
                if draft:
                    drafts.append(DraftWrite(rid, request, bid, idx))
    return passed + events, allocations, writes, first_time, drafts


def _passed(
    req: Managed, held: BlockTables, group: int, blocks: list[Any], null: int
) -> list[Event]:
    """``PageUnreferenced`` for each of the request's pages that vLLM replaced by its null block
    in sliding-window ``group`` since the last schedule (a block's index in the list is its
    position, whether vLLM kept the list or made it anew), and ``held``'s record of that group's
    block ids brought up to date. O(the step's passed and new blocks)."""
    out: list[Event] = []
    ids = held.ids.setdefault(group, [])
    i, end = held.passed.get(group, 0), min(len(ids), len(blocks))
    mine: set[int] | None = None
    while i < end and blocks[i].block_id == null:
        bid = ids[i]
        if bid != null:
            if mine is None:
                mine = set(req.pages) | table_pages(req.adopted, null)
            if bid in mine:
                out.append(PageUnreferenced(bid))
        i += 1
    ids.extend(b.block_id for b in blocks[len(ids) :])
    while i < len(ids) and ids[i] == null:  # null on arrival (a prefix hit before the window)
        i += 1
    held.passed[group] = i
    return out


def ends_by_length(request: Any) -> bool:
    """Whether the step just scheduled for ``request`` ends it by length: it computes every token
    the request has and samples the output that reaches ``max_tokens`` (vLLM's ``check_stop``
    then finishes it at this step's commit, unless a stop token does first)."""
    computes_all = int(request.num_computed_tokens) >= int(request.num_tokens)
    return computes_all and int(request.num_output_tokens) + 1 >= int(request.max_tokens)


def table_pages(tables: Sequence[Sequence[int]], null: int) -> set[int]:
    """The pages of a request's block tables, one per group (the null block is no page)."""
    return {b for table in tables for b in table if b != null}


def verify_drafts(
    drafts: Sequence[DraftWrite], refused: set[str], block_size: int, refs: Mapping[int, Any]
) -> tuple[list[Event], list[int]]:
    """After the commit: each draft block's ``DraftsVerified`` (complete when the accepted tokens
    fill it) and the blocks that completed. A request whose commit was refused verified nothing:
    its writers close over the drafts, which rolls them back. Nor did a draft whose writer is
    already closed (``refs``, the ledger's references): its request finished during the step --
    vLLM takes the aborts that came in while the model ran just before the commit -- and the close
    rolled the drafts back and may have freed the block."""
    events: list[Event] = []
    completed: list[int] = []
    for d in drafts:
        ref = refs.get(d.block)
        if d.rid in refused or ref is None or ref.request != d.rid or not ref.writer_open:
            continue
        completes = int(d.request.num_computed_tokens) >= (d.index + 1) * block_size
        events.append(DraftsVerified(d.block, completes))
        if completes:
            completed.append(d.block)
    return events, completed


def kv_windows(kvm: Any, block_size: int) -> tuple[int, ...]:
    """The contract's ``kv_windows`` for this engine: one entry per KV cache group, in vLLM's
    group order: 0 for a full-attention group, ``ceil((W - 1) / block_size)`` blocks for a
    group with a sliding window of ``W`` tokens (the blocks before the cut a layer at the cut
    still reads). Raises :class:`IntegrationError`, before anything is attached, for a group of
    another kind (Mamba state, chunked local attention, ...) or of another block size: Retire
    does not know which of its blocks a successor reads."""
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MLAAttentionSpec, SlidingWindowSpec

    windows = []
    config = kvm.kv_cache_config
    for g, group in enumerate(config.kv_cache_groups):
        spec = group.kv_cache_spec
        kind = type(spec).__name__
        if int(spec.block_size) != block_size:
            raise IntegrationError(
                f"KV cache group {g} ({kind}) has blocks of {spec.block_size} tokens, the "
                f"engine {block_size}"
            )
        if isinstance(spec, SlidingWindowSpec):
            if spec.extra_retained_tokens:  # kept past the window for a re-prefill: not modelled
                raise IntegrationError(
                    f"KV cache group {g} retains {spec.extra_retained_tokens} tokens past its "
                    "sliding window (multi-module speculative decoding): not supported"
                )
            if config.prefix_cache_retention_interval is not None:
                # vLLM then hashes only the window's tails at the boundaries it expects a hit
                # at; a successor's cut may be at any block.
                raise IntegrationError(
                    f"KV cache group {g} has a sliding window and vLLM keeps its prefix-cache "
                    "entries sparsely; Retire needs every full block cached: run the engine with "
                    "prefix_cache_retention_interval=None (--prefix-cache-retention-interval None)"
                )
            windows.append(-(-(int(spec.sliding_window) - 1) // block_size))
        elif type(spec) in (FullAttentionSpec, MLAAttentionSpec):  # (not their other kinds)
            windows.append(0)
        else:
            raise IntegrationError(
                f"KV cache group {g} is a {kind}: Retire certifies, pins and adopts the pages of "
                "full-attention and sliding-window groups only"
            )
    return tuple(windows)


def adoption_tables(
    pages: Sequence[int],
    slots: Mapping[int, tuple[int, int]],
    windows: Sequence[int],
    cut: int,
    null: int,
) -> tuple[tuple[int, ...], ...]:
    """Each group's block table for the first ``cut`` blocks of an admitted version, built from
    the pages ``Adopt`` handed over (``slots``: page -> (group, position)): a slot the cut
    requires (``retire_core.handoff.required_slots``) holds its page, a slot a sliding-window
    group no longer reads holds the null block, as in vLLM's own prefix hit. Raises unless the
    pages fill exactly the required slots."""
    by_slot = {slots[p]: p for p in pages}
    required = required_slots(tuple(windows), cut)
    if len(by_slot) != len(pages) or set(by_slot) != set(required):
        raise IntegrationError(
            f"the pages handed over fill slots {sorted(by_slot)} (group, position); a cut of "
            f"{cut} blocks needs {required}"
        )
    return tuple(tuple(by_slot.get((g, i), null) for i in range(cut)) for g in range(len(windows)))


def restrict_prefix_hit(
    pool: Any, request: Any, adopted: Sequence[Sequence[int]], null: int
) -> int:
    """Before an admitted version's request can be scheduled: in every group its prefix hit must
    be exactly its adopted blocks (``adopted``: one table per group, the null block where the
    group reads nothing), mapped under its own block hashes; any other cached block on its hash
    chain is evicted from the prefix cache. Returns how many were evicted."""
    evicted = 0
    for g, table in enumerate(adopted):
        for i, h in enumerate(request.block_hashes):
            hit = pool.get_cached_block(h, [g])
            want = table[i] if i < len(table) else null
            if want != null:
                if hit is None or hit[0].block_id != want:
                    found = None if hit is None else hit[0].block_id
                    raise IntegrationError(
                        f"adopted block {want} of {request.request_id} is not its prefix-cache "
                        f"entry {i} in KV cache group {g} (found {found})"
                    )
            elif hit is not None:
                pool.evict_blocks({hit[0].block_id})
                evicted += 1
    return evicted


def check_prefix_hit(
    rid: str,
    tables: Sequence[Sequence[int]],
    start: int,
    adopted: Sequence[Sequence[int]],
    block_size: int,
) -> None:
    """At the first schedule: vLLM's prefix hit is exactly the adopted blocks, in every group."""
    n = len(adopted[0]) if adopted else 0
    hit = [tuple(ids[:n]) for ids in tables]
    if start != n * block_size or hit != [tuple(t) for t in adopted]:
        raise IntegrationError(
            f"{rid}: vLLM's prefix hit is {start} tokens / blocks {hit} (one table per KV cache "
            f"group), the core adopted {n} blocks {[list(t) for t in adopted]}"
        )


def read_digests(executor: Any, pages: Sequence[int]) -> dict[int, str]:
    """sha256 of the KV bytes of each block (all layers, K and V; with TP the per-rank digests
    combined), read through ``collective_rpc`` so that it works for every executor."""
    ids = sorted(set(pages))
    if not ids:
        return {}
    return rank_digests(collective(executor, ix.worker_block_digests, (ids,)), ids)


def rank_digests(per_rank: Sequence[Mapping[int, str]], ids: Sequence[int]) -> dict[int, str]:
    """The digest of each of ``ids`` from every rank's table (rank order): one rank's as it is,
    several ranks' combined (sha256 of theirs joined)."""
    if len(per_rank) == 1:
        return {p: _lookup(per_rank[0], p) for p in ids}
    return {
        p: hashlib.sha256("|".join(_lookup(r, p) for r in per_rank).encode()).hexdigest()
        for p in ids
    }


def rank_receipts(
    executor: Any, rid: str, ranks: Sequence[str], block_ids: Sequence[int]
) -> list[dict[str, Any]]:
    """Each rank's receipt for a closing request (answered after any step in flight); raises if a
    rank named in ``ranks`` (``<rid>/rank<r>``) did not answer."""
    answers: list[dict[str, Any]] = collective(executor, worker_fence_receipt, (list(block_ids),))
    answered = {f"{rid}/rank{int(a['rank'])}" for a in answers}
    missing = set(ranks) - answered
    if missing:
        raise IntegrationError(f"no receipt from {sorted(missing)}")
    return answers


def collective(executor: Any, method: Any, args: tuple[Any, ...]) -> list[Any]:
    """``executor.collective_rpc(method, args=args)``, bounded by ``RPC_TIMEOUT_S``; raises
    :class:`EngineDeadError` if a worker died or no answer came in time."""
    try:
        answers: list[Any] = executor.collective_rpc(method, timeout=RPC_TIMEOUT_S, args=args)
    except (RuntimeError, TimeoutError) as err:
        dead = engine_death(executor, err)
        if dead is None:
            raise  # a worker raised: its error, not a death
        raise dead from err
    return answers


def engine_failed(executor: Any) -> bool:
    """vLLM's worker monitor saw a worker process die (``MultiprocExecutor.is_failed``; an
    in-process executor has no worker processes to lose)."""
    return bool(getattr(executor, "is_failed", False))


def engine_death(executor: Any, err: BaseException | None = None) -> EngineDeadError | None:
    """The engine's death as an :class:`EngineDeadError` (naming the worker processes that have
    exited) if a worker died or ``err`` is a timeout waiting for the workers; else None."""
    if isinstance(err, TimeoutError):
        return EngineDeadError(f"the workers did not answer in time ({err})")
    if not engine_failed(executor):
        return None
    exited = [
        f"rank {w.rank} (pid {w.proc.pid}, exit code {w.proc.exitcode})"
        for w in getattr(executor, "workers", None) or ()
        if w.proc.exitcode is not None
    ]
    return EngineDeadError(
        "a worker process of the engine died; vLLM shut its executor down"
        + (f" (exited: {', '.join(exited)})" if exited else "")
    )


def worker_fence_receipt(worker: Any, block_ids: Sequence[int]) -> dict[str, Any]:
    """Runs on every worker rank (``collective_rpc``), after any step in flight: the rank's
    receipt for a fenced request, with the digests of the request's blocks on that rank."""
    return {
        "rank": int(getattr(worker, "rank", 0)),
        "digests": ix.worker_block_digests(worker, list(block_ids)),
    }


def _lookup(digests: Mapping[Any, str], page: int) -> str:
    value = digests.get(page)
    return value if value is not None else digests[str(page)]
