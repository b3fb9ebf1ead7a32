"""The HTTP arms' policies (``retire_bench.arms``) against a scripted fake ``openai`` client.

The fake server produces a token only when the test says so, so every check is about what an
arm does -- closes, waits, stops reading, sends in order, filters -- and none about timing. Marked
``vllm`` because the arms need the ``openai`` package, which comes with the vLLM environment.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

pytestmark = pytest.mark.vllm


class FakeStream:
    def __init__(self, scope: str | None, version: int) -> None:
        self.scope, self.version = scope, version
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        self.closed = False
        self.response = SimpleNamespace(headers={"x-retire-version": str(version)})

    def emit(self, token: int, finish: str | None = None) -> None:
        extra = {"token_ids": [token]}
        choice = SimpleNamespace(model_extra=extra, finish_reason=finish)
        mark = {"retire": {"scope": self.scope, "version": self.version}} if self.scope else {}
        self.queue.put_nowait(SimpleNamespace(choices=[choice], model_extra=mark))
        if finish is not None:
            self.queue.put_nowait(None)

    async def close(self) -> None:
        self.closed = True
        self.queue.put_nowait(None)

    def __aiter__(self) -> Any:
        return self._gen()

    async def _gen(self) -> Any:
        while True:
            item = await self.queue.get()
            if item is None or self.closed:
                return
            yield item


class FakeClient:
    """``client.completions.create`` of a server that numbers a scope's versions on arrival."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.streams: list[FakeStream] = []
        self.versions: dict[str, int] = {}
        self.completions = self
        self.base_url = "http://fake/v1"
        self.gate: asyncio.Event | None = None  # set: headers are held until it is set

    async def create(self, **kw: Any) -> FakeStream:
        self.sent.append(kw)
        if self.gate is not None:
            await self.gate.wait()
        scope = kw["extra_body"].get("vllm_xargs", {}).get("retire_scope")
        version = 0
        if scope is not None:
            version = self.versions[scope] = self.versions.get(scope, -1) + 1
        s = FakeStream(scope, version)
        self.streams.append(s)
        return s


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


def make(arm_name: str) -> tuple[Any, FakeClient]:
    from retire_bench.arms import HTTP_ARMS, App

    client = FakeClient()
    app = App(client, "m", cache_salt="salt", prefix="t-")  # type: ignore[arg-type]
    return HTTP_ARMS[arm_name](app), client


def test_http_abort_closes_the_old_stream_and_what_was_queued_still_reaches_the_app() -> None:
    async def run() -> None:
        arm, client = make("http_abort")
        await arm.submit("a", 0, [1, 2], 8)
        old = client.streams[0]
        for t in (5, 6, 7):
            old.emit(t)
        await settle()
        await arm.revise("a", 1, [1, 3], 8)
        assert old.closed  # the disconnect is how vLLM learns of the revision
        assert len(client.sent) == 2
        assert client.sent[0]["extra_body"]["cache_salt"] == "salt"
        got = arm.app.take("a")
        assert [(c.version, c.token_ids) for c in got] == [(0, (5,)), (0, (6,)), (0, (7,))]
        assert all(arm.admit(c) for c in got)  # the application shows them: stale tokens

    asyncio.run(run())


def test_stop_reading_leaves_the_old_stream_open_and_drops_its_chunks() -> None:
    async def run() -> None:
        arm, client = make("stop_reading")
        await arm.submit("a", 0, [1, 2], 8)
        old = client.streams[0]
        old.emit(5)
        await settle()
        await arm.revise("a", 1, [1, 3], 8)
        assert not old.closed and len(client.sent) == 2  # sent at once, the old one runs on
        old.emit(6)
        client.streams[1].emit(9)
        await settle()
        assert [(c.version, c.token_ids) for c in arm.app.take("a")] == [(1, (9,))]
        assert arm.app.streams[("a", 0)].tokens_after_retire == 1  # still computed and sent

    asyncio.run(run())


def test_let_run_queues_the_revision_behind_the_old_call() -> None:
    async def run() -> None:
        arm, client = make("let_run")
        first = asyncio.create_task(arm.submit("a", 0, [1, 2], 8))
        await settle()
        revision = asyncio.create_task(arm.revise("a", 1, [1, 3], 8))
        await settle()
        assert len(client.sent) == 1  # the revision waits for the old call
        old = client.streams[0]
        old.emit(5)
        old.emit(6, finish="length")
        await asyncio.gather(first)
        await settle()
        assert len(client.sent) == 2 and not old.closed
        client.streams[1].emit(9, finish="length")
        await revision
        got = [(c.version, c.token_ids) for c in arm.app.take("a")]
        assert got == [(0, (5,)), (0, (6,)), (1, (9,))]  # the old call's output is read too

    asyncio.run(run())


