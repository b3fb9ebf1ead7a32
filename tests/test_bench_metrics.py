"""Replay metrics on synthetic records (no vLLM): what counts as obsolete, live, advanced."""

from __future__ import annotations

import json
import pickle
from typing import TYPE_CHECKING

import pytest

from retire_bench import metrics as M
from retire_bench.reference import Admission, admit
from retire_bench.replay import SYSTEM_KEYS, TOP_KEYS, ReplayConfig, RunResult, results_json
from retire_bench.replay_table import table
from retire_bench.traces import DEFAULT_TRACE_PATH, load_trace
from retire_vllm.api import Delivery
from tests.helpers import recorded_core_run

if TYPE_CHECKING:
    from pathlib import Path


def d(scope: str, version: int, n: int, finished: bool = False, first: int = 1) -> Delivery:
    return Delivery(scope, version, tuple(range(first, first + n)), finished, 0.0)


def run(reads: list[tuple[Delivery, float]], end: float = 10.0) -> M.RunRecord:
    """Scope a: v0 from 0 to 2 (closed 2.5), v1 final from 2; scope b: v0 final, never revised."""
    versions = (
        M.VersionSpan("a", 0, 0.0, retired_at=2.0, closed_at=2.5),
        M.VersionSpan("a", 1, 2.0, final=True),
        M.VersionSpan("b", 0, 0.0, final=True),
    )
    return M.RunRecord(
        "x", 0.0, end, tuple(M.Read(dv, at) for dv, at in reads), versions, cleanup_limit_s=5.0
    )


CLEAN = [
    (d("a", 0, 3), 1.0),
    (d("a", 1, 4, first=10), 2.4),
    (d("a", 1, 2, True, first=14), 3.0),
    (d("b", 0, 5, True), 1.5),
]


def test_clean_run_counts_nothing_obsolete() -> None:
    m = M.compute(run(CLEAN))
    assert m["obsolete_tokens"] == 0
    assert m["current_tokens"] == 14
    assert m["final_versions_advanced"] == m["final_versions_total"] == 2
    assert m["final_versions_completed"] == 2
    assert m["ttft_final_ms_median"] == pytest.approx((400.0 + 1500.0) / 2)
    # the window ends at the last final's finishing read (3.0 s)
    assert m["goodput_tok_s"] == pytest.approx(14 / 3.0)
    assert m["cleanup_ms_median"] == pytest.approx(500.0)
    assert M.retire_target_misses(m) == []


def test_stale_delivery_is_counted_and_fails_the_retire_targets() -> None:
    # the predecessor's merged frame reaches the consumer 0.1 s after the revision
    m = M.compute(run([*CLEAN, (d("a", 0, 7, True, first=4), 2.1)]))
    assert m["obsolete_tokens"] == 7 and m["obsolete_frames"] == 1
    assert m["current_tokens"] == 14  # an obsolete read is never goodput
    misses = M.retire_target_misses(m)
    assert misses and "obsolete" in misses[0]


def test_delivery_at_the_revision_instant_is_obsolete() -> None:
    m = M.compute(run([*CLEAN, (d("a", 0, 1, first=4), 2.0)]))
    assert m["obsolete_tokens"] == 1


def test_read_of_unknown_version_is_invalid() -> None:
    rec = run([*CLEAN, (d("a", 5, 2), 4.0), (d("b", 0, 1), -1.0)])
    m = M.compute(rec)
    assert m["invalid_reads"] == 2
    assert M.retire_target_misses(m)
    assert any("unknown" in p for p in M.output_problems(rec, {}))


def test_final_without_current_tokens_is_not_advanced() -> None:
    reads = [(d("a", 0, 3), 1.0), (d("b", 0, 5, True), 1.5), (d("a", 1, 0), 2.5)]
    m = M.compute(run(reads))
    assert m["final_versions_advanced"] == 1
    assert m["goodput_window_s"] == 10.0  # a final never finished: the window is the whole run
    assert M.retire_target_misses(m)


