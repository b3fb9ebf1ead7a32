"""``retire campaign --faults tp_worker_killed``: one trial, and a seeded facade bug it fails on.

The trial runs each phase in a process of its own (``benchmarks/campaign_tp.py``): a TP=2 engine
whose rank-1 worker process is SIGKILLed mid-fence, then a fresh TP=2 engine for the repair. The
seeded bug (``receipt_for_dead_rank``) runs only the killed phase: the trial stops there.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest

from retire_bench import campaign_tp
from retire_cli import main

pytestmark = pytest.mark.vllm


def _run(tmp_path: Path, seed: int) -> tuple[int, dict[str, Any], dict[str, Any]]:
    report = tmp_path / "tp.json"
    argv = ["campaign", "--faults", "tp_worker_killed", "--trials", "1", "--seed", str(seed)]
    rc = main([*argv, "--json", str(report)])
    doc = json.loads(report.read_text())
    (trial,) = doc["trial_details"]
    print(f"\n[tp_worker_killed] {doc['faults']}: {json.dumps(trial['details'])[:3000]}")
    return rc, doc, trial


def test_a_rank_killed_mid_fence_fails_closed_and_a_new_engine_serves_cold(
    tmp_path: Path,
) -> None:
    rc, doc, trial = _run(tmp_path, seed=0)
    assert trial["error"] is None, trial
    assert doc["faults"]["tp_worker_killed"] == {
        "injected": 1,
        "detected": 1,
        "repaired": 1,
        "wrong_output": 0,
    }, trial
    assert rc == 0 and doc["passed"]
    d = trial["details"]
    assert d["rank_exitcode"] == -signal.SIGKILL
    assert d["error"].startswith("EngineDeadError")  # typed, and it came (no hang)
    assert d["fail_closed"] == {"at_death": True, "at_error": True, "after_probes": True}
    death = d["state_at_death"]
    assert death["rank_receipt_missing"] and death["v0_rank_receipts"] == []
    assert death["v0_pages_tracked_held"] == death["v0_pages"] != []
    assert death["successor_pages"] == death["v1_adopted"] == [] and not death["v1_admitted"]
    assert d["unread_v0_tokens"] > 0 and d["dropped_consumer_tokens"] >= d["unread_v0_tokens"]
    assert d["late_frame"] != "publish" and d["close"] == "EngineDeadError"
    assert d["core_log_lines"] > 0 and d["core_log_rejected"] is None
    repair = d["repair"]
    assert repair["cold"] and repair["tokens_match"] and repair["checker_ok"], repair
    assert repair["closed_clean"] and repair["core_log_validated"] > 0


def test_a_facade_that_counts_the_dead_rank_as_closed_fails_the_trial(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The seeded bug delivers the dead rank's receipt: the core drains the fenced version and
    frees its unshared pages without it. The death still surfaces typed, but the trial is not
    repaired and the command exits 1."""
    monkeypatch.setattr(campaign_tp, "SEEDED_BUG", "receipt_for_dead_rank")
    rc, doc, trial = _run(tmp_path, seed=0)
    totals = doc["faults"]["tp_worker_killed"]
    assert rc == 1 and not doc["passed"]
    assert totals["injected"] == 1 and totals["repaired"] == 0, trial
    d = trial["details"]
    assert d["fail_closed"]["at_death"] and not d["fail_closed"]["at_error"]
    assert d["repair"].startswith("skipped")