def test_retire_sends_scoped_requests_in_order_and_reads_through_scope_reader() -> None:
    async def run() -> None:
        arm, client = make("retire")
        await arm.submit("a", 0, [1, 2], 8)
        old = client.streams[0]
        old.emit(5)
        await settle()
        await arm.revise("a", 1, [1, 3], 8)
        assert [s["extra_body"]["vllm_xargs"]["retire_scope"] for s in client.sent] == ["t-a"] * 2
        assert "cache_salt" not in client.sent[0]["extra_body"]  # the server salts scopes
        assert not old.closed  # the server ends the old stream, not the client
        old.emit(6, finish="superseded")  # already on the wire when the revision was accepted
        client.streams[1].emit(9)
        await settle()
        shown = [(c.version, c.token_ids) for c in arm.app.take("a") if arm.admit(c)]
        assert shown == [(1, (9,))]  # the queued v0 chunks are older than the accepted v1
        assert not arm.app.problems

    asyncio.run(run())


def test_retire_sends_one_request_at_a_time_and_skips_a_revision_replaced_while_waiting() -> None:
    async def run() -> None:
        arm, client = make("retire")
        await arm.submit("a", 0, [1], 8)
        client.gate = asyncio.Event()  # the server has not accepted v1 yet
        tasks = [asyncio.create_task(arm.revise("a", 1, [1, 1], 8))]
        await settle()  # v1 is sent; v2 and v3 are decided while it waits
        tasks += [asyncio.create_task(arm.revise("a", v, [1, v], 8)) for v in (2, 3)]
        await settle()
        assert len(client.sent) == 2  # v1 is in flight; v2 and v3 wait for its acceptance
        client.gate.set()
        await asyncio.gather(*tasks)
        assert [s["prompt"] for s in client.sent] == [[1], [1, 1], [1, 3]]  # v2 never sent
        assert arm.app.streams[("a", 2)].sent_at is None
        assert arm.reader.current == {"t-a": (0, 2)}  # the server numbered the sent ones 0, 1, 2
        assert not arm.app.problems

    asyncio.run(run())


def test_every_arm_in_one_short_evaluation_against_real_servers(tmp_path: Any) -> None:
    """``replay --system all`` end to end on a 4-second trace at one time scale: two real
    servers, five arms, the JSON's keys, admission, and the policies' observable consequences
    (Retire: no old token read after a revision was accepted; stop-reading: nothing of an
    abandoned stream read). Keys and verdicts only: no timing is asserted."""
    import json
    import os
    import shutil
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    from retire_bench import curve
    from retire_bench.trace_sources import BurstyParams, generate_bursty
    from retire_bench.traces import dump_trace

    trace = generate_bursty(0, BurstyParams(duration_s=4.0, prompt_tokens=128, max_new_tokens=16))
    path = Path(tmp_path) / "short.jsonl"
    dump_trace(trace, path)
    out = Path(tmp_path) / "load.json"
    retire = str(Path(sys.executable).parent / "retire")
    short = tempfile.mkdtemp(prefix="rl")  # servers' socket paths must stay under 107 bytes
    env = {**os.environ, "TMPDIR": short}
    argv = [retire, "replay", str(path), "--system", "all", "--model-size", "tiny"]
    argv += ["--time-scales", "0.5", "--reps", "1", "--json", str(out), "--no-progress"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=900)
    finally:
        shutil.rmtree(short, ignore_errors=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    doc = json.loads(out.read_text())
    for key in curve.TOP_KEYS:
        assert key in doc
    assert list(doc["arms"]) == list(curve.ARMS)
    for arm, m in doc["arms"].items():
        for key in curve.ARM_KEYS:
            assert key in m, (arm, key)
        assert m["admitted"], (arm, m["admission"])
    assert doc["checker_admitted"] is True
    assert doc["operating_point"]["time_scale"] == 0.5
    assert [p["time_scale"] for p in doc["curve"]] == [0.5]
    assert set(doc["goodput_ratio_vs"]) == set(curve.ARMS) - {"retire"}
    assert doc["arms"]["retire"]["obsolete_tokens_after_accept"] == 0
    assert doc["arms"]["stop_reading"]["obsolete_tokens"] == 0
    assert doc["arms"]["let_run"]["final_versions_advanced"] >= 1


@pytest.mark.parametrize("arm_name", ["http_abort", "let_run", "stop_reading", "retire"])
def test_a_revision_right_after_its_submit_finds_the_submitted_version(arm_name: str) -> None:
    """A session revised before its submit's request went out (many-scope traces do that): the
    harness calls ``retiring`` at once, so the submitted stream must already be current."""

    async def run() -> None:
        arm, client = make(arm_name)
        submit = asyncio.create_task(arm.submit("a", 0, [1, 2], 8))
        old = arm.retiring("a")  # before the submit's task ran at all
        assert (old.version, old.retired_at is not None) == (0, True)
        revision = asyncio.create_task(arm.revise("a", 1, [1, 3], 8))
        await settle()
        assert arm.current["a"].version == 1
        ended: set[int] = set()
        for _ in range(3):  # let_run sends the revision only once the first call ended
            for stream in client.streams:
                if id(stream) not in ended:
                    stream.emit(4, "length")
                    ended.add(id(stream))
            await settle()
        await asyncio.wait_for(asyncio.gather(submit, revision), 5)
        await arm.app.drain(5)
        assert not arm.app.problems

    asyncio.run(run())
