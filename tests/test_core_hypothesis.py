"""Hypothesis drives the core and the spec side by side; rare paths must be reached."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

from retire_checks import fuzz

SETTINGS = settings(
    max_examples=600,
    stateful_step_count=50,
    deadline=None,
    # the examples come from ``fuzz.FUZZ_SEED`` (set on the machine class), not from a digest
    # of the machine's source
    database=None,  # no example database: every checkout runs exactly the same examples
    suppress_health_check=list(HealthCheck),
)


@pytest.fixture(autouse=True, scope="module")
def _same_examples_whatever_ran_before() -> Iterator[None]:
    with fuzz.fixed_generation():
        yield


RARE_PATHS = (
    "transition:certify",
    "transition:adopt",
    "transition:fence_write",
    "transition:late_report",
    "release:digest_mismatch",
    "release:generation_changed",
    "drop:retired_draining",
    "drop:retired_drained",
    "drop:scope_cancelled",
    "fence_write:page_of_another_scope",
    "rejected:DuplicateReceiptError",
    "rejected:DoubleFreeError",
    "path:revision_chain",
    # a revision while a scope of the same tenant and model holds a page with the prefix
    "path:same_model_page_not_inherited",
    # step-grouped batches through Retire.handle_batch (``engine_step``): several events at
    # once, both logging paths, and a batch refused as a whole
    "batch:several_events",
    "batch:logged",
    "batch:unlogged",
    "batch:refused",
    # a version's end, the engine evicting what it gave back, and a cancelled scope forgotten
    # (which the exhaustive explorer leaves out: a forgotten scope can open again, unbounded)
    "transition:finish",
    "transition:evict",
    "transition:forget",
    # speculative decoding (``speculative_step``): drafts written, verified or rejected, rolled
    # back by a writer closing first, and verified again or late
    "transition:write_draft",
    "transition:verify_drafts",
    "transition:stale_verify",
    # vLLM's preemption of the current version (its pages go back; it runs again), and a late
    # report of one
    "transition:preempt",
    "transition:late_preempt",
    # a page a sliding window passed while its version runs, and a late report of one
    "transition:unreference",
    "transition:late_unreference",
)


def test_the_lockstep_machine_passes_and_reaches_every_rare_path() -> None:
    """The machine's run and the check of what it reached are one test, so that they run in one
    process (under pytest-xdist two tests may run on different workers)."""
    fuzz.COVERAGE.clear()
    machine = fuzz.LockstepMachine.TestCase
    machine.settings = SETTINGS
    machine("runTest").runTest()
    missing = [p for p in RARE_PATHS if fuzz.COVERAGE[p] == 0]
    assert not missing, f"never reached: {missing}; coverage: {dict(fuzz.COVERAGE)}"
