"""Reachability probes: how often each stage, core transition, environment move, late-event
classification, protocol path and command class was taken in a search. A profile whose run misses
a required probe (``ALL_PROBES``) is vacuous and fails. ``ProbeTally`` counts the hits of a search
cheaply (per shared outcome of the step memo); ``probe_hits`` is the plain definition it must agree
with. What does not live here: the search that calls them (``shard``).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import retire_core as rc
from retire_checks.engine import COMMANDS_CHECKED
from retire_checks.lockstep import Outcome
from retire_spec.actions import ACTIONS, ActionInstance
from retire_spec.schema import ACTIVE, FINISHED, NO_MATCH, PAUSED, Bounds, SpecState

STAGES = tuple(f"stage:{s.value}" for s in rc.Stage)
# (``forget`` is left to the Hypothesis machine: see ``environment.Budget.forget``)
CORE_TRANSITIONS = (
    *(f"transition:{a.name}" for a in ACTIONS if a.name not in ("emit", "corrupt", "forget")),
    "transition:fence",
    "transition:late_report",
    "transition:late_finish",
    "transition:late_preempt",
    "transition:late_unreference",
    "transition:stale_verify",
)
ENV_MOVES = tuple(
    f"move:{m}"
    for m in (
        "open",
        "supersede",
        "pause",
        "unpause",
        "cancel",
        "finish",
        "preempt",
        "unreference",
        "launch",
        "receipt",
        "receipt_again",
        "emit",
        "deliver",
        "allocate",
        "attempt_write",
        "attempt_draft",
        "verify_drafts",
        "close_writer",
        "evict",
        "corrupt",
        "reuse_id",
        "report",
    )
)
_D, _F, _R = rc.DropReason, rc.FenceReason, rc.ReleaseReason
REASONS = (
    f"drop:{_D.SCOPE_CANCELLED}",
    f"drop:{_D.RETIRED_DRAINING}",
    f"drop:{_D.RETIRED_DRAINED}",
    f"drop:{_D.RETIRED_EXPIRED}",
    f"fence:{_D.SCOPE_CANCELLED}",
    f"fence:{_D.RETIRED_DRAINING}",
    *(f"fence_write:{reason}" for reason in _F),
    f"release:{_R.DIGEST_MISMATCH}",
    f"release:{_R.GENERATION_CHANGED}",
    # (``late_report:retired_draining`` is not among them: a byte check's version was never
    # admitted, so once the engine launches only admitted versions it has no participant, and
    # no page either, since adoption comes after the report: the classification is unreachable)
    f"late_report:{_D.RETIRED_EXPIRED}",
    f"late_report:{_D.SCOPE_CANCELLED}",
    f"drop:{_D.VERSION_FINISHED}",
    f"fence:{_D.VERSION_FINISHED}",
    f"late_finish:{_D.VERSION_FINISHED}",
    f"late_finish:{_D.RETIRED_DRAINING}",
    f"late_preempt:{_D.VERSION_FINISHED}",
    f"late_preempt:{_D.RETIRED_DRAINING}",
)
PATHS = (
    "path:cold_resume",  # a successor admitted cold (no reuse, or nothing certifiable)
    "path:warm_resume",  # a successor admitted after a byte check of certified pages
    "path:partial_adoption",  # part of a certificate adopted, the rest released (recompute)
    "path:chain_collapse",  # a revision while the previous successor's certificate is pending
    "path:cancel_releases_pins",  # a cancel while a certificate is pending
    "path:publish_while_paused",  # pause keeps authority
    "path:cross_tenant_write_fenced",  # a write into another tenant's page is fenced
    "path:drop_two_versions_back",  # a frame arrives after two revisions
    # a revision (ALIGN) while another scope of the same fingerprint holds a completed,
    # writer-closed page with the revised context's prefix: only the owner check refuses it
    "path:same_model_page_not_inherited",
    "path:quiescent",  # a state with nothing left to complete (checked against QUIESCENCE)
    "path:finish_frees_pages",  # a version's end frees what no revision could inherit
    "path:finish_caches_pages",  # ... and gives its completed pages back to the engine's cache
    "path:preempt_frees_pages",  # a preempted version's pages go back; it keeps authority
    # a page the engine stopped referencing (a sliding window passed it) while its version
    # runs goes back to the engine's cache; a revision then certifies it
    "path:unreference_caches_page",
    "path:unreferenced_page_certified",
    "path:revise_after_finish",  # a finished scope revised: the next version starts
    "path:drafts_rejected",  # a verification rejects drafts: the page is incomplete again
    "path:drafts_rolled_back",  # a writer closes over unverified drafts: they are rolled back
    "path:adopt_second_group",  # a successor adopts a page of a second KV cache group
    "path:output_named",  # a writer's close names a block of the version's own output
    "path:output_name_dropped",  # ... too late (revised) or for an incomplete block: no name
)
# every command class the core can emit, met by the engine's checks (``engine.obey``)
COMMANDS = tuple(f"command:{name}" for name in COMMANDS_CHECKED)
ALL_PROBES = STAGES + CORE_TRANSITIONS + ENV_MOVES + REASONS + PATHS + COMMANDS


def probe_hits(move: ActionInstance, out: Outcome, before: SpecState, bounds: Bounds) -> list[str]:
    """The probes one explored transition hits (``before``: the spec state it started in)."""
    return static_hits(move, out) + dynamic_hits(out, before, bounds)


def static_hits(move: ActionInstance, out: Outcome) -> list[str]:
    """The probes of a transition that depend on the move's name and the outcome alone."""
    hits = [f"move:{move.name}"]
    actions = set()
    for t in out.transitions:
        a = t.action
        actions.add(a)
        # a transition's hits depend on these four values alone (memoized on them)
        sig = (a, t.stage, t.reason, (bool(t.version), t.arg("cold")) if a == "resume" else None)
        found = _TRANSITION_HITS.get(sig)
        if found is None:
            found = _TRANSITION_HITS[sig] = _transition_hits(t)
        hits.extend(found)
        if a == "verify_drafts" and not t.arg("completes"):
            hits.append("path:drafts_rejected")
        elif a == "close_writer" and len(t.changed) > 1:  # ``full`` and ``draft`` changed too
            hits.append("path:drafts_rolled_back")
        elif a == "adopt" and any(key == "group" for key, _ in t.args):
            hits.append("path:adopt_second_group")
    if "adopt" in actions and "release" in actions:
        hits.append("path:partial_adoption")
    if "preempt" in actions and "free" in actions:
        hits.append("path:preempt_frees_pages")
    if "unreference" in actions and any(isinstance(c, rc.ReleaseToCache) for c in out.commands):
        hits.append("path:unreference_caches_page")
    if "finish" in actions and "free" in actions:
        hits.append("path:finish_frees_pages")
    if "finish" in actions and any(isinstance(c, rc.ReleaseToCache) for c in out.commands):
        hits.append("path:finish_caches_pages")
    for c in out.commands:
        hits.append(f"command:{type(c).__name__}")
        if isinstance(c, rc.Unpin):
            if c.reason == rc.UnpinReason.SUPERSEDED_BEFORE_ADOPTION:
                hits.append("path:chain_collapse")
            elif c.reason == rc.UnpinReason.CANCELLED:
                hits.append("path:cancel_releases_pins")
    return hits


