"""The explorer's profiles: ``QUICK`` and ``FULL`` (lists of configurations with the probes a run
must hit), ``ProfileResult`` (a profile's run: totals, probes, verdicts, the summary) and
``run_profile``, which explores a profile's configurations over the workers it is given: side
by side, one process each, or one after another, each split across all of them. What does not
live here: the search of one configuration (``parallel``,
``shard``) and the ``retire check`` command (``cli_checks``).
"""

from __future__ import annotations

import multiprocessing
import sys
import time
from collections import Counter
from typing import Any, TextIO

import attrs

import retire_core as rc
from retire_checks.config import Config, Profile, StepFn
from retire_checks.counterexample import Counterexample
from retire_checks.environment import Budget
from retire_checks.parallel import ExploreResult, Progress, can_fork, explore
from retire_checks.probes import ALL_PROBES
from retire_spec.actions import Action
from retire_spec.invariants import INVARIANTS, QUIESCENCE
from retire_spec.schema import BEYOND, Bounds

TOKEN_ONLY = (0,)
ALL_KINDS = (0, 1, 2)

_NO_CONTROL: dict[str, Any] = {
    "pause": False,
    "cancel": False,
    "finish": False,
    "preempt": False,
}

# Speculative decoding: draft writes, verification accepted, rejected, repeated and late,
# writers closing over unverified drafts, across chains of two revisions with handoffs and a
# fault (in both profiles).
_DRAFTS = Config(
    "drafts",
    Bounds(1, 2, 0, 1, 1, 2, ((1,), (2,)), (0,)),
    Budget(faults=1, frame_kinds=TOKEN_ONLY, reuse_choices=(True,), drafts=True, **_NO_CONTROL),
    ledger_size=1,
    expected_seconds=1.5,
)

# A version's own output inherited (an agent's next turn): the first context holds one block,
# the engine names the second block at its writer's close (2: what the revised context
# continues with; 3: another output), a revision certifies and adopts it, a late name is
# dropped, a fault; the engine stops referencing completed pages, named or not (in both
# profiles).
_OUTPUT = Config(
    "output",
    Bounds(1, 1, 0, 2, 2, 1, ((1, BEYOND), (1, 2)), (0,), names=(2, 3)),
    Budget(
        faults=1, frame_kinds=TOKEN_ONLY, reuse_choices=(True,), unreference=True, **_NO_CONTROL
    ),
    ledger_size=1,
    expected_seconds=0.6,
)

# Two KV cache groups, full attention and a one-block sliding window, one page each: a cut
# needs a page of every group (the engine checks that Admit's blocks are what Adopt handed over);
# the engine stops referencing completed pages while their version runs (the window passing).
_GROUPS = Config(
    "groups",
    Bounds(1, 2, 0, 2, 1, 1, ((1,),), (0,)),
    Budget(
        faults=1, frame_kinds=TOKEN_ONLY, reuse_choices=(True,), unreference=True, **_NO_CONTROL
    ),
    ledger_size=1,
    kv_windows=(0, 1),
    page_groups=(0, 1),
    expected_seconds=1.0,
)