def test_live_obsolete_series_and_cleanup_with_unclosed_version() -> None:
    versions = (
        M.VersionSpan("a", 0, 0.0, retired_at=1.0, closed_at=3.0),
        M.VersionSpan("a", 1, 1.0, retired_at=2.0, closed_at=2.0),  # closed at once: never live
        M.VersionSpan("a", 2, 2.0, retired_at=4.0),  # never closed
        M.VersionSpan("a", 3, 4.0, final=True),
        M.VersionSpan("b", 0, 0.0, retired_at=1.5, closed_at=5.0),
        M.VersionSpan("b", 1, 1.5, final=True),
    )
    rec = M.RunRecord("x", 0.0, 10.0, (), versions, cleanup_limit_s=3.0)
    series = M.live_obsolete_series(rec)
    assert series[0] == (0.0, 0)
    assert max(c for _, c in series) == 2
    m = M.compute(rec)
    assert m["peak_live_obsolete"] == 2
    # live: a0 1-3, b0 1.5-5, a2 4-10 -> 2 + 3.5 + 6 = 11.5 execution-seconds over 10 s
    assert m["mean_live_obsolete"] == pytest.approx(1.15)
    lat, unclosed = M.cleanup_latencies(rec)
    assert unclosed == 1 and m["cleanup_unclosed"] == 1
    assert sorted(lat) == pytest.approx([0.0, 2.0, 3.0, 3.5])  # unclosed: capped at the limit


def test_output_check_against_reference() -> None:
    rec = run(CLEAN)
    ref = {("a", 0): (1, 2, 3, 4), ("a", 1): tuple(range(10, 16)), ("b", 0): (1, 2, 3, 4, 5)}
    assert M.output_problems(rec, ref) == []
    bad = dict(ref)
    bad[("a", 1)] = (10, 11, 99, 13, 14, 15)
    assert any("differs" in p for p in M.output_problems(rec, bad))
    short = dict(ref)
    short[("b", 0)] = (1, 2, 3, 4, 5, 6)
    assert any("finished after" in p for p in M.output_problems(rec, short))
    after = run([*CLEAN, (d("b", 0, 1, first=6), 4.0)])
    assert any("after its finishing frame" in p for p in M.output_problems(after, ref))
    assert not admit(run(CLEAN), bad).admitted
    assert admit(run(CLEAN), ref).admitted
    assert not admit(run(CLEAN), ref, close_error="leak").admitted
    assert not admit(run(CLEAN), ref, needs_facade_verdict=True).admitted


def test_percentile_matches_numpy_linear() -> None:
    assert M.percentile([], 50) is None
    assert M.percentile([3.0], 99) == 3.0
    assert M.percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert M.percentile(list(range(101)), 99) == pytest.approx(99.0)


def _result(system: str, reads: list[tuple[Delivery, float]]) -> RunResult:
    rec = run(reads)
    return RunResult(
        system,
        rec,
        M.compute(rec),
        Admission(True, (), "harness"),
        (1.0, 2.0, 3.0),
        0.001,
        0.0005,
        10,
        0.004,
        0.0,
        (0.5, 0.6),
        (0.3, 30.0),
        5 if system != "retire" else None,
        (),
    )


def test_results_json_schema_is_stable() -> None:
    trace = load_trace(DEFAULT_TRACE_PATH)
    results = {
        "native": [_result("native", [*CLEAN, (d("a", 0, 7, True, first=4), 2.1)])] * 2,
        "native_stop_reading": [_result("native_stop_reading", CLEAN)],
        "retire": [_result("retire", CLEAN), _result("retire", CLEAN)],
    }
    doc = results_json(trace, ReplayConfig(), results)
    assert set(TOP_KEYS) | set(results) == set(doc)
    for name in results:
        assert set(doc[name]) == set(SYSTEM_KEYS) | {
            "obsolete_frames",
            "invalid_reads",
            "steps",
            "retire_core_s",
            "retire_core_events",
            "retire_core_share_of_run",
        }
    for key in (
        "obsolete_tokens",
        "peak_live_obsolete",
        "cleanup_ms_median",
        "cleanup_ms_p99",
        "final_versions_advanced",
        "final_versions_total",
        "goodput_tok_s",
        "ttft_final_ms_median",
    ):
        assert key in doc["native"] and key in doc["retire"]
    assert doc["native"]["obsolete_tokens"] == 7 and doc["retire"]["obsolete_tokens"] == 0
    assert doc["goodput_ratio"] == pytest.approx(
        doc["retire"]["goodput_tok_s"] / doc["native"]["goodput_tok_s"]
    )
    assert doc["checker_admitted"] is True
    assert doc["retire"]["retire_core_share_of_step"] == pytest.approx(0.0005 / 0.006)
    json.dumps(doc)  # JSON-ready
    assert "obsolete tokens published" in table(doc)
    assert doc["native"]["contended_runs"] == 2 and doc["retire"]["contended_runs"] == 2


