"""Z3: every invariant is inductive (with the auxiliary invariants) over unbounded sorts, the
proofs are not vacuous, BMC finds real traces that replay through the core, and a weakened spec
is caught."""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from retire_checks import proofs
from retire_checks.mutants import MUTANTS, judge
from retire_checks.proofs import AUX, PROVED, UNKNOWN, bmc, prove
from retire_spec.actions import ACTION_BY_NAME, ACTIONS
from retire_spec.invariants import INVARIANTS, Invariant
from retire_spec.schema import PUBLISHED


def test_every_invariant_and_aux_invariant_is_proved_inductive() -> None:
    report = prove(bmc_depth=3, timeout_ms=60_000)
    assert set(report.results) == {i.name for i in INVARIANTS} | {a.name for a in AUX}
    assert all(v == PROVED for v in report.results.values()), report.summary()
    assert report.bmc_status == "clean"
    # not vacuous: the initial state, and every guard with every hypothesis, is satisfiable
    undecided = [(c.name, c.status, c.detail) for c in report.vacuity_checks if c.status != "sat"]
    assert report.vacuity is True and report.all_proved, undecided
    assert len(report.vacuity_checks) == 1 + len(ACTIONS)
    assert all(c.status == "sat" for c in report.vacuity_checks)
    # one initiation check per property, at least one consecution check per action
    assert len(report.checks) >= len(report.results) + len(ACTIONS)


def _false(I: object, st: object) -> object:
    return I.lit(False)  # type: ignore[attr-defined]


def test_a_contradictory_hypothesis_makes_the_proof_vacuous() -> None:
    """``prove`` checks that its hypotheses and every guard are satisfiable together: an
    auxiliary invariant that contradicts itself (which makes every consecution check unsat)
    is reported as vacuous, and the report is not a proof."""
    bogus = Invariant("contradiction", "false", _false)
    report = prove(aux=(*AUX, bogus), bmc_depth=0, timeout_ms=30_000)
    assert report.vacuity is False
    assert not report.all_proved
    bad = [c.name for c in report.vacuity_checks if c.status != "sat"]
    assert bad and all(name.startswith("hypotheses") for name in bad)
    assert len(bad) == len(ACTIONS)  # the initial state itself is still satisfiable


def test_an_unsatisfiable_guard_makes_the_proof_vacuous() -> None:
    """An action whose guard can never hold proves every invariant for nothing."""
    dead = attrs.evolve(ACTION_BY_NAME["publish"], guard=lambda I, st, f: I.lit(False))
    actions = tuple(dead if a.name == "publish" else a for a in ACTIONS)
    report = prove(actions=actions, bmc_depth=0, timeout_ms=30_000)
    assert all(v == PROVED for v in report.results.values())  # proved, but vacuously so
    assert report.vacuity is False and not report.all_proved
    assert [c.name for c in report.vacuity_checks if c.status != "sat"] == [
        "hypotheses ∧ guard: publish"
    ]


def _three_pages(I: Any, st: object) -> object:
    def distinct(a: object, b: object) -> object:
        return I.not_(I.eq(a, b))

    return I.exists(
        "Page",
        lambda a: I.exists(
            "Page",
            lambda b: I.exists(
                "Page", lambda c: I.and_(distinct(a, b), distinct(a, c), distinct(b, c))
            ),
        ),
    )


def test_a_hypothesis_with_no_model_over_two_elements_is_asked_over_unbounded_sorts() -> None:
    """The vacuity queries are asked over two elements per sort first (a model there is a model
    of the unbounded sorts); one with no model there is not taken as unsatisfiable but asked
    again over the unbounded sorts, whose answer stands."""
    three = Invariant("three_pages", "three distinct pages exist", _three_pages)
    publish = ACTION_BY_NAME["publish"]
    small = proofs.non_vacuity([*INVARIANTS, *AUX], [publish], timeout_ms=30_000)
    assert [c.detail for c in small] == ["sat over two elements per sort"] * 2
    checks = proofs.non_vacuity([three], [publish], timeout_ms=30_000)
    assert [(c.name, c.status) for c in checks] == [
        ("initial state", "sat"),
        ("hypotheses ∧ guard: publish", "sat"),
    ]
    assert "two elements" not in checks[1].detail  # a model with three pages: unbounded sorts


def test_a_z3_timeout_does_not_kill_a_spec_mutant(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only a model (a counterexample to induction or a BMC trace) refutes a mutant's spec: when
    every query comes back unknown (as on a timeout), Z3 kills nothing and the spec mutant,
    which needs both the spec explorer and Z3, is not counted as killed."""
    mutant = MUTANTS["spec_stale_token_published"]
    assert "z3" in judge(mutant).killed_by  # the real answer: refuted

    def undecided(solver: object) -> tuple[str, None, str]:
        return UNKNOWN, None, "timeout (simulated)"

    monkeypatch.setattr(proofs, "_check", undecided)
    verdict = judge(mutant, bmc_depth=2)
    assert "z3" not in verdict.killed_by
    assert "explorer" in verdict.killed_by and not verdict.killed
    assert verdict.detail["z3"].startswith("NOT refuted")


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


def test_an_undecided_induction_query_is_asked_again_over_two_elements_per_sort(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Z3 leaves a consecution query unknown now and then (quantifiers; a loaded machine's
    timeout): it is asked again over two elements per sort, where the counterexample to induction
    of a leaking chain collapse is found, so the mutant is still refuted. With that query
    undecided too, nothing is (the test above)."""
    real = proofs._check

    def unbounded_undecided(solver: Any) -> tuple[str, Any, str]:
        if "declare-datatypes" not in solver.sexpr():  # the uninterpreted sorts' queries
            return UNKNOWN, None, "timeout (simulated)"
        return real(solver)  # type: ignore[no-any-return]

    monkeypatch.setattr(proofs, "_check", unbounded_undecided)
    verdict = judge(MUTANTS["spec_chain_collapse_leaks"])
    assert verdict.killed, verdict.detail
    assert "pins_belong_to_pending_successor: supersede" in verdict.detail["z3"]
