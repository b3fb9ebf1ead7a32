"""The observation glue both engines share: the in-process facade and the serving engine side.

What a scheduled step allocates and writes (``schedule_events``: the ``PageAllocated`` and
``WriteAttempted`` events of a step, in the order one by one would send them), what the step's
verification made of the speculative drafts it wrote (``verify_drafts``), the prefix-hit
checks of an admitted version (``restrict_prefix_hit`` before it can be scheduled,
``check_prefix_hit`` at its first schedule), the KV digests of blocks on every rank
(``read_digests``) and the rank receipts of a closing request (``rank_receipts``). Each reads vLLM
and builds events or raises ``IntegrationError``; none calls the core or decides protocol.

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

from retire_core import DraftsVerified, Event, PageAllocated, WriteAttempted

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
    adopted: tuple[int, ...]
    block_ids: list[int]
    pages: list[int]
    scheduled: bool


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
    list[tuple[Any, int, int]],
    list[tuple[Any, int, int, bool]],
    list[Any],
    list[DraftWrite],
]:
    """The step's events, its allocations ``(request, block, index)``, its writes ``(request,
    block, index, the write fills the block with verified tokens)``, the requests scheduled for
    the first time (whose prefix hit the caller checks) and the blocks it writes drafts into
    (complete only if ``verify_drafts`` says so after the commit). Updates each request's
    ``block_ids`` and ``scheduled``. Raises if vLLM hands a request a block that is still
    retained for another."""
    events: list[Event] = []
    allocations: list[tuple[Any, int, int]] = []
    writes: list[tuple[Any, int, int, bool]] = []
    first_time: list[tuple[Any, list[int], int]] = []
    drafts: list[DraftWrite] = []
    claimed: dict[int, str] = {}  # block id -> request, for this step's allocations
    kvm = scheduler.kv_cache_manager
    requests = scheduler.requests
    spec_tokens: Mapping[str, Sequence[int]] = scheduler_output.scheduled_spec_decode_tokens
    for rid, n in scheduler_output.num_scheduled_tokens.items():
        req = reqs.get(rid)
        if req is None:
            continue
        ids = ix.manager_block_ids(kvm, rid)
        request = requests[rid]
        end = int(request.num_computed_tokens)
        start = end - int(n)
        # The step's last ``len(spec_tokens[rid])`` positions hold drafts.
        verified_end = end - len(spec_tokens.get(rid, ()))
        if not req.scheduled:
            req.scheduled = True
            first_time.append((req, ids, start))
        # Blocks already seen in the request's previous block table were reported then.
        prev = req.block_ids
        first = len(prev) if ids[: len(prev)] == prev else 0
        if first < len(ids):
            known = set(req.pages) | set(req.adopted)
            for idx in range(first, len(ids)):
                bid = ids[idx]
                if bid in known:
                    continue
                if bid in retained or bid in claimed:
                    owner = retained[bid].request if bid in retained else claimed[bid]
                    raise IntegrationError(
                        f"block {bid} handed to {rid} while it is still retained for {owner}"
                    )
                claimed[bid] = rid
                events.append(PageAllocated(req.scope, req.version, rid, bid, idx))
                allocations.append((req, bid, idx))
        req.block_ids = ids
        for idx in range(start // block_size, (end - 1) // block_size + 1):
            completes = end >= (idx + 1) * block_size
            draft = verified_end < end and (idx + 1) * block_size > verified_end
            events.append(WriteAttempted(req.scope, req.version, rid, ids[idx], completes, draft))
            writes.append((req, ids[idx], idx, completes and not draft))
            if draft:
                drafts.append(DraftWrite(rid, request, ids[idx], idx))
    return events, allocations, writes, first_time, drafts


def verify_drafts(
    drafts: Sequence[DraftWrite], refused: set[str], block_size: int
) -> tuple[list[Event], list[int]]:
    """After the commit: each draft block's ``DraftsVerified`` (complete when the accepted tokens
    fill it) and the blocks that completed. A request whose commit was refused verified nothing:
    its writers close over the drafts, which rolls them back."""
    events: list[Event] = []
    completed: list[int] = []
    for d in drafts:
        if d.rid in refused:
            continue
        completes = int(d.request.num_computed_tokens) >= (d.index + 1) * block_size
        events.append(DraftsVerified(d.block, completes))
        if completes:
            completed.append(d.block)
    return events, completed


def check_one_kv_cache_group(kvm: Any) -> None:
    """Retire tracks one KV cache group: refuse, before attaching, an engine whose model mixes
    attention types (sliding-window and full-attention layers build one group each, and a
    sliding-window group hands requests the null block for positions outside its window)."""
    groups = kvm.kv_cache_config.kv_cache_groups
    if len(groups) != 1:
        kinds = ", ".join(type(g.kv_cache_spec).__name__ for g in groups)
        raise IntegrationError(
            f"this engine has {len(groups)} KV cache groups ({kinds}); Retire certifies, pins "
            "and adopts the pages of one group only (models that mix attention types are not "
            "supported yet)"
        )


def restrict_prefix_hit(pool: Any, request: Any, adopted: Sequence[int]) -> int:
    """Before an admitted version's request can be scheduled: its prefix hit must be exactly its
    adopted blocks, mapped under its own block hashes; any other cached block on its hash chain
    is evicted from the prefix cache. Returns how many were evicted."""
    evicted = 0
    for i, h in enumerate(request.block_hashes):
        hit = pool.get_cached_block(h, [0])
        if i < len(adopted):
            if hit is None or hit[0].block_id != adopted[i]:
                found = None if hit is None else hit[0].block_id
                raise IntegrationError(
                    f"adopted block {adopted[i]} of {request.request_id} is not its prefix-cache "
                    f"entry {i} (found {found})"
                )
        elif hit is not None:
            pool.evict_blocks({hit[0].block_id})
            evicted += 1
    return evicted


def check_prefix_hit(
    rid: str, ids: Sequence[int], start: int, adopted: Sequence[int], block_size: int
) -> None:
    """At the first schedule: vLLM's prefix hit is exactly the adopted blocks."""
    n = len(adopted)
    if start != n * block_size or tuple(ids[:n]) != tuple(adopted):
        raise IntegrationError(
            f"{rid}: vLLM's prefix hit is {start} tokens / blocks {list(ids[: max(n, 1)])}, "
            f"the core adopted {n} blocks {list(adopted)}"
        )


def read_digests(executor: Any, pages: Sequence[int]) -> dict[int, str]:
    """sha256 of the KV bytes of each block (all layers, K and V; with TP the per-rank digests
    combined), read through ``collective_rpc`` so that it works for every executor."""
    ids = sorted(set(pages))
    if not ids:
        return {}
    per_rank = collective(executor, ix.worker_block_digests, (ids,))
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


def _lookup(digests: dict[Any, str], page: int) -> str:
    value = digests.get(page)
    return value if value is not None else digests[str(page)]