def test_results_json_reports_the_warm_replay_only_when_every_run_has_one() -> None:
    import attrs

    trace = load_trace(DEFAULT_TRACE_PATH)
    warm = attrs.evolve(_result("retire", CLEAN), core_warm_in_step_s=0.0002)
    doc = results_json(trace, ReplayConfig(), {"retire": [warm, warm]})
    assert doc["retire"]["retire_core_share_of_step_warm"] == pytest.approx(0.0002 / 0.006)
    assert doc["retire"]["retire_core_us_per_step_warm"] == pytest.approx(0.0002 / 3 * 1e6)
    assert "same core calls replayed warm" in table(doc)
    doc = results_json(trace, ReplayConfig(), {"retire": [warm, _result("retire", CLEAN)]})
    assert doc["retire"]["retire_core_share_of_step_warm"] is None


def test_aggregate_takes_the_worst_run_for_safety_counts() -> None:
    a = M.compute(run(CLEAN))
    b = M.compute(run([*CLEAN, (d("a", 0, 7, True, first=4), 2.1)]))
    agg = M.aggregate([a, b], [run(CLEAN), run(CLEAN)])
    assert agg["obsolete_tokens"] == 7
    assert agg["final_versions_advanced"] == 2
    assert agg["runs"] == 2


def test_core_overhead_driver_adopts_and_measures() -> None:
    from retire_bench import overhead

    doc = overhead.summary(None, quick=True)
    small = doc["core"][0]
    assert small["events"] > 1000 and small["events_per_s"] > 0
    assert "events/s" in overhead.table(doc)
    assert [r["blocks"] for r in doc["revision"]] == [32, 512]
    assert all(
        r["total_ms"] > 0 and r["shared_blocks"] == r["blocks"] // 2 for r in doc["revision"]
    )
    assert "one revision of a scope holding  512 blocks" in overhead.table(doc)
    # with the log on, a line per operation (certify, unhold, free, adopt ...), not per page
    assert all(r["logged_ms"] > 0 for r in doc["revision"])
    assert (
        len({r["log_lines"] for r in doc["revision"]}) == 1 and doc["revision"][0]["log_lines"] < 20
    )
    assert set(doc["revision_ms"]) == {"32", "512"} and doc["revision_ratio_2048_over_32"] is None


def test_revision_targets_judge_the_ratio_and_the_512_block_figure() -> None:
    from retire_bench.overhead import revision_targets

    def rows(ms: dict[int, float]) -> list[dict[str, float]]:
        return [{"blocks": n, "total_ms": v} for n, v in ms.items()]

    flat = revision_targets(rows({32: 0.5, 512: 0.6, 2048: 0.9}))
    assert flat["revision_ratio_2048_over_32"] == 1.8
    assert flat["revision_targets_met"] == {"ratio": True, "512_blocks": True}
    per_page = revision_targets(rows({32: 0.5, 512: 3.6, 2048: 14.0}))
    assert per_page["revision_targets_met"] == {"ratio": False, "512_blocks": False}


def test_core_timer_counts_vllm_request_api_inside_steps_apart() -> None:
    """vLLM's add/abort work that a harness step calls outside ``LLMEngine.step`` is counted
    as ``engine_api_s`` (engine work, not integration glue); inside ``LLMEngine.step`` it is
    already engine time, and outside steps it is not step time at all."""

    from retire_bench.systems import CoreTimer

    now = [0.0]

    def clock() -> float:
        return now[0]

    class Engine:
        def add_request(self, cost: float) -> None:
            now[0] += cost

        def abort_request(self, cost: float) -> None:
            now[0] += cost

        def step(self) -> None:
            now[0] += 1.0
            self.abort_request(0.5)  # vLLM's own abort inside its step: engine time already

    class System:
        def __init__(self) -> None:
            self.engine = Engine()

    system = System()
    timer = CoreTimer(system, clock)
    system.engine.add_request(0.25)  # a submit between steps
    timer.stepping(True)
    system.engine.add_request(0.125)  # the facade admitting a successor inside its step()
    system.engine.step()
    system.engine.abort_request(0.0625)  # a fence deferred to the step boundary
    timer.stepping(False)
    assert timer.engine_s == 1.5
    assert timer.engine_api_s == 0.1875


