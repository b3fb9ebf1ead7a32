"""The pressure benchmark's bookkeeping (no server): per stream count each server's median over
its own rounds (wall time, CPU by process, Retire's hooks), the sums of finished streams,
preemptions and equal texts, Retire's median against stock's, and a round's console line."""

from __future__ import annotations

from typing import Any

import pytest

from retire_bench.pressure import _line, _summary


def _row(server: str, streams: int, wall: float, **extra: Any) -> dict[str, Any]:
    row = {"server": server, "streams": streams, "wall_s": wall, "rep": 0}
    cpu = {"api": 0.05, "engine_core": wall / 4, "workers": wall / 2, "other": 0.0}
    row.update({"finished": streams, "timed_out": 0, "preemptions": 0.0, "cpu_s": cpu})
    if server == "retire":
        row.update({"hooks_in_step_s": wall / 100, "steps": 100.0 * streams})
    row.update(extra)
    return row


def test_each_stream_count_takes_its_own_servers_rounds_and_their_medians() -> None:
    rows = [
        _row("stock", 3, 1.0, preemptions=2.0),
        _row("retire", 3, 4.0, same_text_as_stock=3, preemptions=None),  # metric unreadable
        _row("stock", 3, 3.0, finished=2, preemptions=1.0),
        _row("retire", 3, 2.0, same_text_as_stock=1, preemptions=4.0),
        _row("stock", 3, 2.0),
        _row("retire", 3, 9.0, same_text_as_stock=2),
        _row("stock", 5, 10.0),  # another stream count: in its own entry only
        _row("retire", 5, 5.0, same_text_as_stock=5),
    ]
    three, five = _summary(rows, [3, 5])
    assert three["stock"]["wall_s_median"] == 2.0 and three["retire"]["wall_s_median"] == 4.0
    assert three["stock"]["wall_s"] == [1.0, 3.0, 2.0]
    assert three["wall_ratio"] == pytest.approx(2.0)
    assert (three["stock"]["finished"], three["stock"]["of"]) == (8, 9)
    assert (three["stock"]["preemptions"], three["retire"]["preemptions"]) == (3.0, 4.0)
    assert three["retire"]["same_text_as_stock"] == 6
    assert three["stock"]["cpu_s_median"]["engine_core"] == pytest.approx(0.5)
    assert three["retire"]["cpu_s_median"]["workers"] == pytest.approx(2.0)
    assert three["retire"]["hooks_in_step_s_median"] == pytest.approx(0.04)
    assert three["retire"]["steps_median"] == 300.0
    assert five["wall_ratio"] == pytest.approx(0.5) and five["retire"]["of"] == 5


def test_a_rounds_line_names_what_retire_left_behind() -> None:
    stock = _row("stock", 5, 1.234, preemptions=None)
    assert _line(stock) == (
        "   stock 5 streams (rep 0): 5 finished, 0 timed out, 1.23 s, "
        "CPU s: engine core 0.31, workers 0.62, api 0.05; preemptions -"
    )
    retire = _row(
        "retire",
        5,
        2.0,
        finished=4,
        timed_out=1,
        preemptions=3.0,
        retained_blocks_after_clients=2,
        free_blocks_after_clients=20,
        free_blocks_after_cancel=23,
        same_text_as_stock=4,
    )
    assert _line(retire) == (
        "  retire 5 streams (rep 0): 4 finished, 1 timed out, 2.00 s, "
        "CPU s: engine core 0.50, workers 1.00, api 0.05; preemptions 3, "
        "retained after the clients 2 (free 20), free after cancel 23, "
        "same text as stock 4 of 5, hooks 20.0 ms in 500 steps"
    )
