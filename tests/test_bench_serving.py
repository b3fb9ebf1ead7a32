"""The serving benchmark's bookkeeping (no server): a trial without a phase is left out of that
phase's percentiles and counts, shows as ``None`` trial by trial, a load request's opening is
counted only for scoped requests, and the report's command line repeats the run with only the
options that run used."""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import time

import pytest

from retire_bench.accounts import tree_cpu_seconds
from retire_bench.serving import (
    REVISION_SEEDS,
    _command,
    _pct,
    _per_trial,
    _revision_summary,
    _summary,
    load_seed,
)

NAN = float("nan")


def test_a_phase_a_trial_did_not_have_is_left_out() -> None:
    revision = {
        "old_stream_closed": [0.010, NAN, 0.030],
        "old_version_finished_first": [NAN, 0.500, NAN],
        "revision_accepted": [0.020, 0.040, 0.060],
    }
    summary = _revision_summary(revision)
    assert summary["old_stream_closed"]["n"] == 2
    assert summary["old_stream_closed"]["p50"] == 30.0
    assert summary["old_version_finished_first"] == {"p50": 500.0, "p99": 500.0, "n": 1}
    assert summary["revision_accepted"]["p50"] == 40.0
    trials = _per_trial(revision)
    assert trials[1] == {
        "old_stream_closed": None,
        "old_version_finished_first": 500.0,
        "revision_accepted": 40.0,
    }
    assert math.isnan(_pct([NAN], 0.5)) and math.isnan(_pct([], 0.5))


def test_the_command_repeats_the_run() -> None:
    full = argparse.Namespace(
        clients=4,
        requests=8,
        rounds=2,
        trials=30,
        revisions_only=False,
        reader="raw",
        apart=True,
        model_size="small",
        json="x.json",
    )
    assert _command(full) == (
        "python -m retire_bench.serving --clients 4 --requests 8 --rounds 2 --trials 30 "
        "--reader raw --apart --model-size small"
    )
    only = argparse.Namespace(**{**vars(full), "revisions_only": True, "apart": False})
    assert _command(only) == (
        "python -m retire_bench.serving --trials 30 --revisions-only --model-size small"
    )


def test_no_load_prompt_is_sent_twice() -> None:
    """A prompt repeated in a later round would be a prefix cache hit for stock vLLM's server
    only (every Retire scope has its own cache salt): the two would not do the same work."""
    grid = [(r, k, i) for r in range(6) for k in range(8) for i in (0, 1, 998, 999)]
    seeds = [load_seed(*cell) for cell in grid]
    assert len(set(seeds)) == len(grid)
    trials = range(REVISION_SEEDS, REVISION_SEEDS + 2000)
    assert not set(seeds) & set(trials)
    with pytest.raises(ValueError):
        load_seed(0, 1000, 0)


def test_a_load_rounds_openings_are_those_of_its_scoped_requests() -> None:
    def round_of(ttft: list[float], opening: list[float], queue: list[float]) -> dict[str, object]:
        n = len(ttft)
        return {
            "ttft": ttft,
            "itl": [0.01] * n,
            "opening": opening,
            "opening_queue": queue,
            "tokens": 64 * n,
            "wall": 1.0,
            "cpu_seconds": {
                "api": 0.008 * n,
                "engine_core": 0.008 * n,
                "workers": 0.016 * n,
                "other": 0.0,
            },
        }

    scoped = _summary([round_of([0.100, 0.200, 0.300], [0.010, 0.020, 0.030], [0.004] * 3)])
    assert scoped["opening_p50_ms"] == pytest.approx(20.0)
    assert scoped["opening_queue_p50_ms"] == pytest.approx(4.0)
    assert scoped["ttft_after_opening_p50_ms"] == pytest.approx(180.0)
    stock = _summary([round_of([0.100, 0.200], [NAN, NAN], [NAN, NAN])])
    assert "opening_p50_ms" not in stock and stock["ttft_p50_ms"] == pytest.approx(200.0)
    assert stock["cpu_ms_per_token"] == pytest.approx(0.5)  # 32 ms of CPU per 64 tokens
    assert stock["cpu_ms_per_token_workers"] == pytest.approx(0.25)


def test_a_servers_cpu_time_counts_the_processes_under_it() -> None:
    """What a child process spent (the engine core, the workers) counts as the server's."""
    import psutil

    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        spinner = psutil.Process(child.pid)
        while sum(spinner.cpu_times()[:2]) < 0.3:  # it has spent more than its parent will
            time.sleep(0.05)
        own = sum(psutil.Process().cpu_times()[:2])
        spent = sum(spinner.cpu_times()[:2])
        spent_by_role = tree_cpu_seconds(os.getpid())
        assert spent_by_role["api"] >= own and spent_by_role["other"] >= spent
    finally:
        child.kill()
        child.wait()
