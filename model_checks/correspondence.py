"""How the spec's moves and the core's words correspond, in both directions.

A spec action of an engine or user becomes the core event the engine would report
(``core_event``); a transition the core logs becomes the spec action it stands for
(``spec_instance``, ``None`` for a stutter). Two checks compare what the core said with what
happened: ``misreported`` (a write or a verification logged as something other than what the
engine reported) and ``command_mismatch`` (each kind of command names exactly the frames or
pages its transitions name). Pure functions of their arguments; the lock-step harness
(``lockstep``) memoizes and sequences them, and nothing here keeps state.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import retire_core as rc
from retire_checks.abstraction import Universe, spec_context
from retire_spec.actions import ACTION_BY_NAME, ActionInstance
from retire_spec.codegen import compiler
from retire_spec.schema import BEYOND, NO_MATCH, Bounds, SpecState

KIND_OF = {0: rc.FrameKind.TOKEN, 1: rc.FrameKind.COMMIT, 2: rc.FrameKind.INSTALL}
_SCOPE_CALLS = {"pause": rc.Pause, "unpause": rc.Unpause, "cancel": rc.Cancel, "forget": rc.Forget}


def core_event(
    inst: ActionInstance, uni: Universe, spec: SpecState, launched: Mapping[int, tuple[int, int]]
) -> Any:
    """The core event for the engine or user doing ``inst`` in ``spec``; ``launched`` maps each
    participant slot the harness saw launch to its ``(scope slot, version)``."""
    u, a = uni, inst.args
    n = inst.name
    if n == "open":
        s, ctx, reuse = a
        return rc.Submit(
            u.scopes[s], u.tenants[s], u.fingerprint(s), core_context(ctx), u.contract(reuse)
        )
    if n == "supersede":
        s, ctx, reuse = a
        return rc.Supersede(u.scopes[s], core_context(ctx), u.contract(reuse))
    if n in _SCOPE_CALLS:
        return _SCOPE_CALLS[n](u.scopes[a[0]])
    if n == "launch":
        q, s, v = a
        return rc.ParticipantStarted(u.scopes[s], v, u.parts[q])
    if n == "finish":
        s, v = a
        return rc.VersionFinished(u.scopes[s], v)
    if n == "preempt":
        s, v = a
        return rc.VersionPreempted(u.scopes[s], v)
    if n == "receipt" or n == "receipt_again":
        (q,) = a
        s, v = launched[q]
        return rc.Receipt(u.scopes[s], v, u.parts[q])
    if n == "deliver":
        (f,) = a
        s, v, k = spec["frame_scope"][f], spec["frame_ver"][f], spec["frame_kind"][f]
        return rc.FrameArrived(u.scopes[s], v, f, KIND_OF[k])
    if n == "allocate":
        p, q, i = a
        s, v = launched[q]
        return rc.PageAllocated(u.scopes[s], v, u.parts[q], p, i, u.group(p))
    if n == "attempt_write" or n == "attempt_draft":
        p, q, done = a
        s, v = launched[q]
        return rc.WriteAttempted(u.scopes[s], v, u.parts[q], p, done, draft=n == "attempt_draft")
    if n == "verify_drafts":
        p, done = a
        return rc.DraftsVerified(p, done)
    if n == "close_writer":
        p, t = a
        digest = str(closing_data(spec, inst, u.bounds))
        return rc.WriterClosed(p, digest, prefix=None if t == NO_MATCH else t)
    if n == "reuse_id":
        (p,) = a
        return rc.PageReused(p)
    if n == "evict":
        (p,) = a
        return rc.PageEvicted(p)
    if n == "unreference":
        (p,) = a
        return rc.PageUnreferenced(p)
    raise ValueError(f"no core event for {inst}")


def core_context(ctx: Sequence[int]) -> tuple[int, ...]:
    """The core's context for a spec context: its identities before ``BEYOND``."""
    return tuple(ctx[: ctx.index(BEYOND)]) if BEYOND in ctx else tuple(ctx)


def closing_data(spec: SpecState, inst: ActionInstance, bounds: Bounds) -> int:
    """The bytes (hence the digest the engine reports) page ``p`` holds once its writer closed
    as ``inst`` says: a kept name makes the honest output bytes those of the named identity
    (the spec's effect decides; without a name the bytes do not change)."""
    p, t = inst.args
    if t == NO_MATCH:
        return int(spec["page_data"][p])
    after = compiler(bounds).step(ACTION_BY_NAME["close_writer"], inst.args)(spec)
    return int((after or spec)["page_data"][p])


