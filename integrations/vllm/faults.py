"""Fault injection against a running :class:`~retire_vllm.facade.RetireEngine` (tests only).

* :func:`corrupt_page` changes the KV bytes of one block in place on every rank: same block id,
  same counts, same hashes, other bytes (what a buggy kernel, a bad transfer or a stray write
  would leave behind).  The byte check at adoption must catch it.
* :func:`drop_references` releases every reference the facade holds on a block *without telling
  the core* (what a buggy release path would do): vLLM may then hand the block to someone else,
  and generation tracking (``GenerationSpy`` -> ``PageReused``) must catch it.
* :func:`inject_frame` hands the core, at the facade's engine boundary, a TOKEN frame of any
  version (what a transport delivering late, twice or out of order would hand it) and reports
  the core's decision; a published frame reaches the consumer queue like any other.
* :func:`redeliver_receipt` hands the core a participant's receipt again (a duplicated closure
  report); the core must refuse it with a typed error and change nothing.
* :func:`lose_receipt` swallows a participant's next receipt on its way to the core (a closure
  report lost with its worker's message): the core must keep every page that participant may
  still write, and take the receipt when it is delivered late.
* :func:`shared_cold_salt` makes every version that inherits nothing run under one physical
  ``cache_salt``, whatever its tenant and scope (a salt derived without them): vLLM's prefix
  cache may then offer one scope's blocks to another (the isolation campaign's mutant).
* :func:`kill_rank_in_fence` SIGKILLs one tensor-parallel worker process in the middle of a
  fence: the core has issued ``Fence`` and the facade has aborted the request and closed its
  writers, and the rank dies just before the fence's receipt request reaches it, or on receiving
  it (before answering). The facade must surface the death as ``EngineDeadError`` and the core
  must free, reclaim and hand over nothing that waited for that rank's receipt.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from retire_core import Receipt

from . import introspect as ix
from . import observe

if TYPE_CHECKING:
    from .facade import RetireEngine


def corrupt_page(facade: RetireEngine, block_id: int, layer: int = 0, value: float = 0.5) -> None:
    facade.executor.collective_rpc(ix.worker_corrupt_block, args=(block_id, layer, value))


def drop_references(facade: RetireEngine, block_id: int) -> int:
    """Release the facade's pin and retention references on ``block_id``; returns how many."""
    page: Any = facade.pages[block_id]
    block = facade.pool.blocks[block_id]
    refs = len(page.pins) + 1  # the pins and the retention reference
    for _ in range(refs):
        facade.pool.free_blocks([block])
    return refs


def inject_frame(facade: RetireEngine, scope: str, version: int, token_ids: Sequence[int]) -> str:
    """A TOKEN frame of ``scope@version`` carrying ``token_ids``, handed to the core at the
    engine boundary; returns ``"publish"`` or the ``Drop`` reason."""
    from .facade_records import Chunk

    chunk = Chunk(scope, version, tuple(int(t) for t in token_ids), False, None)
    (fate,) = facade.deliver_engine_frames([chunk])
    return fate


def redeliver_receipt(facade: RetireEngine, scope: str, version: int, participant: str) -> None:
    """Hand the core ``participant``'s receipt once more (raises the core's typed error)."""
    facade.emit(Receipt(scope, version, participant))


@attrs.define
class LostReceipt:
    """What :func:`lose_receipt` swallowed: the receipt, once it has gone by."""

    participant: str
    receipt: Receipt | None = None


def lose_receipt(facade: RetireEngine, participant: str) -> LostReceipt:
    """Swallow ``participant``'s next ``Receipt`` on its way from the facade to the core (the
    facade believes it delivered it); ``redeliver_receipt`` delivers it late."""
    lost = LostReceipt(participant)
    emit: Callable[..., Any] = facade.emit

    def lossy(event: Any, *args: Any, **kwargs: Any) -> Any:
        if lost.receipt is None and isinstance(event, Receipt) and event.participant == participant:
            lost.receipt = event
            return []
        return emit(event, *args, **kwargs)

    facade.emit = lossy  # type: ignore[method-assign]
    return lost