QUICK = Profile(
    "quick",
    (
        # Revision chains e -> e+1 -> e+2 of one scope: late frames of every classification
        # (a one-entry ledger lets drained versions expire), chain collapse, byte-check faults.
        Config(
            "chain",
            Bounds(1, 2, 1, 1, 1, 2, ((1,), (2,)), (0,)),
            Budget(faults=1, frame_kinds=TOKEN_ONLY, duplicate_receipts=True, **_NO_CONTROL),
            ledger_size=1,
            expected_seconds=3.4,
        ),
        # Certified handoff of a two-block prefix: partial adoption after a fault, recompute.
        Config(
            "handoff",
            Bounds(1, 2, 0, 2, 2, 1, ((1, 2),), (0,)),
            Budget(faults=1, frame_kinds=TOKEN_ONLY, reuse_choices=(True,), **_NO_CONTROL),
            ledger_size=1,
            expected_seconds=2.3,
        ),
        # Pause and cancel against frames of every kind, cancel during a pending handoff.
        Config(
            "control",
            Bounds(1, 2, 1, 1, 1, 1, ((1,),), (0,)),
            Budget(faults=0, frame_kinds=ALL_KINDS),
            expected_seconds=2.9,
        ),
        # Two tenants side by side: cross-scope and cross-tenant write attempts.
        Config(
            "tenants",
            Bounds(2, 2, 0, 1, 1, 1, ((1,),), (0, 1)),
            Budget(faults=0, frame_kinds=TOKEN_ONLY, reuse_choices=(True,), **_NO_CONTROL),
            expected_seconds=0.4,
        ),
        # Two scopes of the same tenant and model (equal fingerprints) with the same context:
        # only ALIGN's page-owner check keeps one scope's pages from the other's successor.
        Config(
            "twins",
            Bounds(2, 2, 0, 1, 1, 1, ((1,),), (0, 0)),
            Budget(faults=0, frame_kinds=TOKEN_ONLY, reuse_choices=(True,), **_NO_CONTROL),
            expected_seconds=0.4,
        ),
        # (Draft moves in every configuration above would cost 79% more states and 125% more
        # time; this world alone adds 8% and 14%.)
        _DRAFTS,
        _GROUPS,
        _OUTPUT,
    ),
    ALL_PROBES,
)

