"""The lock-step harness: the real core and the spec, driven side by side by one environment.

``Lockstep`` holds a core state, the spec state it should stand for, and the universe. The
environment (Hypothesis rules, the explorer, a test) calls ``env(...)`` with a spec action of an
engine or user: world-only actions (a frame emitted into a queue, a page's bytes corrupted) change
the spec alone; every other action is turned into the core event the engine would report, the core
steps, and each transition it reports is replayed as a spec action whose guard must hold.
Afterwards the core's abstraction must equal the spec's control columns, the commands must agree
with the transitions, and every invariant must hold. Any disagreement raises ``RefinementError``
with the step that caused it. The engine's answers to commands (the byte check after
``PinCertified``) are produced by ``report``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

import retire_core as rc
from retire_checks.abstraction import Universe, abstract_control, control_view
from retire_spec.actions import ACTION_BY_NAME, Action, ActionInstance
from retire_spec.expr import Concrete
from retire_spec.invariants import INVARIANTS, Invariant
from retire_spec.schema import FRAME_KINDS, IN_FLIGHT, SpecState, canonical, initial_state

KIND_OF = {0: rc.FrameKind.TOKEN, 1: rc.FrameKind.COMMIT, 2: rc.FrameKind.INSTALL}
KIND_NUM = {v: k for k, v in KIND_OF.items()}
WORLD_ONLY = frozenset({"emit", "corrupt"})


class RefinementError(AssertionError):
    """The core did something the spec does not allow, or its state drifted from the spec's."""


@attrs.frozen(slots=True)
class Outcome:
    commands: tuple[rc.Command, ...]
    transitions: tuple[rc.Transition, ...]
    spec_steps: tuple[ActionInstance, ...]


def _contract(reuse: bool) -> rc.Contract:
    return rc.DEFAULT_CONTRACT if reuse else rc.COLD_CONTRACT


