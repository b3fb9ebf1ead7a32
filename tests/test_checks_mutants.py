"""The mutant catalogue: every seeded bug is killed by the explorer (and, in the spec, by Z3),
the unmutated core and spec pass the very same runs, and the catalogue covers the bug kinds of
issue 3."""

from __future__ import annotations

import pytest

from retire_checks import mutants
from retire_checks.explorer import QUICK, explore_spec
from retire_core import gates, handoff, machine

REQUIRED_KINDS = {
    "stale publication (token)",
    "stale publication (commit gate)",
    "stale publication (install gate)",
    "adopting an open-writer page",
    "prefix mismatch",
    "fingerprint mismatch",
    "generation reuse",
    "digest ignored",
    "handoff pin released before adoption",
    "free while referenced",
    "retired writer overwriting the successor's page",
    "cross-tenant write",
    "closing a version on a partial set of receipts",
    "pause losing authority",
    "cancel creating a successor",
    "chain collapse that leaks",
}


def test_catalogue_covers_every_required_kind_in_core_and_spec() -> None:
    assert len(mutants.MUTANTS) >= 15
    core_kinds = {m.kind for m in mutants.CORE_MUTANTS}
    assert core_kinds >= REQUIRED_KINDS
    assert len(mutants.SPEC_MUTANTS) >= 10


@pytest.mark.parametrize("name", sorted(mutants.MUTANTS))
def test_mutant_is_killed(name: str) -> None:
    verdict = mutants.judge(mutants.MUTANTS[name])
    assert verdict.killed, f"{name} survived: {verdict.detail}"
    assert verdict.counterexample is not None and verdict.counterexample.moves
    if verdict.mutant.level == "spec":
        assert "z3" in verdict.killed_by
    # the patch is undone afterwards
    assert machine.publication_gate is gates.publication_gate
    assert machine.write_gate is gates.write_gate
    assert handoff.verify_adoption is mutants._verify


def test_unmutated_core_and_spec_pass_the_mutants_runs() -> None:
    """The runs that kill the mutants do not fail for some other reason. (The core mutants are
    judged in configurations of the quick profile, which ``test_checks_cli`` runs unmutated.)"""
    quick = {c.name: c for c in QUICK.configs}
    assert all(quick.get(c.name) == c for m in mutants.CORE_MUTANTS for c in m.configs)
    for config in {c for m in mutants.SPEC_MUTANTS for c in m.configs}:
        result = explore_spec(config)
        assert result.violation is None and result.exhaustive, config.name


def test_hypothesis_alone_kills_every_core_mutant() -> None:
    """The Hypothesis machine is a second check of the core, independent of the explorer: with
    the examples ``judge`` gives it, it must find a failure under every core mutant (if a change
    to the rules lets one survive, re-pick ``fuzz.FUZZ_SEED`` or raise the count)."""
    from retire_checks.fuzz import run_machine

    survivors = []
    for mutant in mutants.CORE_MUTANTS:
        with mutant.active():
            if run_machine(max_examples=mutants.HYPOTHESIS_EXAMPLES) is None:
                survivors.append(mutant.name)
    assert survivors == []


def test_hypothesis_is_reported_for_core_mutants() -> None:
    verdict = mutants.judge(
        mutants.MUTANTS["stale_token_published"], use_z3=False, use_hypothesis=True
    )
    assert verdict.killed_by == ("explorer", "hypothesis")