FULL = Profile(
    "full",
    (
        # one scope, three participants, chains of two revisions
        Config(
            "chain",
            Bounds(1, 3, 1, 1, 1, 2, ((1,), (2,)), (0,)),
            Budget(faults=1, frame_kinds=TOKEN_ONLY, duplicate_receipts=True, **_NO_CONTROL),
            ledger_size=1,
            expected_seconds=24,
        ),
        # chains of three revisions e -> e+1 -> e+2 -> e+3
        Config(
            "deep",
            Bounds(1, 2, 1, 1, 1, 3, ((1,), (2,)), (0,)),
            Budget(faults=1, frame_kinds=TOKEN_ONLY, **_NO_CONTROL),
            ledger_size=1,
            expected_seconds=13,
        ),
        # chains of three revisions with two late frames in flight
        Config(
            "deep-frames",
            Bounds(1, 2, 2, 1, 1, 3, ((1,), (2,)), (0,)),
            Budget(faults=1, frame_kinds=TOKEN_ONLY, **_NO_CONTROL),
            ledger_size=1,
            expected_seconds=47,
        ),
        # two-block handoffs across two revisions with two revised contexts
        Config(
            "handoff",
            Bounds(1, 2, 0, 2, 2, 2, ((1, 2), (1, 3)), (0,)),
            Budget(faults=1, frame_kinds=TOKEN_ONLY, reuse_choices=(True,), **_NO_CONTROL),
            ledger_size=1,
            expected_seconds=48,
        ),
        # three-block handoffs: certification and adoption cut at every position
        Config(
            "handoff-long",
            Bounds(1, 2, 0, 3, 3, 1, ((1, 2, 3),), (0,)),
            Budget(faults=1, frame_kinds=TOKEN_ONLY, reuse_choices=(True,), **_NO_CONTROL),
            ledger_size=1,
            expected_seconds=240,
        ),
        # two tenants, each with a two-block handoff and one of two revised contexts, a fault
        Config(
            "tenants-handoff",
            Bounds(2, 2, 0, 2, 2, 1, ((1, 2), (1, 3)), (0, 1)),
            Budget(faults=1, frame_kinds=TOKEN_ONLY, reuse_choices=(True,), **_NO_CONTROL),
            ledger_size=1,
            expected_seconds=99,
        ),
        # two-block handoffs with a late frame in flight
        Config(
            "handoff-frames",
            Bounds(1, 2, 1, 2, 2, 1, ((1, 2), (1, 3)), (0,)),
            Budget(faults=1, frame_kinds=TOKEN_ONLY, reuse_choices=(True,), **_NO_CONTROL),
            ledger_size=1,
            expected_seconds=13,
        ),
        # pause, unpause and cancel against two frames of every kind, with a fault
        Config(
            "control",
            Bounds(1, 2, 2, 1, 1, 1, ((1,),), (0,)),
            Budget(faults=1, frame_kinds=ALL_KINDS),
            expected_seconds=30,
        ),
        # two tenants, two pages each way, a late frame
        Config(
            "tenants",
            Bounds(2, 2, 1, 2, 1, 1, ((1,),), (0, 1)),
            Budget(faults=0, frame_kinds=TOKEN_ONLY, **_NO_CONTROL),
            expected_seconds=36,
        ),
        # two tenants with pause, unpause and cancel, a late frame
        Config(
            "tenants-control",
            Bounds(2, 2, 1, 1, 1, 1, ((1,),), (0, 1)),
            Budget(faults=0, frame_kinds=TOKEN_ONLY),
            expected_seconds=147,
        ),
        # two tenants, three participants
        Config(
            "tenants-parts",
            Bounds(2, 3, 1, 1, 1, 1, ((1,),), (0, 1)),
            Budget(faults=0, frame_kinds=TOKEN_ONLY, **_NO_CONTROL),
            expected_seconds=24,
        ),
        # two scopes of one tenant and model, each with a two-block handoff and one of two
        # revised contexts, a fault: the page-owner check of ALIGN and adoption under load
        Config(
            "twins-handoff",
            Bounds(2, 2, 0, 2, 2, 1, ((1, 2), (1, 3)), (0, 0)),
            Budget(faults=1, frame_kinds=TOKEN_ONLY, reuse_choices=(True,), **_NO_CONTROL),
            ledger_size=1,
            expected_seconds=93,
        ),
        # two scopes of one tenant and model with pause, unpause and cancel, a late frame (one
        # page: with two, 2.9 million states and 16 CPU minutes)
        Config(
            "twins-control",
            Bounds(2, 2, 1, 1, 1, 1, ((1,),), (0, 0)),
            Budget(faults=0, frame_kinds=TOKEN_ONLY),
            expected_seconds=150,
        ),
        # two tenants, each revised twice (chains e -> e+1 -> e+2 side by side), a late frame,
        # a fault; 1,242,242 states (the longest search: 250 s on one worker)
        Config(
            "tenants-chain",
            Bounds(2, 2, 1, 1, 1, 2, ((1,), (2,)), (0, 1)),
            Budget(faults=1, frame_kinds=TOKEN_ONLY, **_NO_CONTROL),
            ledger_size=1,
            expected_seconds=251,
        ),
        _DRAFTS,
        # speculative decoding under two-block handoffs: a draft page next to a verified one,
        # certification cut where drafts were rolled back, a fault
        Config(
            "drafts-handoff",
            Bounds(1, 2, 0, 2, 2, 1, ((1, 2),), (0,)),
            Budget(
                faults=1,
                frame_kinds=TOKEN_ONLY,
                reuse_choices=(True,),
                drafts=True,
                **_NO_CONTROL,
            ),
            ledger_size=1,
            expected_seconds=15,
        ),
        _OUTPUT,
        # a version's output inherited with two participants: a name arriving while the other
        # participant still writes, or after the revision, a fault (no page passed by a sliding
        # window: ``output`` and ``groups``, two participants, have it, and here it would take
        # 28,755 states to 122,211)
        attrs.evolve(
            _OUTPUT,
            name="output-two",
            bounds=attrs.evolve(_OUTPUT.bounds, parts=2),
            budget=attrs.evolve(_OUTPUT.budget, unreference=False),
        ),
        _GROUPS,
        # two KV cache groups over two blocks: full attention (two pages) and a one-block
        # sliding window (one page), so a cut of two blocks leaves the sliding group's first
        # block out; a fault
        Config(
            "groups-window",
            Bounds(1, 2, 0, 3, 2, 1, ((1, 2),), (0,)),
            Budget(faults=1, frame_kinds=TOKEN_ONLY, reuse_choices=(True,), **_NO_CONTROL),
            ledger_size=1,
            kv_windows=(0, 1),
            page_groups=(0, 0, 1),
            expected_seconds=80,
        ),
    ),
    ALL_PROBES,
)
PROFILES: dict[str, Profile] = {p.name: p for p in (QUICK, FULL)}


