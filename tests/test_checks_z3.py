"""Z3: every invariant is inductive (with the auxiliary invariants) over unbounded sorts, the
proofs are not vacuous, BMC finds real traces that replay through the core, and a weakened spec
is caught."""

from __future__ import annotations

import z3

from retire_checks.mutants import MUTANTS
from retire_checks.proofs import AUX, PROVED, bmc, prove
from retire_checks.z3_interp import Symbolic
from retire_spec.actions import ACTIONS
from retire_spec.invariants import INVARIANTS, Invariant
from retire_spec.schema import PUBLISHED


def test_every_invariant_and_aux_invariant_is_proved_inductive() -> None:
    report = prove(bmc_depth=3, timeout_ms=60_000)
    assert set(report.results) == {i.name for i in INVARIANTS} | {a.name for a in AUX}
    assert all(v == PROVED for v in report.results.values()), report.summary()
    assert report.bmc_status == "clean"
    # one initiation check per property, at least one consecution check per action
    assert len(report.checks) >= len(report.results) + len(ACTIONS)


def test_the_induction_hypotheses_are_satisfiable_for_every_action() -> None:
    """A contradictory hypothesis would make every consecution check vacuously unsat."""
    I = Symbolic()
    pre = I.symbolic_state("pre")
    hypothesis = [p.holds(I, pre) for p in (*INVARIANTS, *AUX)]
    for action in ACTIONS:
        s = z3.Solver()
        s.set("timeout", 30_000)
        s.add(*hypothesis, I._b(action.guard(I, pre, *I.action_params(action, "x"))))
        assert s.check() == z3.sat, action.name


def _nothing_published(I: object, st: object) -> object:
    return I.forall(  # type: ignore[attr-defined]
        "Frame",
        lambda f: I.not_(I.eq(I.get(st["frame_state"], f), I.lit(PUBLISHED))),  # type: ignore
    )


def test_bmc_finds_a_real_trace_and_replays_it_through_the_core() -> None:
    prop = Invariant("nothing_published", "no frame is ever published", _nothing_published)
    assert bmc([prop], ACTIONS, depth=3)[1] == "clean"  # open, launch, emit: not yet
    trace, status = bmc([prop], ACTIONS, depth=4)
    assert status == "violated" and trace is not None
    assert [s.name for s in trace.steps] == ["open", "launch", "emit", "publish"]
    assert trace.violated == ("nothing_published",)
    assert "replayed" in trace.replay and "MISBEHAVES" not in trace.replay


def test_a_weakened_publication_guard_is_refuted() -> None:
    mutant = MUTANTS["spec_stale_token_published"]
    assert mutant.actions is not None
    report = prove(actions=tuple(mutant.actions.values()), bmc_depth=5, timeout_ms=60_000)
    assert report.results["publication_token"] == "violated"
    assert report.bmc is not None and report.bmc.violated == ("publication_token",)
    assert [s.name for s in report.bmc.steps][-2:] == ["supersede", "publish"] or (
        report.bmc.steps[-1].name == "publish"
    )
    # the real core never publishes the stale frame: the replay says so
    assert "stays safe" in report.bmc.replay
    cti = [c for c in report.checks if c.status == "violated"]
    assert cti and "counterexample to induction: publish" in cti[0].detail
