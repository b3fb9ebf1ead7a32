"""The benchmarks on the real (tiny, CPU) vLLM engine: native stale path, short replay, handoff.

Kept short: a 4-second bursty trace with 128-token prompts, one run per system, and a two-point
handoff grid. The Retire arm needs ``retire_vllm.facade`` (issue 4).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def short_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from retire_bench.trace_sources import BurstyParams, generate_bursty
    from retire_bench.traces import dump_trace

    trace = generate_bursty(0, BurstyParams(duration_s=4.0, prompt_tokens=128, max_new_tokens=16))
    path = tmp_path_factory.mktemp("trace") / "short.jsonl"
    dump_trace(trace, path)
    return path


def test_native_abort_delivers_predecessor_tokens_to_a_slow_consumer() -> None:
    """vLLM's own collector and abort output carry unread predecessor tokens past the abort."""
    from retire_bench import metrics as M
    from retire_bench.native import NativeAbortResubmit, NativeStopReading
    from retire_core import Contract

    prompt = [(7 * i) % 2000 + 1 for i in range(100)]
    revised = [(11 * i) % 2000 + 1 for i in range(100)]
    for cls, expect_stale in ((NativeAbortResubmit, True), (NativeStopReading, False)):
        eng = cls(num_blocks=64)
        t0 = eng._clock()
        eng.submit("a", prompt, Contract(), 40)
        for _ in range(3):
            eng.step()
        reads = [M.Read(x, eng._clock()) for x in eng.consume("a")]
        for _ in range(5):  # the consumer is busy; the engine keeps producing
            eng.step()
        t_rev = eng._clock()
        eng.supersede("a", revised, Contract(), 8)
        reads += [M.Read(x, eng._clock()) for x in eng.consume("a")]
        while eng.has_unfinished():
            eng.step()
        reads += [M.Read(x, eng._clock()) for x in eng.consume("a")]
        rec = M.RunRecord(
            cls.system,
            t0,
            eng._clock(),
            tuple(reads),
            (
                M.VersionSpan("a", 0, t0, retired_at=t_rev),
                M.VersionSpan("a", 1, t_rev, final=True),
            ),
        )
        m = M.compute(rec)
        old = eng.version_record("a", 0)
        if expect_stale:
            assert m["obsolete_tokens"] == 5  # the five unread steps, merged into one frame
            assert old.tokens_after_retire == 0  # abort stopped the computation itself
        else:
            assert m["obsolete_tokens"] == 0  # nobody reads the old stream...
            assert old.tokens_after_retire == 40 - 8  # ...but it runs to completion
        assert m["final_versions_advanced"] == 1
        eng.close()


def test_short_replay_both_systems(short_trace: Path, tmp_path: Path) -> None:
    from retire_bench import replay as R
    from retire_bench.systems import facade_available

    assert facade_available(), "retire_vllm.facade (issue 4) is needed for the Retire arm"
    trace, _ = R.load(short_trace)
    # Twice the trace's time scale: a final version must get its first token before the next
    # burst revises it, and a loaded CI machine should not be able to take that away.
    calls_path = tmp_path / "calls.pkl"
    cfg = R.ReplayConfig(
        reps=1,
        time_scale=2.0,
        consumer_delay_s=0.1,
        engine_overrides={"num_blocks": 256},
        core_calls_path=calls_path,
    )
    doc, results = R.replay(trace, ["native", "native_stop_reading", "retire"], cfg)
    retire = doc["retire"]
    assert retire["obsolete_tokens"] == 0, retire["per_run"]
    assert retire["final_versions_advanced"] == retire["final_versions_total"] == 9
    assert retire["admitted"], retire["admission"]
    assert doc["native"]["admitted"] and doc["native_stop_reading"]["admitted"]
    assert doc["native"]["final_versions_total"] == 9
    assert doc["checker_admitted"] is True
    assert set(R.TOP_KEYS) <= set(doc) and set(R.SYSTEM_KEYS) <= set(doc["native"])
    assert doc["goodput_ratio"] is not None
    # the run's in-step core calls replayed warm gave back the very commands of the run
    assert retire["retire_core_us_per_step_warm"] is not None
    # ... and so do the calls written for retire_bench.interleave (only the Retire arm has any)
    from retire_bench.systems import load_core_calls, replay_core_calls

    initial, calls = load_core_calls(calls_path)
    assert any(step for _, _, step, _ in calls)
    assert replay_core_calls(initial, calls) > 0.0
    json.dumps(doc)
    from retire_bench import plots

    written = plots.replay_plots(results, tmp_path)
    assert written and written[0].stat().st_size > 1000


