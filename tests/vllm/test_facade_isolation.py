"""Rule 3 and the rest of the protocol on real vLLM: isolation under late steps, receipts, pause,
cancel, the trace of an integration run against the spec, and several engines sharing nothing.

One engine for the module (plus a reference engine, and a second engine for the fleet test).
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from retire_core import DEFAULT_CONTRACT, IllegalTransitionError, ScopeState
from retire_vllm import faults
from retire_vllm.checker import Checker, IsolationAudit
from retire_vllm.corelog import TraceRejected
from retire_vllm.errors import IntegrationError
from retire_vllm.facade import RetireEngine
from retire_vllm.fleet import RetireFleet
from tests.vllm.support import (
    assert_engine_clean,
    attached,
    build,
    module_engine,
    shutdown,
    tokens,
)

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def engine() -> Iterator[Any]:
    yield from module_engine(num_blocks=256)


def _late_step_run(facade: RetireEngine, rng: random.Random) -> dict[str, list[int]]:
    """Scope A is revised twice *while a step is in flight* (the second time during its
    successor's first, prefill step), co-tenant scope B keeps decoding, scope C is cancelled
    mid-step, and an external request runs alongside."""
    a0 = tokens(rng, 150)
    a1 = a0[:140] + tokens(rng, 30)
    a2 = a0[:70] + tokens(rng, 50)
    facade.submit("A", a0, DEFAULT_CONTRACT, 40)
    facade.submit("B", tokens(rng, 90), DEFAULT_CONTRACT, 60)
    facade.submit("C", tokens(rng, 60), DEFAULT_CONTRACT, 60)
    facade.add_external("X", tokens(rng, 120), 30)
    for _ in range(5):
        facade.step()
    facade.during_next_step(lambda f: f.supersede("A", a1, DEFAULT_CONTRACT, 12))
    facade.step()  # A@0's step runs after ADVANCE; its commit is refused, fence at the boundary
    assert facade.version_record("A", 0).fenced
    facade.during_next_step(lambda f: f.supersede("A", a2, DEFAULT_CONTRACT, 12))
    facade.step()  # A@1 is admitted (adopting A@0's blocks) and retired during its first step
    facade.during_next_step(lambda f: f.cancel("C"))
    facade.step()
    facade.run_until_idle()
    return {"A": a2}


def test_retired_work_never_writes_into_others_pages(engine: Any, checker: Checker) -> None:
    with attached(engine) as facade:
        audit = IsolationAudit().attach(facade)
        _late_step_run(facade, random.Random(41))
        a1 = facade.version_record("A", 1)
        print(
            f"\n[isolation] {audit.steps} steps, {audit.writes} block writes of which "
            f"{audit.late_writes} by retired versions, {audit.pages_checked} closed-page byte "
            f"checks, violations: {audit.violations}"
        )
        assert audit.violations == []
        assert audit.late_writes >= 2  # the late steps of A@0, A@1 and C@0 really happened
        # A@1 adopted A@0's pages, ran one late prefill step, and handed the prefix on to A@2.
        assert a1.adopted_blocks == 4 and a1.commits_dropped == 1 and a1.closed
        assert facade.version_record("A").adopted_blocks == 2
        assert facade.retire.scope("C").state is ScopeState.CANCELLED
        assert facade.version_record("C", 0).closed
        assert checker.verify(facade, "A").ok
        assert checker.verify(facade, "B").ok


def test_block_ids_read_straight_from_the_manager_match_vllm(engine: Any) -> None:
    """The facade reads a request's block ids from vLLM's per-request block list
    (``introspect.manager_block_tables``); it must agree with ``KVCacheManager.get_block_ids``."""
    from retire_vllm import introspect as ix

    class Compare:
        checked = 0

        def before_execute(self, facade: RetireEngine, writes: Any) -> None:
            for rid in list(facade.scheduler.requests):
                expected = [list(ids) for ids in facade.kvm.get_block_ids(rid)]
                assert ix.manager_block_tables(facade.kvm, rid) == expected
                self.checked += 1

        def after_step(self, facade: RetireEngine) -> None:
            return None

    compare = Compare()
    with attached(engine) as facade:
        facade.observers.append(compare)
        _late_step_run(facade, random.Random(7))
    assert compare.checked > 10
    assert ix.manager_block_tables(ix.kv_cache_manager(engine), "no-such-request") == [[]]


def test_block_digests_follow_the_kv_bytes() -> None:
    """The digests read the worker's KV tensors as they are now: every later write, and
    replaced tensors, show in them."""
    import torch

    from retire_vllm import introspect as ix

    class Worker:
        def __init__(self, caches: list[torch.Tensor]) -> None:
            self.model_runner = type("Runner", (), {"kv_caches": caches})()

    worker = Worker([torch.zeros(4, 2, 8), torch.zeros(4, 2, 8)])
    first = ix.worker_block_digests(worker, [1, 2])
    ix.worker_corrupt_block(worker, 1, layer=1)
    second = ix.worker_block_digests(worker, [1, 2])
    assert second[1] != first[1] and second[2] == first[2]
    worker.model_runner.kv_caches = [torch.ones(4, 2, 8), torch.zeros(4, 2, 8)]
    assert ix.worker_block_digests(worker, [2])[2] != first[2]
    # A non-contiguous tensor is digested too.
    worker.model_runner.kv_caches = [torch.zeros(8, 4).t()]
    before = ix.worker_block_digests(worker, [0])[0]
    ix.worker_corrupt_block(worker, 0)
    assert ix.worker_block_digests(worker, [0])[0] != before


def test_kv_layouts_the_digests_cannot_read_are_named() -> None:
    """KV tensors without a block axis of the pool's size, or without bytes, cannot be read."""
    import torch

    from retire_vllm import introspect as ix

    def worker(*caches: torch.Tensor) -> Any:
        return type("W", (), {"model_runner": type("R", (), {"kv_caches": list(caches)})()})()

    assert ix.worker_kv_layout_problem(worker(torch.zeros(4, 2, 8)), 4) is None
    kv_first = ix.worker_kv_layout_problem(worker(torch.zeros(4, 2, 8), torch.zeros(2, 4, 8)), 4)
    assert kv_first is not None and kv_first.startswith("layer 1: KV cache shape [2, 4, 8]")
    # vLLM's older K/V-first GPU shape [2, B, N, H, D] has its blocks on axis 1
    assert ix.worker_kv_layout_problem(worker(torch.zeros(2, 4, 2, 1, 8)), 4) is None
    on_device = ix.worker_kv_layout_problem(worker(torch.zeros(4, 2, 8, device="meta")), 4)
    assert on_device is not None and "on meta" in on_device


def test_an_engine_whose_kv_blocks_cannot_be_read_is_refused_at_attach(
    engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A layout the digests cannot read is a clear error before attaching, not a failure at the
    first writer closure; the engine is left as it was."""
    from retire_vllm import introspect as ix

    monkeypatch.setattr(ix, "worker_kv_layout_problem", lambda worker, n: f"{n} blocks, wrong")
    with pytest.raises(IntegrationError, match="rank 0: 256 blocks, wrong"):
        RetireEngine(engine=engine)
    assert ix.scheduler(engine).retire_hooks is None
    monkeypatch.undo()
    with attached(engine) as facade:  # and it still attaches once the layout is readable
        assert len(facade.retire.state.pages) == 0


def test_isolation_audit_catches_a_stray_write(engine: Any) -> None:
    """Mutant: during a step, something writes into a closed page of co-tenant B (what retired
    work writing through a stale block table would do). The audit must report it."""

    class StrayWriter:
        def __init__(self) -> None:
            self.done = False

        def before_execute(self, facade: RetireEngine, writes: Any) -> None:
            if self.done:
                return
            closed = [
                p for p in facade.version_record("B").pages if not facade.pages[p].writer_open
            ]
            if closed:
                faults.corrupt_page(facade, closed[0])
                self.done = True

        def after_step(self, facade: RetireEngine) -> None:
            return None

    with attached(engine) as facade:
        audit = IsolationAudit().attach(facade)
        facade.observers.append(StrayWriter())  # runs after the audit's snapshot
        _late_step_run(facade, random.Random(42))
    assert any("closed page" in v for v in audit.violations), audit.violations


def test_receipts_precede_reclaim_in_the_trace_and_it_validates(
    engine: Any, checker: Checker, tmp_path: Path
) -> None:
    log = tmp_path / "retire.jsonl"
    with attached(engine, log_path=log) as facade:
        rng = random.Random(43)
        p0 = tokens(rng, 140)
        facade.submit("R", p0, DEFAULT_CONTRACT, 30)
        for _ in range(4):
            facade.step()
        facade.hold_admission("R")
        facade.supersede("R", p0[:120] + tokens(rng, 20), DEFAULT_CONTRACT, 10)
        faults.corrupt_page(facade, facade.version_record("R").certificate[1][0])
        facade.release_admission("R")
        facade.step()
        facade.during_next_step(lambda f: f.supersede("R", p0[:100], DEFAULT_CONTRACT, 10))
        facade.run_until_idle()
        facade.consume("R")
        assert checker.verify(facade, "R").ok
        participants = {r.version: r.participants for r in facade.records["R"].versions}
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    receipts: dict[int, set[str]] = {}
    for rec in lines:
        if rec["scope"] != "R":
            continue
        if rec["transition"] == "receipt":
            receipts.setdefault(rec["version"], set()).add(rec["participant"])
        if rec["transition"] in ("unhold", "free") and rec["version"] < 2:
            # a retired version's page loses its reference only after every receipt
            assert receipts.get(rec["version"]) == set(participants[rec["version"]]), rec
    assert any(r["transition"] == "release" and r.get("reason") == "digest_mismatch" for r in lines)
    from retire_checks.trace_validation import validate_file

    report = validate_file(log)
    assert report.transitions == len(lines)
    assert report.hidden["corrupt"] >= 1  # the validator had to explain the byte check failure


def test_every_facade_validates_its_core_log_at_close(engine: Any, core_logs: Path) -> None:
    # No log path given: the suite's fixture points the facade at its directory.
    rng = random.Random(45)
    p0 = tokens(rng, 120)
    with attached(engine) as facade:
        assert facade.core_log is not None and facade.core_log.path.parent == core_logs
        facade.submit("L", p0, DEFAULT_CONTRACT, 20)
        for _ in range(3):
            facade.step()
        facade.supersede("L", p0[:100] + tokens(rng, 10), DEFAULT_CONTRACT, 8)
        facade.run_until_idle()
        facade.consume("L")
        path = facade.core_log.path
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert facade.core_log.validated == len(lines) > 0
    assert {"supersede", "publish", "receipt", "cancel"} <= {r["transition"] for r in lines}


def test_a_corrupted_core_log_fails_close(engine: Any) -> None:
    """The check can fail: the same close, on a log whose lines were reordered, raises
    ``TraceRejected`` -- after the engine was drained and every block given back."""
    rng = random.Random(46)
    p0 = tokens(rng, 120)
    rejected = pytest.raises(TraceRejected, match=r"core log rejected: .*\.jsonl:\d+: ")
    with rejected as err, attached(engine) as facade:
        facade.submit("M", p0, DEFAULT_CONTRACT, 20)
        for _ in range(3):
            facade.step()
        facade.supersede("M", p0[:100] + tokens(rng, 10), DEFAULT_CONTRACT, 8)
        facade.run_until_idle()
        assert facade.core_log is not None
        records = facade.core_log.records
        first = next(i for i, r in enumerate(records) if r["transition"] == "supersede")
        records[first], records[first + 1] = records[first + 1], records[first]
    assert "seq jumps" in err.value.message
    assert_engine_clean(engine)


def test_pause_keeps_authority_and_stops_the_scope(engine: Any, checker: Checker) -> None:
    rng = random.Random(44)
    with attached(engine) as facade:
        facade.submit("P", tokens(rng, 80), DEFAULT_CONTRACT, 20)
        facade.submit("Q", tokens(rng, 80), DEFAULT_CONTRACT, 20)
        for _ in range(4):
            facade.step()
        facade.pause("P")
        p_before = len(facade.version_record("P").output_token_ids)
        q_before = len(facade.version_record("Q").output_token_ids)
        for _ in range(5):
            facade.step()
        assert len(facade.version_record("P").output_token_ids) == p_before
        assert len(facade.version_record("Q").output_token_ids) == q_before + 5
        assert facade.retire.current_version("P") == 0
        assert [d.version for d in facade.consume("P")] == [0] * p_before  # still publishes
        facade.unpause("P")
        facade.run_until_idle()
        assert len(facade.consume("P")) == 20 - p_before
        assert checker.verify(facade, "P").ok and checker.verify(facade, "Q").ok
        # A pause while a revision is in progress is refused by the core, and changes nothing.
        facade.hold_admission("P")
        facade.supersede("P", facade.version_record("P").prompt[:70], DEFAULT_CONTRACT, 4)
        state = facade.retire.state
        with pytest.raises(IllegalTransitionError):
            facade.pause("P")
        assert facade.retire.state is state
        facade.release_admission("P")
        facade.run_until_idle()


def test_cancel_releases_everything_and_publishes_nothing_more(engine: Any) -> None:
    rng = random.Random(45)
    with attached(engine) as facade:
        facade.submit("K", tokens(rng, 100), DEFAULT_CONTRACT, 50)
        for _ in range(5):
            facade.step()
        facade.hold_admission("K")
        facade.supersede("K", [*facade.version_record("K").prompt[:96], 5, 6], DEFAULT_CONTRACT, 5)
        assert facade.pinned_blocks()
        facade.cancel("K")
        assert facade.pinned_blocks() == [] and facade.retire.pinned_pages() == ()
        assert facade.consume("K") == []
        assert facade.version_record("K", 0).closed
        assert not facade.version_record("K", 1).admitted
        facade.release_admission("K")
        facade.run_until_idle()
        assert len(facade.retire.state.pages) == 0  # nothing of a cancelled scope is retained


def test_fleet_of_engines_sharing_nothing(engine: Any, checker: Checker) -> None:
    other = build(num_blocks=128)
    try:
        fleet = RetireFleet(
            [RetireEngine(engine=engine), RetireEngine(engine=other)],
            place=lambda scope: int(scope[-1]) % 2,
        )
        rng = random.Random(46)
        prompts = {f"f{i}": tokens(rng, 70 + 10 * i) for i in range(4)}
        for scope, p in prompts.items():
            fleet.submit(scope, p, DEFAULT_CONTRACT, 12)
        for _ in range(3):
            fleet.step()
        for scope, p in prompts.items():
            fleet.supersede(scope, p[:64] + tokens(rng, 9), DEFAULT_CONTRACT, 8)
        while fleet.has_unfinished():
            fleet.step()
        for scope in prompts:
            home = fleet.engine_of(scope)
            assert checker.verify(home, scope).ok
            assert home.version_record(scope).adopted_blocks == 2
            assert [d.version for d in fleet.consume(scope)] == [1] * 8
        assert {id(fleet.engine_of(s).engine) for s in prompts} == {id(engine), id(other)}
        fleet.close()
        assert_engine_clean(other)
    finally:
        shutdown(other)
    assert_engine_clean(engine)
