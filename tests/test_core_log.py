"""``retire_vllm.corelog``: the path every real run's core log takes at close -- kept in memory,
written as JSON lines, validated against the spec -- accepts the core's own log and rejects a
reordered, truncated or altered one (the same ``finish`` the facade calls; no vLLM needed)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import retire_core as rc
from retire_checks.abstraction import Universe
from retire_checks.environment import apply_move
from retire_checks.lockstep import Lockstep
from retire_checks.scenario import BOUNDS, SCRIPT
from retire_vllm import corelog
from retire_vllm.corelog import CoreLog, TraceRejected


def scenario_log(path: Path) -> CoreLog:
    """The scripted revision chain (handoff, adoption, a digest fault, chain collapse), run
    through ``retire_core.Retire`` whose logger is a ``CoreLog``."""
    log = CoreLog(path)
    retire = rc.Retire(logger=log)

    def step(state: rc.CoreState, event: Any) -> rc.Step:
        retire.restore(state)
        commands = retire.handle(event)
        return rc.Step(retire.state, tuple(commands), retire.last_transitions)

    ls = Lockstep(Universe.of(BOUNDS), step_fn=step)
    for _, move in SCRIPT:
        apply_move(ls, move)
    return log


def test_the_cores_own_log_is_written_and_validated(tmp_path: Path) -> None:
    log = scenario_log(tmp_path / "core.jsonl")
    kept = [dict(r) for r in log.records]
    assert len(kept) > 20
    assert log.finish() == len(kept) == log.validated
    lines = [json.loads(line) for line in (tmp_path / "core.jsonl").read_text().splitlines()]
    assert [r["seq"] for r in lines] == list(range(1, len(kept) + 1))
    assert {r["event"] for r in lines} == {"retire.transition"}
    assert any(r["transition"] == "release" for r in lines)
    assert log.finished and log not in corelog.unfinished()


def test_a_second_log_appended_to_the_same_file_is_validated_alone(tmp_path: Path) -> None:
    path = tmp_path / "core.jsonl"
    first = scenario_log(path)
    n = first.finish()
    second = scenario_log(path)
    second.records[3], second.records[4] = second.records[4], second.records[3]
    with pytest.raises(TraceRejected) as err:
        second.finish()
    # the line number is the file's: past the first log's lines
    assert n < err.value.line <= 2 * n
    assert err.value.path == path


def test_a_reordered_log_is_rejected(tmp_path: Path) -> None:
    log = scenario_log(tmp_path / "core.jsonl")
    # a revision's transitions in the wrong order: its seq numbers no longer run in order
    log.records[5], log.records[6] = log.records[6], log.records[5]
    with pytest.raises(TraceRejected, match=r"core log rejected: .*core\.jsonl:6: seq jumps"):
        log.finish()


def test_a_reordered_log_renumbered_is_still_rejected(tmp_path: Path) -> None:
    log = scenario_log(tmp_path / "core.jsonl")
    # a participant's receipt moved earlier, before a write it attempted later: every seq in
    # order, but the spec does not let a participant that has finished attempt a write
    first_supersede = next(i for i, r in enumerate(log.records) if r["transition"] == "supersede")
    moved = next(i for i, r in enumerate(log.records) if r["transition"] == "receipt")
    record = log.records.pop(moved)
    log.records.insert(first_supersede, record)
    for seq, r in enumerate(log.records, 1):
        r["seq"] = seq
    with pytest.raises(TraceRejected) as err:
        log.finish()
    assert err.value.line > first_supersede + 1
    assert "the spec does not allow it here" in err.value.message


def test_a_lost_line_is_rejected(tmp_path: Path) -> None:
    log = scenario_log(tmp_path / "core.jsonl")
    del log.records[10]
    with pytest.raises(TraceRejected, match="seq jumps"):
        log.finish()


def test_an_altered_field_is_rejected(tmp_path: Path) -> None:
    log = scenario_log(tmp_path / "core.jsonl")
    publish = next(r for r in log.records if r["transition"] == "publish")
    publish["version"] = publish["version"] + 1  # a frame published for a version it is not
    with pytest.raises(TraceRejected):
        log.finish()


def test_an_empty_log_is_written_and_not_replayed(tmp_path: Path) -> None:
    log = CoreLog(tmp_path / "idle.jsonl")
    assert log.finish() == 0
    assert (tmp_path / "idle.jsonl").read_text() == ""
    with pytest.raises(RuntimeError, match="already finished"):
        log.finish()


def test_where_a_facades_log_goes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(corelog.LOG_DIR_ENV, str(tmp_path / "logs"))
    first = corelog.log_path_for(None, None)
    second = corelog.log_path_for(None, None)
    assert first is not None and second is not None and first != second
    assert first.parent == tmp_path / "logs" and first.parent.is_dir()
    assert corelog.log_path_for(tmp_path / "mine.jsonl", None) == tmp_path / "mine.jsonl"
    assert corelog.log_path_for(None, object()) is None  # the caller's own logger wins
    monkeypatch.delenv(corelog.LOG_DIR_ENV)
    assert corelog.log_path_for(None, None) is None


def test_the_suite_fixture_points_engines_at_a_log_directory(core_logs: Path) -> None:
    path = corelog.log_path_for(None, None)
    assert path is not None and path.parent == core_logs