def test_handoff_two_pressure_points() -> None:
    from retire_bench import handoff
    from retire_bench.systems import facade_available

    assert facade_available(), "retire_vllm.facade (issue 4) is needed for the Retire arm"
    grid = handoff.Grid(
        prompt_tokens=(256,), prefix_fractions=(0.9,), pressures=(0.0, 1.0), trials=2
    )
    doc = handoff.run_grid(grid, ["native", "retire"], progress=False)
    assert doc["all_outputs_match"]
    assert len(doc["cells"]) == 2 * 2 * 2  # systems x pressures x trials
    # every trial runs its own prompts, so no trial finds another's prefix in the cache
    from retire_vllm.default_model import VOCAB_SIZE

    first, second = (handoff._prompts(grid, 256, 0.9, 0.0, t, VOCAB_SIZE) for t in (0, 1))
    assert first["P"][:32] != second["P"][:32] and first["co"] == second["co"] == []
    points = {(p["system"], p["pressure"]): p for p in doc["points"]}
    assert {p["trials"] for p in points.values()} == {2}
    reusable = points[("native", 0.0)]["certifiable_tokens"]
    assert reusable == 224
    every = {"median": reusable, "min": reusable, "max": reusable}
    assert points[("native", 0.0)]["reused_tokens"] == every
    none = {"median": 0, "min": 0, "max": 0}
    assert points[("native", 1.0)]["reused_tokens"] == none  # evicted between abort and resubmit
    assert points[("retire", 1.0)]["reused_tokens"] == every  # pinned until adopted
    assert "median of 2 trials per cell" in handoff.table(doc)
    assert all(c["close_error"] is None for c in doc["cells"])
    assert all(c["checker_ok"] for c in doc["cells"] if c["system"] == "retire")
    assert doc["checker_admitted"]


def test_a_pause_of_a_version_that_already_finished_changes_nothing() -> None:
    """A trace may pause a scope whose version has run to its end (and been read): Retire's
    facade then refuses the pause (``IllegalTransitionError`` in state ``finished``: nothing
    runs that could be paused), and the replay treats it as what it is in every system, a
    pause of nothing; the run, the revision after it included, is still admitted."""
    from retire_bench import replay as R
    from retire_bench.traces import (
        Contract,
        EditContext,
        EventKind,
        FullContext,
        TokenSpec,
        Trace,
        TraceEvent,
    )

    events = [
        TraceEvent("s0", 0.0, EventKind.SUBMIT, FullContext(TokenSpec(7, 96)), 4, Contract()),
        TraceEvent("s0", 3.0, EventKind.PAUSE),  # 4 tokens of the tiny model take well under 1 s
        TraceEvent("s0", 3.2, EventKind.UNPAUSE),
        TraceEvent("s0", 3.4, EventKind.REVISION, EditContext(64, TokenSpec(8, 32)), 4, Contract()),
    ]
    cfg = R.ReplayConfig(reps=1, engine_overrides={"num_blocks": 64})
    doc, _ = R.replay(Trace("pause-after-finish", events), ["retire"], cfg)
    retire = doc["retire"]
    assert retire["admitted"], retire["admission"]
    assert retire["final_versions_advanced"] == retire["final_versions_total"] == 1
