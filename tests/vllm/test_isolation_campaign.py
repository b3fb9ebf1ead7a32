"""``retire isolation`` on real vLLM: one seed passes with the numbers it measures, and seeded bugs
make it fail (a page across tenants that only the audit sees, a corrupted victim output, a cache
salt blind to tenants).

One module engine of the campaign's pool size and the suite's reference checker; the command runs
through ``retire_cli.main`` with ``isolation_campaign.run`` pointed at them. The seed's clean and
plain runs are made once for the mutant tests.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from retire_bench import isolation_campaign as ic
from retire_cli import main
from retire_core import DEFAULT_CONTRACT
from retire_vllm.checker import Checker
from tests.vllm.support import attached, module_engine, tokens

pytestmark = pytest.mark.vllm

SEED = 0


@pytest.fixture(scope="module")
def engine() -> Iterator[Any]:
    yield from module_engine(num_blocks=ic.NUM_BLOCKS)


@pytest.fixture(scope="module")
def reference_runs(engine: Any) -> tuple[ic.RunResult, ic.RunResult]:
    """The seed's clean run (victims alone) and plain run (the bursty tenant alone)."""
    wl = ic.workload(SEED)
    clean = ic.run_workload(engine, wl.victims_only(), label="clean")
    plain = ic.run_workload(engine, wl.bursty_only(), label="plain")
    assert clean.error is None and plain.error is None
    return clean, plain


def _mutant(engine: Any, checker: Checker, runs: Any, name: str) -> dict[str, Any]:
    clean, plain = runs
    row = ic.run_seed(engine, checker, SEED, mutant=ic.MUTANTS[name], clean=clean, plain=plain)
    shown = ("mismatches", "cross_tenant_pages", "checker_admitted", "errors", "crossings")
    print(f"\n[{name}]", json.dumps({k: row[k] for k in shown})[:2000])
    return row


def test_scopes_carry_their_tenant_into_the_core_the_fingerprint_and_the_salt(engine: Any) -> None:
    rng = random.Random(7)
    with attached(engine) as facade:
        facade.submit("a", tokens(rng, 70), DEFAULT_CONTRACT, 4, tenant="acme")
        facade.submit("b", tokens(rng, 70), DEFAULT_CONTRACT, 4)  # the facade's own tenant
        facade.step()
        facade.supersede("a", tokens(rng, 40), DEFAULT_CONTRACT, 4)
        facade.run_until_idle()
        core = facade.retire
        assert (core.scope("a").tenant, core.scope("b").tenant) == ("acme", "default")
        assert core.scope("a").fingerprint.endswith("|tenant=acme")
        assert facade.records["a"].tenant == "acme"
        assert ":acme:a:" in str(facade.version_record("a", 0).salt)
        assert ":default:b:" in str(facade.version_record("b").salt)


def test_one_seed_passes_with_every_number_measured(
    engine: Any, checker: Checker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = ic.run

    def run(seeds: Any, **kwargs: Any) -> dict[str, Any]:
        return real(seeds, **{**kwargs, "engine": engine, "checker": checker})

    monkeypatch.setattr(ic, "run", run)
    report = tmp_path / "isolation.json"
    assert main(["isolation", "--seeds", str(SEED), "--json", str(report)]) == 0
    doc = json.loads(report.read_text())
    (row,) = doc["rows"]
    assert doc["passed"] and row["passed"]
    assert row["tenants"] == 4 and row["scopes"] == 9 and row["unscoped_requests"] == 6
    assert row["revisions"] == 27
    assert row["tokens_compared"] > 0 and row["mismatches"] == 0
    assert row["cross_tenant_pages"] == 0 and row["audit_problems"] == 0
    assert row["checker_admitted"] == row["checker_verdicts"] == row["scopes"]
    assert row["core_log_transitions"] > 0 and all(row["core_log_transitions_clean_plain"])
    assert row["leaks"] == [] and row["errors"] == []
    # The audits were not idle: pages were shared within tenants (handoffs, unscoped prefix
    # hits), retired versions wrote late, and closed pages were byte-checked every step.
    assert row["pages_shared_within_tenant"] > 0 and row["late_writes"] > 0
    assert row["closed_page_checks"] > 0
    assert row["reuse"]["shared"]["adopted"] > 0
    assert row["supersede_to_last_receipt_ms"]["shared"]["n"] > 0


def test_unscoped_requests_without_their_tenant_salt_cross_and_only_the_audit_sees_it(
    engine: Any, checker: Checker, reference_runs: Any
) -> None:
    row = _mutant(engine, checker, reference_runs, "unscoped_salt_dropped")
    assert not row["passed"]
    assert row["cross_tenant_pages"] > 0
    assert all("reads block" in c and "of tenant" in c for c in row["crossings"])
    # A prefix hit computes the same KV: the outputs and the checker cannot tell.
    assert row["mismatches"] == 0 and row["checker_admitted"] == row["scopes"]
    assert row["errors"] == [] and row["leaks"] == []


def test_a_corrupted_victim_output_is_a_mismatch(
    engine: Any, checker: Checker, reference_runs: Any
) -> None:
    row = _mutant(engine, checker, reference_runs, "victim_output_corrupted")
    assert not row["passed"]
    assert row["mismatches"] == 1
    assert row["mismatch_details"][0].startswith(f"{ic.VICTIMS[0]}/s0: tokens differ")
    assert row["checker_admitted"] == row["scopes"] - 1
    assert row["cross_tenant_pages"] == 0 and row["errors"] == []


def test_a_cold_salt_blind_to_tenants_fails_the_run(
    engine: Any, checker: Checker, reference_runs: Any
) -> None:
    """Last in the module: the facade refuses the step and the run breaks, which may leave the
    engine busy."""
    row = _mutant(engine, checker, reference_runs, "shared_cold_salt")
    assert not row["passed"]
    # vLLM hands a scope of the bursty tenant a victim's cached blocks in the step both are
    # first scheduled: the audit counts the crossing, then the facade refuses the step.
    assert row["cross_tenant_pages"] > 0
    assert any("IntegrationError" in e for e in row["errors"]), row["errors"]
