"""The mutant catalogue and its judge: seeded bugs in the core and in the spec, and the checks
that kill them.

A check that cannot fail proves nothing, so every check of this package is run against bugs it
must find. *Core mutants* patch one decision of ``retire_core`` (``unittest.mock.patch`` on the
gates, handoff, reclamation or a record method, or on the ``table.TABLE`` entries of an event:
``_handler``) and leave the spec alone: the explorer over the real core must find a
refinement, invariant or quiescence violation. *Spec mutants* weaken one guard or effect of
``retire_spec.actions`` (an alternative action table, written in the same vocabulary, so Z3
reads it too): the spec explorer and the Z3 proofs must both fail on them. Hypothesis
(``retire_checks.fuzz``) is run on core mutants when it is installed and asked for. ``judge``
runs the checks on one mutant and ``run_catalogue`` on all; a survivor makes the catalogue
fail. Mutants name the bug kinds of issue 3 in their ``kind``; the explorer configurations each
one is judged in are small slices of the quick profile (a bug must show within them). What does
not live here: the checks themselves (``explorer``, ``proofs``, ``fuzz``), the ``Mutant`` record
and its worlds (``mutant_kind``), and the mutants (``mutants_core``, ``mutants_commands``,
``mutants_spec``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import attrs

from retire_checks.explorer import Counterexample, explore, explore_spec
from retire_checks.mutant_kind import Mutant
from retire_checks.mutants_core import CORE_MUTANTS
from retire_checks.mutants_spec import SPEC_MUTANTS

#: Examples the Hypothesis machine gets per core mutant (``judge(..., use_hypothesis=True)``).
#: From ``fuzz.FUZZ_SEED``, 1,000 kill all 41 core mutants (about 140 s for the whole catalogue,
#: since a run stops at its first failure); 60 left 7 of them alive.
HYPOTHESIS_EXAMPLES = 1000

MUTANTS: dict[str, Mutant] = {m.name: m for m in CORE_MUTANTS + SPEC_MUTANTS}


# --- judging ------------------------------------------------------------------------------------


@attrs.frozen(slots=True)
class Verdict:
    mutant: Mutant
    killed_by: tuple[str, ...]  # "explorer", "z3", "hypothesis"
    detail: dict[str, str]  # check -> what it found (or why it did not)
    counterexample: Counterexample | None
    seconds: float

    @property
    def killed(self) -> bool:
        return all(check in self.killed_by for check in self.mutant.required)


def z3_verdict(report: Any) -> str:
    """What Z3 said about a mutant's spec. Only a refutation kills: a query Z3 answered with a
    model (an initiation failure or a counterexample to induction: the mutant's invariants are
    no longer inductive) or a BMC trace from the initial state. A query that timed out or came
    back ``unknown`` kills nothing, however many of them there are."""
    refuted = report.refuted
    undecided = [c.name for c in report.checks if c.status == "unknown"]
    if report.bmc_status == "unknown":
        undecided.append("bmc")
    if refuted:
        return f"refuted (a model breaks it): {list(refuted[:4])}" + (
            f"; {len(undecided)} undecided" if undecided else ""
        )
    if undecided:
        return f"NOT refuted: {len(undecided)} queries unknown/timed out {undecided[:4]}"
    return "every invariant still proved"


def judge(
    mutant: Mutant,
    *,
    use_z3: bool = True,
    use_hypothesis: bool = False,
    max_states: int = 200_000,
    z3_timeout_ms: int = 10_000,
    bmc_depth: int = 0,
) -> Verdict:
    """Run the checks on one mutant. The explorer is always run (over the core for a core
    mutant, over the spec for a spec mutant); Z3 on spec mutants; Hypothesis on core mutants
    when asked."""
    t0 = time.perf_counter()
    killed: list[str] = []
    detail: dict[str, str] = {}
    cex: Counterexample | None = None
    for config in mutant.configs:
        capped = attrs.evolve(config, max_states=max_states)
        if mutant.level == "core":
            with mutant.active():
                result = explore(capped)
        else:
            result = explore_spec(capped, mutant.actions, max_states=max_states)
        if result.violation is not None:
            cex = result.violation
            killed.append("explorer")
            detail["explorer"] = (
                f"{config.name}: {len(cex.moves)} steps, {result.states:,} states: {cex.error}"
            )
            break
        detail["explorer"] = f"survived {config.name} ({result.states:,} states)"
    if use_z3 and mutant.level == "spec":
        from retire_checks.proofs import prove

        assert mutant.actions is not None
        # A model is its own witness of satisfiability, so the vacuity queries add nothing to
        # a kill; they are skipped here (``retire check`` runs them on the real spec).
        report = prove(
            actions=tuple(mutant.actions.values()),
            timeout_ms=z3_timeout_ms,
            bmc_depth=bmc_depth,
            check_vacuity=False,
        )
        detail["z3"] = z3_verdict(report)
        if report.refuted:
            killed.append("z3")
    if (use_hypothesis or "hypothesis" in mutant.required) and mutant.level == "core":
        try:
            from retire_checks.fuzz import run_machine
        except ModuleNotFoundError as err:  # hypothesis is a dev extra
            detail["hypothesis"] = f"not run ({err})"
        else:
            with mutant.active():
                failure = run_machine(max_examples=HYPOTHESIS_EXAMPLES)
            if failure is not None:
                killed.append("hypothesis")
                detail["hypothesis"] = f"{type(failure).__name__}"
            else:
                detail["hypothesis"] = f"survived {HYPOTHESIS_EXAMPLES} examples"
    return Verdict(mutant, tuple(killed), detail, cex, time.perf_counter() - t0)


def run_catalogue(
    names: list[str] | None = None,
    *,
    use_z3: bool = True,
    use_hypothesis: bool = False,
    progress: Callable[[Verdict], None] | None = None,
) -> list[Verdict]:
    """Judge the named mutants (all by default), in catalogue order."""
    verdicts = []
    for name in names or list(MUTANTS):
        verdict = judge(MUTANTS[name], use_z3=use_z3, use_hypothesis=use_hypothesis)
        if progress is not None:
            progress(verdict)
        verdicts.append(verdict)
    return verdicts


__all__ = [
    "CORE_MUTANTS",
    "MUTANTS",
    "SPEC_MUTANTS",
    "Mutant",
    "Verdict",
    "judge",
    "run_catalogue",
]
