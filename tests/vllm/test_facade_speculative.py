"""Revisions inside active speculative decoding, on real vLLM.

vLLM writes the KV of draft tokens in the step that verifies them; rejected drafts' slots are
rewritten by a later step. Two draft models keep drafts in flight deterministically: a tiny model
with other weights (almost every draft is rejected, so drafts often cross a block boundary and are
rolled back) and the target itself (every draft is accepted, so blocks are completed by verified
drafts). The workload is ``retire_bench.shapes``': each scope is revised between steps, inside a
step after its drafts were proposed and before the model runs, or after the model verified them
and before the commit. Every successor must equal a cold run of its prompt and adopt exactly the
common prefix's blocks with the clean reference's bytes (the reference runs the same draft model:
its layers share the target's KV blocks), and the core's log (validated against the spec at
close) must show the draft window really happened.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from retire_bench.shapes import NUM_BLOCKS, SHAPES, draft_window, plans, read_log, run_plans
from retire_bench.shapes import speculative_config as spec_config
from retire_vllm import identity
from retire_vllm.checker import Checker
from tests.vllm.support import attached, build, shutdown

pytestmark = pytest.mark.vllm

BS = 32
MODES = ("spec_rejecting", "spec_accepting")


@pytest.fixture(scope="module", params=MODES)
def engines(request: pytest.FixtureRequest) -> Iterator[tuple[str, Any, Checker]]:
    from retire_vllm.engine_config import build_engine

    mode = request.param
    draft_seed = SHAPES[mode].draft_seed
    assert draft_seed is not None
    spec = spec_config(draft_seed)
    ref = build_engine(num_blocks=NUM_BLOCKS, speculative_config=spec)
    eng = build(num_blocks=NUM_BLOCKS, speculative_config=spec)
    yield mode, eng, Checker(ref)
    shutdown(eng)
    shutdown(ref)


def test_revisions_inside_speculative_decoding(
    engines: tuple[str, Any, Checker], tmp_path: Path
) -> None:
    mode, engine, checker = engines
    todo = plans(seed=0)
    log_path = tmp_path / "core.jsonl"
    with attached(engine, log_path=log_path) as facade:  # close validates the log (the spec)
        run_plans(facade, todo)
        checker.references([(list(p.succ), 24) for p in todo])
        for p in todo:
            verdict = checker.verify(facade, p.scope)
            assert verdict.ok, (mode, p.scope, verdict.problems)
            expected = identity.expected_adopted_blocks(p.pred, p.succ, BS)
            assert verdict.adopted_blocks == expected == verdict.expected_adopted_blocks, p.scope

    log = read_log(log_path)
    window = draft_window(log)
    assert window["tentative_completions"], window  # drafts completed blocks only tentatively
    assert window["rolled_back_at_close"], window  # a refused commit's writers closed over drafts
    tentative = {ln["page"] for ln in log if ln["transition"] == "write_draft" and ln["completes"]}
    verified = [ln for ln in log if ln["transition"] == "verify_drafts"]
    if mode == "spec_rejecting":  # a tentatively complete block rolled back by the rejection
        assert any(v["page"] in tentative and not v["completes"] for v in verified)
    else:  # blocks completed by verified drafts, their writers closed full
        completed = {v["page"] for v in verified if v["completes"]}
        closed_full = {
            ln["page"] for ln in log if ln["transition"] == "close_writer" and ln["full"]
        }
        assert completed & closed_full, window