def test_core_timer_replays_the_recorded_calls_warm() -> None:
    """The warm replay reruns every recorded call from the run's initial state (those outside
    steps too) and times only the in-step ones; each call must give the recorded commands."""
    timer = recorded_core_run()
    assert timer.calls is not None
    assert [(batch, len(events), step) for batch, events, step, _ in timer.calls] == [
        (False, 1, 0),
        (False, 1, 0),
        (True, 2, 1),
        (False, 1, 1),
        (True, 1, 1),
        (False, 1, 0),
    ]
    assert timer.in_step_s == 4.0  # three recorded calls and the refused one
    # fake clock: 1 per call, three in-step calls per pass, best of two passes
    assert timer.warm_replay(reps=2) == 3.0


def test_core_timer_warm_replay_refuses_a_diverging_replay() -> None:
    """Mutant: a recorded call whose commands the replay does not reproduce (here: a publish
    recorded as a drop) makes the figure meaningless, so the replay raises."""
    import retire_core as rc

    timer = recorded_core_run()
    assert timer.calls is not None
    batch, events, step, commands = timer.calls[4]
    (publish,) = commands
    assert isinstance(publish, rc.Publish)
    drop = rc.Drop(publish.frame, publish.scope, publish.version, publish.kind, "retired_version")
    timer.calls[4] = (batch, events, step, [drop])
    with pytest.raises(RuntimeError, match="diverged at core call 4"):
        timer.warm_replay(reps=1)


def test_replay_core_calls_runs_between_after_each_steps_first_call() -> None:
    """``between(step)`` (where ``interleave`` runs a forward pass) comes once per step, right
    after that step's first core call, as the model runs after ``after_schedule`` in a real step;
    calls outside steps are replayed but neither timed nor followed by it."""
    import retire_core as rc
    from retire_bench.systems import replay_core_calls

    timer = recorded_core_run()
    assert timer.calls is not None
    # a second step: one more in-step call after the first step's, then the closing Cancel
    *calls, cancel = timer.calls
    commit = rc.FrameArrived("s", 0, 9, rc.FrameKind.COMMIT)
    calls.append((True, (commit,), 2, [rc.Publish(9, "s", 0, rc.FrameKind.COMMIT)]))
    calls.append(cancel)
    log: list[str] = []

    def clock() -> float:
        log.append("t")
        return float(len(log))

    spent = replay_core_calls(timer._initial, calls, clock, lambda step: log.append(f"step{step}"))
    marks = "".join(log).replace("tt", "c")  # each call reads the clock twice
    assert marks == "cc" + "cstep1" + "cc" + "cstep2" + "c"
    assert spent == 4.0  # the four in-step calls, 1 each on this clock


def test_core_timer_saves_calls_that_replay_alike(tmp_path: Path) -> None:
    """``save_calls`` / ``load_core_calls`` round-trip the recorded calls and initial state: the
    loaded calls replay without diverging; a file of another kind is refused."""
    from retire_bench.systems import load_core_calls, replay_core_calls

    timer = recorded_core_run()
    path = tmp_path / "calls.pkl"
    timer.save_calls(path)
    initial, calls = load_core_calls(path)
    assert calls == timer.calls
    replay_core_calls(initial, calls)  # raises RuntimeError if any call's commands differ
    other = tmp_path / "other.pkl"
    other.write_bytes(pickle.dumps({"format": 0}))
    with pytest.raises(ValueError, match="not a core-calls file"):
        load_core_calls(other)


def test_core_timer_without_recording_has_no_replay() -> None:

    from retire_bench.systems import CoreTimer

    class System:
        pass

    timer = CoreTimer(System())
    assert timer.calls is None
    with pytest.raises(ValueError, match="record=True"):
        timer.warm_replay()


def test_core_timer_stops_recording_a_run_longer_than_its_limit() -> None:
    """A long trace must not keep every core call in memory: past ``record_limit`` calls the
    recording is dropped (no warm figure) and the timing goes on."""
    import retire_core as rc
    from retire_bench.systems import CoreTimer, quiet_logger

    class System:
        def __init__(self) -> None:
            self.retire = rc.Retire(logger=quiet_logger())

    system = System()
    timer = CoreTimer(system, record=True, record_limit=2)
    system.retire.handle(rc.Submit("s", "t", "fp", ("a",)))
    system.retire.handle(rc.ParticipantStarted("s", 0, "q"))
    assert timer.calls is not None and len(timer.calls) == 2
    system.retire.handle(rc.FrameArrived("s", 0, 1, rc.FrameKind.TOKEN))
    assert timer.calls is None and timer.events == 3
    with pytest.raises(ValueError, match="record_limit"):
        timer.warm_replay()