@attrs.frozen(slots=True)
class ProfileResult:
    profile: Profile
    results: tuple[ExploreResult, ...]
    # the whole run's wall time when the configurations ran side by side (None: one after
    # another, each over ``workers``)
    wall: float | None = None
    jobs: int = 1

    @property
    def states(self) -> int:
        return sum(r.states for r in self.results)

    @property
    def transitions(self) -> int:
        return sum(r.transitions for r in self.results)

    @property
    def max_depth(self) -> int:
        return max((r.max_depth for r in self.results), default=0)

    @property
    def seconds(self) -> float:
        """Wall time: the whole run's when the configurations ran side by side, else the sum of
        theirs (they ran one after another)."""
        return self.wall if self.wall is not None else sum(r.seconds for r in self.results)

    @property
    def workers(self) -> int:
        """The processes that searched at once."""
        if self.wall is not None:
            return self.jobs
        return max((r.workers for r in self.results), default=1)

    @property
    def states_per_second(self) -> float:
        """Distinct states per second of wall time."""
        return self.states / self.seconds if self.seconds > 0 else 0.0

    @property
    def cpu_seconds(self) -> float:
        return sum(r.cpu_seconds for r in self.results)

    @property
    def cpu_states_per_second(self) -> float:
        return self.states / self.cpu_seconds if self.cpu_seconds > 0 else 0.0

    @property
    def probes(self) -> Counter[str]:
        total: Counter[str] = Counter()
        for r in self.results:
            total.update(r.probes)
        return total

    @property
    def missing_probes(self) -> tuple[str, ...]:
        probes = self.probes
        return tuple(p for p in self.profile.required_probes if not probes[p])

    @property
    def violation(self) -> Counterexample | None:
        return next((r.violation for r in self.results if r.violation is not None), None)

    @property
    def exhaustive(self) -> bool:
        return all(r.exhaustive for r in self.results) and len(self.results) == len(
            self.profile.configs
        )

    @property
    def ok(self) -> bool:
        return self.violation is None and self.exhaustive and not self.missing_probes

    def invariants(self) -> dict[str, bool]:
        """Each invariant and quiescence property: true iff every configuration was explored
        exhaustively and no state violated it."""
        cex = self.violation
        bad = set(cex.violated) if cex is not None else set()
        done = self.exhaustive
        return {inv.name: done and inv.name not in bad for inv in INVARIANTS + QUIESCENCE}

    def refinement(self) -> bool:
        cex = self.violation
        return self.exhaustive and (cex is None or bool(cex.violated))

    def summary(self) -> str:
        lines = [f"explorer, profile {self.profile.name}:"]
        for r in self.results:
            b = r.config.bounds
            lines.append(
                f"  {r.config.name:<9} scopes={b.scopes} parts={b.parts} frames={b.frames} "
                f"pages={b.pages} positions={b.positions} max_epoch={b.max_epoch} "
                f"ledger={r.config.ledger_size}: {r.states:,} states, {r.transitions:,} "
                f"transitions, depth {r.max_depth}, {r.quiescent:,} quiescent, "
                f"{r.seconds:.1f} s on {r.workers} worker{'s' if r.workers > 1 else ''} "
                f"({r.states_per_second:,.0f} states/s; "
                f"{r.states / max(r.cpu_seconds, 1e-9):,.0f} per CPU second)"
                + ("" if r.exhaustive or r.violation else "  [NOT EXHAUSTIVE: capped]")
            )
        lines.append(
            f"  total: {self.states:,} distinct states, {self.transitions:,} transitions, "
            f"max depth {self.max_depth}, {self.seconds:.1f} s wall, "
            f"{self.states_per_second:,.0f} states/s ({self.cpu_states_per_second:,.0f} per CPU "
            "second)"
        )
        probes = self.probes
        moves = sorted((k[5:], v) for k, v in probes.items() if k.startswith("move:"))
        acts = sorted((k[11:], v) for k, v in probes.items() if k.startswith("transition:"))
        lines.append("  hits per environment move: " + ", ".join(f"{k} {v:,}" for k, v in moves))
        lines.append("  hits per core transition: " + ", ".join(f"{k} {v:,}" for k, v in acts))
        missing = self.missing_probes
        lines.append(
            f"  probes: {len(self.profile.required_probes) - len(missing)}/"
            f"{len(self.profile.required_probes)} hit"
            + (f"; NEVER HIT (vacuous): {', '.join(missing)}" if missing else "")
        )
        cex = self.violation
        if cex is not None:
            lines.append(f"  VIOLATION in {cex.config.name}: {cex.error}")
        return "\n".join(lines)