def spec_instance(t: rc.Transition, uni: Universe, event: Any) -> ActionInstance | None:
    """The spec action the core's transition ``t`` stands for (``None`` for a stutter).
    ``event``: the core event being processed (``open``/``supersede`` carry its context and
    reuse flag). Raises ``ValueError`` for a transition the spec does not know."""
    u = uni
    s = u.scope_slot(t.scope) if t.scope is not None else None
    n = t.action
    if n in rc.transitions.STUTTERS:
        return None
    if n in ("open", "supersede"):
        context = spec_context(event.context, u.bounds.positions)
        return ActionInstance(n, (s, context, event.contract.allows_reuse))
    if n in ("pause", "unpause", "cancel", "resume", "finish", "preempt", "forget"):
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
    if n in ("write", "write_draft", "fence_write"):
        return ActionInstance(
            n, (t.arg("page"), u.part_slot(t.arg("participant")), t.arg("completes"))
        )
    if n == "verify_drafts":
        return ActionInstance(n, (t.arg("page"), t.arg("completes")))
    if n == "close_writer":  # ``named`` is logged only when the engine named the block
        named = int(t.arg("named")) if len(t.args) > 3 else NO_MATCH
        return ActionInstance(n, (t.arg("page"), named))
    if n in ("unhold", "free", "reuse_id", "evict", "unreference"):
        return ActionInstance(n, (t.arg("page"),))
    if n in ("certify", "adopt", "release"):
        return ActionInstance(n, (s, t.arg("page")))
    raise ValueError(f"the core reported a transition the spec does not know: {n}")


_WRITES = ("write", "write_draft", "fence_write")
_VERIFICATIONS = ("verify_drafts", "stale_verify")


def misreported(event: Any, transitions: Sequence[rc.Transition]) -> str:
    """What the core's transitions say the engine did, where that is not what the event
    reported (the spec steps take the world's part of a write, its bytes, from the
    transitions, so a core that logs a draft write as a verified one, or a rejected
    verification as an accepted one, would otherwise pass unseen); "" when they agree. A write
    attempt is one ``write`` (``write_draft`` for drafts) or ``fence_write`` of its page,
    participant and completion; a verification one ``verify_drafts`` or ``stale_verify`` of
    its page and verdict."""
    t = type(event)
    if t is rc.WriteAttempted:
        kinds = ("write_draft" if event.draft else "write", "fence_write")
        found = [x for x in transitions if x.action in _WRITES]
        want = (event.page, event.participant, event.completes)
        if len(found) != 1 or found[0].action not in kinds:
            return f"the write attempt {event} was logged as {[x.action for x in found]}"
        x = found[0]
        if (x.arg("page"), x.arg("participant"), x.arg("completes")) != want:
            return f"the write attempt {event} was logged as {x.action} with {x.args}"
    elif t is rc.DraftsVerified:
        found = [x for x in transitions if x.action in _VERIFICATIONS]
        if len(found) != 1 or (found[0].arg("page"), found[0].arg("completes")) != (
            event.page,
            event.completes,
        ):
            return f"the verification {event} was logged as {[(x.action, x.args) for x in found]}"
    return ""


# Command class, the field naming its frame(s) or page(s), and the transition that must match.
_COMMAND_CHECKS: tuple[tuple[str, type, str], ...] = (
    ("Publish", rc.Publish, "frame"),
    ("Drop", rc.Drop, "frame"),
    ("AllowWrite", rc.AllowWrite, "page"),
    ("FenceWrite", rc.FenceWrite, "page"),
    ("Free", rc.Free, "pages"),
    ("Adopt", rc.Adopt, "pages"),
    ("PinCertified", rc.PinCertified, "certificate"),
)
_TRANSITION_CHECKS: dict[str, tuple[str, str]] = {
    "publish": ("Publish", "frame"),
    "drop": ("Drop", "frame"),
    "write": ("AllowWrite", "page"),
    "write_draft": ("AllowWrite", "page"),
    "fence_write": ("FenceWrite", "page"),
    "free": ("Free", "page"),
    "adopt": ("Adopt", "page"),
    "certify": ("PinCertified", "page"),
}
# The check of each command class, by exact class (a command of any other class, or of a class
# derived from another checked one, is matched by isinstance against every check).
_COMMAND_BY_TYPE: dict[type, tuple[str, type, str]] = {
    cls: (n, cls, a)
    for n, cls, a in _COMMAND_CHECKS
    if not any(other is not cls and issubclass(cls, other) for _, other, _ in _COMMAND_CHECKS)
}


def command_mismatch(commands: Sequence[rc.Command], transitions: Sequence[rc.Transition]) -> str:
    """Where a kind of command does not name exactly the frames or pages its transitions name
    ("" when every kind agrees)."""
    if not commands and not any(t.action in _TRANSITION_CHECKS for t in transitions):
        return ""
    commanded: dict[str, list[Any]] = {}
    for c in commands:
        found = _COMMAND_BY_TYPE.get(type(c))
        matches = (found,) if found is not None else _COMMAND_CHECKS
        for name, cls, attr in matches:
            if isinstance(c, cls):
                value = getattr(c, attr)
                got = commanded.setdefault(name, [])
                if attr == "frame" or attr == "page":
                    got.append(value)
                else:
                    got.extend(value.pages if attr == "certificate" else value)
    transitioned: dict[str, list[Any]] = {}
    for t in transitions:
        found_t = _TRANSITION_CHECKS.get(t.action)
        if found_t is not None:
            transitioned.setdefault(found_t[0], []).append(t.arg(found_t[1]))
    for name, _, _ in _COMMAND_CHECKS:
        got, want = commanded.get(name, []), transitioned.get(name, [])
        if (got or want) and sorted(got) != sorted(want):
            return f"{name} commands {sorted(got)} disagree with transitions {sorted(want)}"
    return ""
