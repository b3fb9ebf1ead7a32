"""Rebuilds `agent_log_sample.jsonl`, the synthetic agent session log the trace tests import.

Only this one-off builder lives here; the importer is `retire_bench.traces.import_agent_log`.
The log is synthetic: its densest 120 s embeds the revision times of
`generate_bursty(7, paper_params())` as `turn_aborted` -> `task_started` pairs of three
sessions, surrounded by a sparse fourth session, a session that never revises, unrelated record
types, mixed timestamp styles (ISO-8601 with `Z`, with an offset, naive, and epoch seconds) and a
few records out of file order.
Run: `python tests/data/make_agent_log_sample.py` from the repository root.
"""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

from retire_bench.trace_sources import generate_bursty, paper_params
from retire_bench.traces import EventKind

BASE = datetime(2025, 3, 14, 9, 0, 0, tzinfo=UTC).timestamp()
DENSE_AT = 600.0  # seconds after BASE where the dense window's trace starts
SESSIONS = {"s0": "sess-a", "s1": "sess-b", "s2": "sess-c"}


def stamp(ts: float, style: int) -> str | float:
    if style == 0:
        return (
            datetime.fromtimestamp(ts, UTC)
            .isoformat(timespec="microseconds")
            .replace("+00:00", "Z")
        )
    if style == 1:
        tz = timezone(timedelta(hours=1))
        return datetime.fromtimestamp(ts, tz).isoformat(timespec="microseconds")
    if style == 2:
        return (
            datetime.fromtimestamp(ts, UTC).replace(tzinfo=None).isoformat(timespec="microseconds")
        )
    return round(ts, 6)


def main() -> None:
    rng = random.Random(7)
    records: list[tuple[float, dict[str, object]]] = []

    def add(ts: float, session: str, kind: str, key: str = "session_id", **extra: object) -> None:
        records.append((ts, {key: session, "type": kind, **extra}))

    # Dense sessions: submitted long before the window, one early transition, then the bursts.
    for i, session in enumerate(SESSIONS.values()):
        add(10.0 + i, session, "task_started")
        add(12.0 + i, session, "tool_call", tool="shell")
    add(300.0, "sess-a", "turn_aborted", reason="user_interrupt")
    add(300.4, "sess-a", "task_started")
    trace = generate_bursty(7, paper_params())
    last_start = {session: 0.0 for session in SESSIONS.values()}
    for event in trace.events:
        if event.kind is EventKind.REVISION:
            ts = DENSE_AT + event.t
            session = SESSIONS[event.scope]
            # The abort lands between the session's previous task start and this one.
            aborted_at = ts - min(0.05, (ts - last_start[session]) / 2)
            last_start[session] = ts
            reason = rng.choice(["user_interrupt", "tool_error"])
            add(aborted_at, session, "turn_aborted", reason=reason)
            add(ts, session, "task_started")
            if rng.random() < 0.3:
                add(ts + 0.01, session, "agent_message")
    # Sparse session (uses "scope" instead of "session_id"), with a doubled abort.
    add(50.0, "sess-d", "task_started", key="scope")
    for ts in (900.0, 1500.0):
        add(ts - 2.0, "sess-d", "turn_aborted", key="scope")
        add(ts - 1.0, "sess-d", "turn_aborted", key="scope")
        add(ts, "sess-d", "task_started", key="scope")
    add(1600.0, "sess-d", "task_complete", key="scope")
    # A session that never revises; its early abort precedes any task and is ignored.
    add(20.0, "sess-e", "turn_aborted")
    add(25.0, "sess-e", "task_started")
    add(30.0, "sess-e", "task_started")
    add(40.0, "sess-e", "task_complete")
    records.sort(key=lambda item: item[0])
    lines = []
    for n, (ts, rec) in enumerate(records):
        lines.append(json.dumps({"timestamp": stamp(BASE + ts, n % 4), **rec}))
    # A few records out of file order: the importer sorts by timestamp.
    for n in (5, 17, 40):
        lines[n], lines[n + 1] = lines[n + 1], lines[n]
    Path(__file__).with_name("agent_log_sample.jsonl").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