def run_profile(
    profile: Profile,
    step_fn: StepFn = rc.step,
    actions: dict[str, Action] | None = None,
    progress: bool = True,
    stream: TextIO | None = None,
    jobs: int = 1,
) -> ProfileResult:
    """Explore the configurations of ``profile`` over ``jobs`` worker processes (1: in this
    process), with the same results either way: side by side, one process each, longest first,
    when there are at least as many configurations as jobs (a search split across workers does
    15-35% more work, and small configurations cost more to split than to search); otherwise one
    after another, each split across the jobs, stopping at the first violation."""
    if 1 < jobs <= len(profile.configs) and can_fork():
        return _side_by_side(profile, step_fn, actions, progress, stream, jobs)
    results = []
    for config in profile.configs:
        bar = Progress(f"{profile.name}/{config.name}", stream, enabled=progress)
        result = explore(config, step_fn, actions, progress=bar, jobs=jobs)
        bar.done()
        results.append(result)
        if result.violation is not None:
            break
    return ProfileResult(profile, tuple(results))


# What the forked processes of ``_side_by_side`` explore with: set in the parent before the fork
# (a mutant's patched step function cannot travel through a pipe).
_ALONE: tuple[StepFn, dict[str, Action] | None] | None = None


def _explore_alone(task: tuple[int, Config]) -> tuple[int, ExploreResult]:
    assert _ALONE is not None
    step_fn, actions = _ALONE
    index, config = task
    return index, explore(config, step_fn, actions, jobs=1)


def _side_by_side(
    profile: Profile,
    step_fn: StepFn,
    actions: dict[str, Action] | None,
    progress: bool,
    stream: TextIO | None,
    jobs: int,
) -> ProfileResult:
    """Every configuration in a forked process of its own, ``jobs`` at a time, longest first.
    All run to their end; the result keeps the configurations up to the first that found a
    violation, in the profile's order, as a run one after another would."""
    global _ALONE
    configs = profile.configs
    order = sorted(range(len(configs)), key=lambda i: -configs[i].expected_seconds)
    out = stream if stream is not None else sys.stderr
    found: dict[int, ExploreResult] = {}
    t0 = time.perf_counter()
    _ALONE = (step_fn, actions)
    try:
        with multiprocessing.get_context("fork").Pool(jobs) as pool:
            tasks = [(i, configs[i]) for i in order]
            for i, result in pool.imap_unordered(_explore_alone, tasks):
                found[i] = result
                if progress:
                    out.write(
                        f"[{profile.name}/{configs[i].name}] {result.states:,} states, "
                        f"{result.seconds:.1f} s ({len(found)}/{len(configs)} done)\n"
                    )
                    out.flush()
    finally:
        _ALONE = None
    wall = time.perf_counter() - t0
    results = []
    for i in range(len(configs)):
        results.append(found[i])
        if found[i].violation is not None:
            break
    return ProfileResult(profile, tuple(results), wall=wall, jobs=jobs)


__all__ = [
    "ALL_KINDS",
    "FULL",
    "PROFILES",
    "QUICK",
    "TOKEN_ONLY",
    "ProfileResult",
    "run_profile",
]