def _transition_hits(t: rc.Transition) -> tuple[str, ...]:
    hits = [f"stage:{t.stage.value}", f"transition:{t.action}"]
    if t.reason is not None:
        hits.append(f"{t.action}:{t.reason}")
    if t.action == "resume" and t.version:
        hits.append("path:cold_resume" if t.arg("cold") else "path:warm_resume")
    return tuple(hits)


_TRANSITION_HITS: dict[tuple[Any, ...], tuple[str, ...]] = {}


def dynamic_hits(out: Outcome, before: SpecState, bounds: Bounds) -> list[str]:
    """The probes of a transition that read the spec state it started in (publish while
    paused, a drop two versions back, a write fenced across tenants, a name kept or dropped)."""
    hits = []
    for t in out.transitions:
        a = t.action
        if a == "publish" and before["scope_mode"][_slot(t.scope)] == PAUSED:
            hits.append("path:publish_while_paused")
        elif a == "drop" and t.version is not None:
            if before["scope_epoch"][_slot(t.scope)] - t.version >= 2:
                hits.append("path:drop_two_versions_back")
        elif a == "fence_write" and t.reason == rc.FenceReason.PAGE_OF_ANOTHER_SCOPE:
            s = _slot(t.scope)
            if before["page_fp"][t.arg("page")] != bounds.fingerprints[s]:
                hits.append("path:cross_tenant_write_fenced")
        elif a == "close_writer" and _names(t):
            if before["page_tok"][t.arg("page")] == NO_MATCH:
                kept = t.arg("inheritable")
                hits.append("path:output_named" if kept else "path:output_name_dropped")
        elif a == "certify":
            # certified in the revision's own step: unheld while its version was current and
            # its scope live, so the engine had stopped referencing it (a finished version's
            # cached pages belong to a finished scope)
            p, s = t.arg("page"), _slot(t.scope)
            if (
                not before["page_held"][p]
                and before["page_over"][p] == before["scope_epoch"][s]
                and before["scope_mode"][s] in (ACTIVE, PAUSED)
            ):
                hits.append("path:unreferenced_page_certified")
        elif a == "supersede":
            if before["scope_mode"][_slot(t.scope)] == FINISHED:
                hits.append("path:revise_after_finish")
            if twin_page(t, before, bounds):
                hits.append("path:same_model_page_not_inherited")
    return hits