class Lockstep:
    """One run. ``step_fn`` is the core's step function (a mutant can be swapped in)."""

    def __init__(
        self,
        uni: Universe,
        step_fn: Callable[[rc.CoreState, Any], rc.Step] = rc.step,
        invariants: tuple[Invariant, ...] = INVARIANTS,
        actions: dict[str, Action] | None = None,
    ) -> None:
        self.uni = uni
        self.step_fn = step_fn
        self.invariants = invariants
        self.actions = actions or ACTION_BY_NAME
        self.I = Concrete(uni.bounds.sizes())
        self.core = rc.CoreState()
        self.spec = initial_state(uni.bounds)
        self.launched: dict[int, tuple[int, int]] = {}
        self.pending_reports: dict[int, int] = {}  # scope slot -> version awaiting a byte check
        self.trace: list[str] = []
        self._current_event: Any = None

    # --- snapshots ------------------------------------------------------------------------
    def snapshot(self) -> tuple[Any, ...]:
        return (self.core, self.spec, dict(self.launched), dict(self.pending_reports))

    def restore(self, snap: tuple[Any, ...]) -> None:
        self.core, self.spec, launched, pending = snap
        self.launched, self.pending_reports = dict(launched), dict(pending)

    def key(self) -> tuple[Any, ...]:
        """Canonical identity of the joint state (the spec side in normal form)."""
        return (
            self.core,
            canonical(self.spec, self.uni.bounds),
            tuple(sorted(self.launched.items())),
            tuple(sorted(self.pending_reports.items())),
        )

    # --- guards -------------------------------------------------------------------------
    def spec_enabled(self, inst: ActionInstance) -> bool:
        action = self.actions[inst.name]
        return bool(action.guard(self.I, self.spec, *inst.args))

    def _spec_apply(self, inst: ActionInstance) -> None:
        action = self.actions[inst.name]
        if not action.guard(self.I, self.spec, *inst.args):
            raise RefinementError(f"the spec does not allow {inst} here (after {self._last()})")
        self.spec = self.spec.replace(action.effect(self.I, self.spec, *inst.args))

    def _last(self) -> str:
        return self.trace[-1] if self.trace else "the initial state"

    # --- the environment's moves -----------------------------------------------------------
    def env(self, inst: ActionInstance) -> Outcome | None:
        """Perform an engine/user action. Returns ``None`` if it raised a typed core error
        (bad input: then neither side changes), else the outcome of the core step."""
        self.trace.append(str(inst))
        if inst.name in WORLD_ONLY:
            self._spec_apply(inst)
            self._check()
            return Outcome((), (), (inst,))
        event = self._event_for(inst)
        legal = self._legal(inst)
        before = self.core
        out = self.feed(event, inst)
        rejected = self.core is before and not out.transitions and not out.commands
        if rejected and legal:
            raise RefinementError(f"the core refused {inst}, which the spec allows")
        return out

    def _legal(self, inst: ActionInstance) -> bool:
        """Whether the spec lets the engine/user do this (the core must then accept it)."""
        if inst.name == "deliver":
            return bool(self.spec["frame_state"][inst.args[0]] == IN_FLIGHT)
        if inst.name == "attempt_write":
            q = inst.args[1]
            return bool(self.spec["part_used"][q] and not self.spec["part_closed"][q])
        return self.spec_enabled(inst)

    def report(self, s: int) -> Outcome:
        """The engine answers a ``PinCertified`` with the current digests of the pinned pages."""
        version = self.pending_reports.pop(s)
        sid = self.uni.scopes[s]
        rec = self.core.scopes[sid]
        pages = (
            rec.certificate.pages if rec.certificate and rec.certificate.version == version else ()
        )
        data = self.spec["page_data"]
        digests = tuple(rc.PageDigest(p, str(data[p])) for p in pages)
        self.trace.append(f"report({s}, v{version})")
        return self.feed(rc.AdoptionReport(sid, version, digests), None)

    def _event_for(self, inst: ActionInstance) -> Any:
        u, a = self.uni, inst.args
        n = inst.name
        if n == "open":
            s, ctx, reuse = a
            return rc.Submit(
                u.scopes[s], u.tenants[s], u.fingerprint(s), tuple(ctx), _contract(reuse)
            )
        if n == "supersede":
            s, ctx, reuse = a
            return rc.Supersede(u.scopes[s], tuple(ctx), _contract(reuse))
        if n in ("pause", "unpause", "cancel"):
            cls = {"pause": rc.Pause, "unpause": rc.Unpause, "cancel": rc.Cancel}[n]
            return cls(u.scopes[a[0]])
        if n == "launch":
            q, s, v = a
            return rc.ParticipantStarted(u.scopes[s], v, u.parts[q])
        if n == "receipt":
            (q,) = a
            s, v = self.launched[q]
            return rc.Receipt(u.scopes[s], v, u.parts[q])
        if n == "deliver":
            (f,) = a
            s, v, k = (
                self.spec["frame_scope"][f],
                self.spec["frame_ver"][f],
                self.spec["frame_kind"][f],
            )
            return rc.FrameArrived(u.scopes[s], v, f, KIND_OF[k])
        if n == "allocate":
            p, q, i = a
            s, v = self.launched[q]
            return rc.PageAllocated(u.scopes[s], v, u.parts[q], p, i)
        if n == "attempt_write":
            p, q, done = a
            s, v = self.launched[q]
            return rc.WriteAttempted(u.scopes[s], v, u.parts[q], p, done)
        if n == "close_writer":
            (p,) = a
            return rc.WriterClosed(p, str(self.spec["page_data"][p]))
        if n == "reuse_id":
            (p,) = a
            return rc.PageReused(p)
        raise ValueError(f"no core event for {inst}")

    # --- one core step ------------------------------------------------------------------------
    def feed(self, event: Any, inst: ActionInstance | None) -> Outcome:
        self._current_event = event
        try:
            result = self.step_fn(self.core, event)
        except rc.RetireError:
            self.trace.append(f"  -> rejected {type(event).__name__}")
            return Outcome((), (), ())
        steps = []
        for t in result.transitions:
            si = self._spec_instance(t)
            if si is None:
                continue
            self._spec_apply(si)
            steps.append(si)
            if si.name == "launch":
                self.launched[si.args[0]] = (si.args[1], si.args[2])
        self._check_commands(result)
        self.core = result.state
        for c in result.commands:
            if isinstance(c, rc.PinCertified):
                self.pending_reports[self.uni.scope_slot(c.certificate.scope)] = (
                    c.certificate.version
                )
        self._check()
        self.trace.append("  -> " + (", ".join(str(s) for s in steps) or "(no spec step)"))
        return Outcome(result.commands, result.transitions, tuple(steps))

    def _spec_instance(self, t: rc.Transition) -> ActionInstance | None:
        u = self.uni
        s = u.scope_slot(t.scope) if t.scope is not None else None
        n = t.action
        if n in rc.transitions.STUTTERS:
            return None
        if n in ("open", "supersede"):
            rec = self.core_after_scope(t.scope)
            return ActionInstance(n, (s, tuple(int(k) for k in rec[0]), rec[1]))  # type: ignore[arg-type]
        if n in ("pause", "unpause", "cancel", "resume"):
            return ActionInstance(n, (s,))
        if n == "launch":
            return ActionInstance(n, (u.part_slot(t.arg("participant")), s, t.version))
        if n == "receipt":
            return ActionInstance(n, (u.part_slot(t.arg("participant")),))
        if n in ("publish", "drop"):
            return ActionInstance(n, (t.arg("frame"),))
        if n == "allocate":
            return ActionInstance(
                n, (t.arg("page"), u.part_slot(t.arg("participant")), t.arg("position"))
            )
        if n in ("write", "fence_write"):
            return ActionInstance(
                n, (t.arg("page"), u.part_slot(t.arg("participant")), t.arg("completes"))
            )
        if n in ("close_writer", "unhold", "free", "reuse_id"):
            return ActionInstance(n, (t.arg("page"),))
        if n in ("certify", "adopt", "release"):
            return ActionInstance(n, (s, t.arg("page")))
        raise RefinementError(f"the core reported a transition the spec does not know: {n}")

    def core_after_scope(self, scope: str | None) -> tuple[tuple[Any, ...], bool]:
        # ``open``/``supersede`` carry the context and reuse flag of the event being processed.
        ev = self._current_event
        return tuple(ev.context), ev.contract.allows_reuse

    def _check_commands(self, result: rc.Step) -> None:
        def pages_of(cls: type, attr: str = "pages") -> list[int]:
            out: list[int] = []
            for c in result.commands:
                if isinstance(c, cls):
                    out.extend(getattr(c, attr) if attr != "certificate" else c.certificate.pages)  # type: ignore[attr-defined]
            return sorted(out)

        def acted(name: str, arg: str) -> list[Any]:
            return sorted(t.arg(arg) for t in result.transitions if t.action == name)

        checks = [
            (
                "Publish",
                sorted(c.frame for c in result.commands if isinstance(c, rc.Publish)),
                acted("publish", "frame"),
            ),
            (
                "Drop",
                sorted(c.frame for c in result.commands if isinstance(c, rc.Drop)),
                acted("drop", "frame"),
            ),
            (
                "AllowWrite",
                sorted(c.page for c in result.commands if isinstance(c, rc.AllowWrite)),
                acted("write", "page"),
            ),
            (
                "FenceWrite",
                sorted(c.page for c in result.commands if isinstance(c, rc.FenceWrite)),
                acted("fence_write", "page"),
            ),
            ("Free", pages_of(rc.Free), acted("free", "page")),
            ("Adopt", pages_of(rc.Adopt), acted("adopt", "page")),
            ("PinCertified", pages_of(rc.PinCertified, "certificate"), acted("certify", "page")),
        ]
        for name, commanded, transitioned in checks:
            if commanded != transitioned:
                raise RefinementError(
                    f"{name} commands {commanded} disagree with transitions {transitioned} "
                    f"(after {self._last()})"
                )

    def _check(self) -> None:
        bounds = self.uni.bounds
        abstract = abstract_control(self.core, self.uni, self.launched)
        expected = control_view(self.spec, bounds)
        if abstract != expected:
            diff = [k for k in expected if abstract[k] != expected[k]]
            detail = {k: (abstract[k], expected[k]) for k in diff}
            raise RefinementError(f"core and spec disagree on {detail} (after {self._last()})")
        broken = [inv.name for inv in self.invariants if not inv.holds(self.I, self.spec)]
        if broken:
            raise RefinementError(f"invariant(s) {broken} violated (after {self._last()})")

    # --- convenience for drivers ------------------------------------------------------------
    def in_flight(self) -> list[int]:
        return [f for f, st in enumerate(self.spec["frame_state"]) if st == IN_FLIGHT]


__all__ = ["FRAME_KINDS", "KIND_NUM", "Lockstep", "Outcome", "RefinementError", "SpecState"]
