"""``ScopeCalls``: the scope API as the API process reaches it, one utility call at a time.

``open`` (a scoped request arrives: ``Submit`` or ``Supersede``), ``abandon``, ``pause``,
``unpause``, ``cancel``, ``expire``, ``status``, ``metrics``, ``leaks`` and ``release_all``,
each answered from the core's state and the engine side's records. Every call checks its input
and its tenant, hands one batch of events to the engine side's ``decide`` and the commands to its
``execute``, so a refused call raises a typed error and changes nothing. What does not live here:
the scheduler hooks, the executor and the block work (``engine_side``), and the HTTP mapping of
the answers (``http``, ``wire``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import attrs

from retire_core import (
    DEFAULT_CONTRACT,
    Cancel,
    Command,
    Contract,
    Event,
    Fence,
    Forget,
    Pause,
    RetireError,
    ScopeState,
    Submit,
    Supersede,
    Unpause,
)
from retire_core.errors import ContractError, IllegalTransitionError, UnknownScopeError
from retire_core.gates import revocation
from retire_core.ids import check_name

from .. import identity
from ..engine_config import ENGINE_NUMERICAL_MODE, engine_contract
from . import early_opens, wire
from .records import ScopeInfo

if TYPE_CHECKING:
    from .engine_side import EngineSide


class TenantMismatchError(RetireError):
    """A request names a scope that belongs to another tenant."""


@attrs.define
class Opening:
    """An ``open`` the core decided (``ScopeCalls.decide_open``), until its commands are carried
    out (``carry_out_open``) and it is answered (``_answer``)."""

    scope: str
    version: int
    revision: bool  # a Supersede (else a Submit)
    commands: list[Command]
    fenced: list[int]  # the versions it fenced
    future: Future[dict[str, Any]]  # answered by the version's Admit (or by a later fence)
    incarnation: int
    started: float  # perf_counter, for the cleanup histogram
    timing: dict[str, float]  # wall-clock moments, for Server-Timing
    carried_out: bool = False


class ScopeCalls:
    def __init__(self, side: EngineSide) -> None:
        self.side = side

    def op_open(self, payload: dict[str, Any]) -> Any:
        """A scoped request arrived at the API process: ``Submit`` a new scope or ``Supersede``
        a live one. The ``open`` thread may have decided this opening already (the API process
        sends it there first: ``EngineSide.open_early``), and the ``call`` hook carried out its
        commands on entry: answer with that decision. Else decide here; an opening also sent to
        the ``open`` socket (``early``) is remembered until that copy comes, which then changes
        nothing (``early_opens.OpenCopies``)."""
        opening = self._opening_id(payload)
        if opening is not None:  # (registered before deciding: a refused open's copy waits too)
            copy = early_opens.copy_of(payload) if payload.get("early") else None
            early = self.side.copies.take_utility(opening, copy)
            if early is not None:
                assert early.carried_out, "the call hook carries out the early opens first"
                return self._answer(early)
        decided = self.decide_open(payload)
        self.carry_out_open(decided)
        return self._answer(decided)

    def _opening_id(self, payload: dict[str, Any]) -> str | None:
        opening = payload.get("opening")
        return None if opening is None else check_name(opening, "opening")

    def decide_open(self, payload: dict[str, Any]) -> Opening:
        """The core's decision on an ``open`` and what this side records with it (the version's
        opening future, the opening id its request will carry): raises, changing nothing, on
        bad input. Touches no vLLM structure (the ``open`` thread calls it while a step runs);
        ``carry_out_open`` carries out its commands."""
        received = time.time()  # wall clock: the API process compares it with its own
        scope = check_name(payload.get("scope"), "scope")
        tenant = check_name(payload.get("tenant"), "tenant")
        tokens = tuple(int(t) for t in payload["prompt_token_ids"])
        contract = self._contract(payload)
        # the request that follows the open carries this id (``EngineSide.holds``)
        opening = self._opening_id(payload)
        info = self.side.scopes.get(scope)
        record = self.side.core.state.scopes.get(scope)
        if record is not None and record.tenant != tenant:
            raise TenantMismatchError(f"scope {scope!r} belongs to another tenant")
        context, chain = identity.context_chain(
            tokens,
            tenant=tenant,
            scope=scope,
            numerical_mode=contract.numerical_mode,
            block_size=self.side.block_size,
        )
        event: Event
        if record is None:
            fingerprint = identity.fingerprint(
                model=self.side.model_id,
                dtype=self.side.dtype,
                block_size=self.side.block_size,
                tenant=tenant,
                tensor_parallel_size=self.side.tp,
            )
            event = Submit(scope, tenant, fingerprint, context, contract)
        else:
            event = Supersede(scope, context, contract)
        started = time.perf_counter()
        commands = self.side.decide([event])  # raises (and changes nothing) when refused
        decided = time.time()
        if info is None:
            info = self.side.scopes[scope] = ScopeInfo(tenant, time.monotonic())
        version = self.side.core.current_version(scope)
        if opening is not None:
            self.side.pipelined[opening] = (scope, version)
        info.last_active = time.monotonic()
        info.context_blocks[version] = len(context)
        info.names[version] = identity.OutputNames(chain)
        future: Future[dict[str, Any]] = Future()
        self.side.opening[(scope, version)] = future
        return Opening(
            scope,
            version,
            record is not None,
            commands,
            self._fenced_versions(commands),
            future,
            info.incarnation,
            started,
            {"received": received, "decided": decided},
        )

    def carry_out_open(self, decided: Opening) -> None:
        """The commands of a decided ``open``, on the busy loop (between steps, or at a hook
        of the step in flight: its fences then wait for the step's commit)."""
        scope = decided.scope
        self.side.first_fence_output = None
        self._settle_admissions(scope)
        self.side.commands.run(decided.commands)
        decided.carried_out = True
        decided.timing["carried_out"] = time.time()
        self.side.scopes[scope].last_active = time.monotonic()  # forgotten one idle time later
        self._settle_openings(scope)
        if decided.revision:
            self.side.count("supersedes")
            self.side.cleanup.observe(time.perf_counter() - decided.started)
        else:
            self.side.count("submits")
        if self.side.first_fence_output is not None:  # the old stream's end is on its way
            decided.timing.setdefault("fenced", self.side.first_fence_output)

    def _answer(self, decided: Opening) -> Any:
        """The open's answer: now if the version is admitted (or was revised before it was),
        else a future the ``Admit`` answers (vLLM defers the utility reply)."""
        timing, incarnation, future = decided.timing, decided.incarnation, decided.future
        if future.done():
            answer = future.result()
            answer.update(fenced=decided.fenced, timing=timing, incarnation=incarnation)
            return answer

        def stamp(answered: Future[dict[str, Any]]) -> None:
            # runs before the reply is sent: vLLM adds its callback to the future it is handed
            if not answered.cancelled() and answered.exception() is None:
                answered.result().update(timing=timing, incarnation=incarnation)

        future.add_done_callback(stamp)
        return future

    def op_abandon(self, payload: dict[str, Any]) -> dict[str, Any]:
        """The API process's request for this version will not run as it (its client left while
        the version was opened, or the request failed first): forget the admission if no request
        took it, and the opening if the request was never sent."""
        scope = check_name(payload.get("scope"), "scope")
        version = int(payload["version"])
        self._forget_openings(scope, version)
        return {"ok": True, "dropped": self.side.forget_admission(scope, version, "abandoned")}

    def _forget_openings(self, scope: str, version: int | None = None) -> None:
        """The requests that were to follow the opens of ``scope`` (of its ``version`` only,
        if given) will never come."""
        pipelined = self.side.pipelined
        for opening in [
            o for o, (s, v) in pipelined.items() if s == scope and version in (None, v)
        ]:
            del pipelined[opening]

    def op_pause(self, payload: dict[str, Any]) -> dict[str, Any]:
        scope = self._own_scope(payload)
        self.side.commands.run(self.side.decide([Pause(scope)]))
        self.side.scopes[scope].last_active = time.monotonic()
        return self._status(scope)

    def op_unpause(self, payload: dict[str, Any]) -> dict[str, Any]:
        scope = self._own_scope(payload)
        self.side.commands.run(self.side.decide([Unpause(scope)]))
        self.side.scopes[scope].last_active = time.monotonic()
        return self._status(scope)

    def op_cancel(self, payload: dict[str, Any]) -> dict[str, Any]:
        scope = self._own_scope(payload)
        return {**self._cancel(scope), **self._status(scope)}

    def _cancel(self, scope: str) -> dict[str, Any]:
        started = time.perf_counter()
        commands = self.side.decide([Cancel(scope)])
        fenced = self._fenced_versions(commands)
        self._settle_admissions(scope)
        self.side.commands.run(commands)
        self.side.scopes[scope].last_active = time.monotonic()  # forgotten one idle time later
        self._settle_openings(scope)
        self.side.count("cancels")
        self.side.cleanup.observe(time.perf_counter() - started)
        return {"fenced": fenced}

    def op_expire(self, payload: dict[str, Any]) -> dict[str, Any]:
        """Cancel every live scope idle for longer than ``idle_seconds`` (no participant still
        running, nothing waiting for admission, no request or open for that long), and forget
        every scope cancelled longer ago than that with nothing of it left: requests on a
        cancelled scope get ``scope_cancelled`` for at least ``idle_seconds``, then its id is
        free again, and nothing Retire keeps grows with the number of scopes ever opened."""
        idle = float(payload["idle_seconds"])
        if not idle >= 0:
            raise ContractError(f"idle_seconds must be a non-negative number, got {idle!r}")
        now = time.monotonic()
        busy = (
            {s for s, _ in self.side.opening}
            | {s for s, _ in self.side.admissions}
            | {r.scope for r in self.side.reqs.values()}
        )
        expired, forgotten = [], []
        for scope, record in list(self.side.core.state.scopes.items()):
            info = self.side.scopes.get(scope)
            if (
                info is None
                or scope in busy
                or now - info.last_active < idle
                or any(not p.closed for p in record.participants.values())
            ):
                continue
            if record.state is ScopeState.CANCELLED:
                # every request of it is closed and its frames were gated here: none is on its
                # way (``Forget``'s precondition); the core refuses while pages are left
                try:
                    commands = self.side.decide([Forget(scope)])
                except IllegalTransitionError:
                    continue
                self.side.commands.run(commands)
                del self.side.scopes[scope]
                self._forget_openings(scope)
                forgotten.append(scope)
                continue
            self._cancel(scope)
            expired.append(scope)
        self.side.count("expired", len(expired))
        self.side.count("forgotten", len(forgotten))
        return {"ok": True, "expired": expired, "forgotten": forgotten}

    def op_metrics(self, payload: dict[str, Any]) -> dict[str, Any]:
        scopes = self.side.core.state.scopes
        draining = sum(
            1
            for r in scopes.values()
            for p in r.participants.values()
            if not p.closed and revocation(r, p.version) is not None
        )
        return {
            "ok": True,
            "counters": dict(self.side.counters),
            "live_scopes": sum(1 for r in scopes.values() if r.state is not ScopeState.CANCELLED),
            "fences_in_progress": draining,
            "cleanup_seconds": self.side.cleanup.as_dict(),
            "engine_time": self.side.engine_time.as_dict(),
        }

    def op_status(self, payload: dict[str, Any]) -> dict[str, Any]:
        return self._status(self._own_scope(payload))

    def op_leaks(self, payload: dict[str, Any]) -> dict[str, Any]:
        """What Retire and vLLM still hold (tests: nothing may be left once scopes are done)."""
        core = self.side.core.state
        return {
            "ok": True,
            "free_blocks": int(self.side.pool.get_num_free_blocks()),
            "initial_free_blocks": self.side.initial_free_blocks,
            "ledger_blocks": sorted(self.side.ledger.refs),
            "ledger_pins": self.side.ledger.pinned(),
            "ledger_cached": sorted(self.side.ledger.cached),
            "core_pages": sorted(core.pages),
            "core_pinned": list(self.side.core.pinned_pages()),
            "managed_requests": sorted(self.side.reqs),
            "scheduler_requests": sorted(self.side.scheduler.requests),
            "admissions": [f"{s}@{v}" for s, v in self.side.admissions],
            "openings": [f"{s}@{v}" for s, v in self.side.opening],
            "pipelined": [f"{s}@{v}" for s, v in self.side.pipelined.values()],
            "held_requests": [f"{s}@{v}" for s, v in self.side.held],
            # opens taken by the ``open`` thread whose utility call has not come, and the
            # reverse (``early_opens``)
            "early_openings": sorted(
                {*self.side.copies.openings()}
                | {f"{o.scope}@{o.version}" for o in self.side.early_tails}
            ),
            "live_scopes": sorted(
                s for s, r in core.scopes.items() if r.state is not ScopeState.CANCELLED
            ),
            "live_scope_tenants": {
                s: r.tenant for s, r in core.scopes.items() if r.state is not ScopeState.CANCELLED
            },
            "counters": dict(self.side.counters),
            "scope_records": len(self.side.core.state.scopes),
            "sizes": self.side.sizes(),
            "bounds": self.side.bounds(),
        }

    def op_release_all(self, payload: dict[str, Any]) -> dict[str, Any]:
        """Cancel every live scope (tests and shutdown)."""
        for scope, record in list(self.side.core.state.scopes.items()):
            if record.state is not ScopeState.CANCELLED:
                self._cancel(scope)
        return {"ok": True}

    def _own_scope(self, payload: dict[str, Any]) -> str:
        scope = check_name(payload.get("scope"), "scope")
        tenant = check_name(payload.get("tenant"), "tenant")
        record = self.side.core.state.scopes.get(scope)
        if record is None:
            raise UnknownScopeError(f"scope {scope!r} was never submitted")
        if record.tenant != tenant:
            raise TenantMismatchError(f"scope {scope!r} belongs to another tenant")
        return scope

    def _status(self, scope: str) -> dict[str, Any]:
        record = self.side.core.scope(scope)
        info = self.side.scopes[scope]
        version = record.epoch
        outstanding = sum(1 for p in record.participants.values() if not p.closed)
        return {
            "ok": True,
            "scope": scope,
            "tenant": record.tenant,
            "version": version,
            "incarnation": info.incarnation,
            "state": record.state.value,
            "admitted": record.admitted,
            "adopted_blocks": info.adopted_blocks.get(version, 0),
            "receipts_outstanding": outstanding,
            "pages": sorted(p for p, r in self.side.core.state.pages.items() if r.owner == scope),
            # given back to vLLM's prefix cache (a finished version's): evictable
            "cached_pages": sorted(
                p
                for p, r in self.side.core.state.pages.items()
                if r.owner == scope and not r.held and not r.pinned
            ),
        }

    def _contract(self, payload: dict[str, Any]) -> Contract:
        if not payload.get("greedy", False):
            raise ContractError(
                "a scope's versions must decode greedily (temperature 0): inherited state is "
                "checked against exact equivalence with a clean run"
            )
        mode = payload.get("numerical_mode") or ENGINE_NUMERICAL_MODE
        return engine_contract(
            attrs.evolve(DEFAULT_CONTRACT, numerical_mode=mode), self.side.kv_windows
        )

    def _fenced_versions(self, commands: Sequence[Command]) -> list[int]:
        return sorted({c.version for c in commands if isinstance(c, Fence)})

    def _settle_admissions(self, scope: str) -> None:
        """An admitted version whose request has not reached the engine core yet, revised or
        cancelled since: its admission and handoff pins go before the revision's commands run
        (they may free or give back the blocks it adopted, which the core no longer counts as
        pinned once adopted)."""
        for key in [k for k in self.side.admissions if k[0] == scope]:
            if self.side.core.revocation(*key) is not None:
                self.side.forget_admission(*key, "revoked")

    def _settle_openings(self, scope: str) -> None:
        """An ``open`` still waiting for its Admit whose version was revised or cancelled before
        admission is answered now: its stream ends with the fence's reason, having run nothing."""
        if scope not in self.side.core.state.scopes:
            return
        incarnation = self.side.scopes[scope].incarnation
        for key in [k for k in self.side.held if k[0] == scope]:
            revoked = self.side.core.revocation(*key)
            if revoked is not None:
                self.side.end_held(*key, wire.finish_reason(revoked))
        for key in [k for k in self.side.opening if k[0] == scope]:
            revoked = self.side.core.revocation(*key)
            if revoked is not None:
                self.side.opening.pop(key).set_result(
                    {
                        "ok": True,
                        "scope": scope,
                        "version": key[1],
                        "fence": wire.finish_reason(revoked),
                        "incarnation": incarnation,
                    }
                )