def twin_page(t: rc.Transition, before: SpecState, bounds: Bounds) -> bool:
    """Whether another scope of the revised scope's fingerprint has an allocated, completed,
    writer-closed page whose prefix is the revised context's block at its position."""
    s = _slot(t.scope)
    context = t.arg("context") or ()
    fp = bounds.fingerprints[s]
    for p in range(bounds.pages):
        pos = before["page_pos"][p]
        if (
            before["page_alloc"][p]
            and before["page_owner"][p] != s
            and before["page_fp"][p] == fp
            and before["page_full"][p]
            and not before["page_writer"][p]
            and 0 <= pos < len(context)
            and before["page_tok"][p] == context[pos]
        ):
            return True
    return False


class ProbeTally:
    """Probe counts of a search. The step memo hands out shared ``Outcome`` objects, and most
    hits depend on the move's name and the outcome alone: those are computed once per shared
    outcome (for an outcome without transitions or commands, once per move name) and counted,
    then multiplied out by ``flush``; the hits that read the state before (publish, drop and
    cross-scope write fences) are computed every time by ``dynamic_hits``. An outcome's entry
    keeps the outcome, so its id is not reused while the entry exists."""

    def __init__(self, bounds: Bounds, limit: int = 200_000) -> None:
        self.bounds = bounds
        self.limit = limit
        self.counts: Counter[str] = Counter()
        # key -> [outcome, static hits, count, whether the outcome has dynamic hits]
        self._seen: dict[Any, list[Any]] = {}
        self._hits: dict[tuple[str, ...], tuple[str, ...]] = {}

    def key(self, move: ActionInstance, out: Outcome) -> Any:
        return id(out) if out.transitions or out.commands else move.name

    def entry(self, key: Any, move: ActionInstance, out: Outcome) -> list[Any]:
        if len(self._seen) >= self.limit:
            self.flush()
        dynamic = any(_reads_before(t) for t in out.transitions)
        hits = tuple(static_hits(move, out))
        hits = self._hits.setdefault(hits, hits)  # one tuple per distinct list of hits
        entry = self._seen[key] = [out, hits, 0, dynamic]
        return entry

    def add(self, move: ActionInstance, out: Outcome, before: SpecState) -> None:
        key = self.key(move, out)
        entry = self._seen.get(key)
        if entry is None:
            entry = self.entry(key, move, out)
        entry[2] += 1
        if entry[3]:
            self.counts.update(dynamic_hits(out, before, self.bounds))

    def flush(self) -> Counter[str]:
        for _, hits, n, _ in self._seen.values():
            for hit in hits:
                self.counts[hit] += n
        self._seen.clear()
        return self.counts


def _reads_before(t: rc.Transition) -> bool:
    return (
        t.action in ("publish", "drop", "supersede")
        or (t.action == "fence_write" and t.reason == rc.FenceReason.PAGE_OF_ANOTHER_SCOPE)
        or (t.action == "close_writer" and _names(t))
    )


def _names(t: rc.Transition) -> bool:
    """A writer's close that carries the engine's name for the block."""
    return len(t.args) > 3


def _slot(scope: str | None) -> int:
    return int((scope or "s0")[1:])


__all__ = [
    "ALL_PROBES",
    "COMMANDS",
    "CORE_TRANSITIONS",
    "ENV_MOVES",
    "PATHS",
    "REASONS",
    "STAGES",
    "ProbeTally",
    "dynamic_hits",
    "probe_hits",
    "static_hits",
    "twin_page",
]