def shared_cold_salt(facade: RetireEngine, salt: str = "retire:shared") -> None:
    """From now on every cold version of every scope runs under ``salt``."""
    facade.commands.cold_salt = lambda scope: salt  # type: ignore[method-assign]


#: vLLM's title of a tensor-parallel worker process (``/proc/<pid>/cmdline``; ``comm`` keeps only
#: 15 characters, the same for every rank).
WORKER_TITLE = "VLLM::Worker_TP{rank}"


def rank_pid(facade: RetireEngine, rank: int) -> int:
    """The pid of ``rank``'s worker process: vLLM's handle for it, checked to be a child of this
    (the engine's) process titled ``VLLM::Worker_TP<rank>``."""
    handles = [w for w in getattr(facade.executor, "workers", None) or () if w.rank == rank]
    if len(handles) != 1:
        raise ValueError(f"the engine has no worker process of rank {rank}")
    pid = int(handles[0].proc.pid)
    title = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
    ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    if title != WORKER_TITLE.format(rank=rank) or ppid != os.getpid():
        raise RuntimeError(f"pid {pid} is {title!r} below pid {ppid}, not rank {rank}'s worker")
    return pid


@attrs.define
class RankKill:
    """What :func:`kill_rank_in_fence` did, once the fence's receipt request went out."""

    rank: int
    pid: int
    answering: bool  # the rank died on receiving the request, not before it was sent
    sent_at: float | None = None  # (monotonic) the receipt request went out, the rank dying
    failed_at: float | None = None  # the request failed (the facade learnt of the death)
    answered: bool = False  # the request was answered after all: the kill did not take
    at_death: Any = None  # what ``on_death`` returned when the request failed


def kill_rank_in_fence(
    facade: RetireEngine,
    rank: int = 1,
    *,
    answering: bool = False,
    on_death: Callable[[RetireEngine], Any] | None = None,
) -> RankKill:
    """Kill ``rank``'s worker process (SIGKILL) at the facade's next fence receipt request
    (``observe.worker_fence_receipt``): just before it is sent, or (``answering``) when the rank
    receives it. ``on_death(facade)`` runs the moment the request fails, before the failure
    travels back through the facade; its answer is kept in ``at_death``."""
    executor = facade.executor
    kill = RankKill(rank, rank_pid(facade, rank), answering)
    real: Callable[..., Any] = executor.collective_rpc

    def rpc(method: Any, *args: Any, **kwargs: Any) -> Any:
        if method is not observe.worker_fence_receipt or kill.sent_at is not None:
            return real(method, *args, **kwargs)
        if answering:
            real(_die_at_fence_receipt, args=(rank,))
        else:
            os.kill(kill.pid, signal.SIGKILL)
        kill.sent_at = time.monotonic()
        try:
            answers = real(method, *args, **kwargs)
        except BaseException:
            kill.failed_at = time.monotonic()
            if on_death is not None:
                kill.at_death = on_death(facade)
            raise
        kill.answered = True
        return answers

    executor.collective_rpc = rpc
    return kill


def worker_exitcode(facade: RetireEngine, rank: int, wait_s: float = 30.0) -> int | None:
    """``rank``'s worker process exit code (negative: the signal), once it has exited."""
    for w in getattr(facade.executor, "workers", None) or ():
        if w.rank == rank:
            w.proc.join(wait_s)
            code: int | None = w.proc.exitcode
            return code
    return None


def _die_at_fence_receipt(worker: Any, rank: int) -> bool:
    """Runs on every rank (``collective_rpc``): on ``rank``, the next fence receipt request kills
    the worker process instead of being answered."""
    if int(getattr(worker, "rank", 0)) != rank:
        return False

    def die(worker: Any, block_ids: Sequence[int]) -> dict[str, Any]:
        os.kill(os.getpid(), signal.SIGKILL)
        raise AssertionError("unreachable")

    # ``collective_rpc`` pickles module-level functions by name: this rank now finds ``die``
    observe.worker_fence_receipt = die
    return True
