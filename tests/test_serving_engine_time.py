"""The engine side's hooks: ``EngineTime``, its account of its own cost (``retire_engine_*`` on
/metrics), where a hook entered from inside another is counted once, in the outer one, whatever
it raises; a step counts from its schedule to its commit, oldest first when steps are scheduled
ahead; the core log's lines are written, as ``json_lines_logger`` would write them, when the
outermost hook returns; and the serving benchmark turns the counts into per-step figures."""

from __future__ import annotations

import io
import json
import threading
from enum import Enum

import pytest

from retire_bench.accounts import engine_share
from retire_vllm.corelog import (
    JsonLinesBuffer,
    NullLogger,
    encode,
    json_default,
    json_lines_logger,
)
from retire_vllm.serving.engine_side import _hook
from retire_vllm.serving.records import ENGINE_HOOKS, EngineTime


class _File(io.StringIO):
    """A log file that counts how often its buffer was handed on (made durable)."""

    durable = 0

    def flush(self) -> None:
        self.durable += 1
        super().flush()


class _Side:
    def __init__(self) -> None:
        self.engine_time = EngineTime()
        self.ran: list[str] = []
        self.written = _File()
        self.log = JsonLinesBuffer(self.written)
        self.running = 1  # requests the engine still runs
        self.lock = threading.RLock()
        self.early_tails: list[str] = []  # opens the ``open`` thread decided
        self.carried: list[tuple[str, bool, bool]] = []  # (tail, step scheduled, hook running)

    def carry_out_early(self, step_scheduled: bool) -> None:
        tails, self.early_tails = self.early_tails, []
        self.carried += [(t, step_scheduled, bool(self.ran)) for t in tails]

    def idle(self) -> bool:
        return not self.running

    @_hook("utility")
    def utility(self) -> None:
        self.log.info("retire.transition", seq=0, trigger="Submit")

    @_hook("commit")
    def outer(self, fail: bool = False) -> str:
        self.ran.append("outer")
        self.inner()
        if fail:
            raise RuntimeError("refused")
        return "done"

    @_hook("finished_outside")
    def inner(self) -> None:
        self.ran.append("inner")
        self.log.info("retire.transition", seq=len(self.ran), trigger="inner")
        self.seen_inside = self.written.getvalue()


def test_a_nested_hook_is_counted_once_in_the_outer_one() -> None:
    side = _Side()
    assert side.outer() == "done"
    hooks = side.engine_time.hooks
    assert side.ran == ["outer", "inner"]
    assert hooks["commit"] > 0 and hooks["finished_outside"] == 0
    side.inner()  # on its own it is counted where it says
    assert hooks["finished_outside"] > 0
    assert set(hooks) == set(ENGINE_HOOKS)


def test_a_hook_that_raises_is_counted_and_leaves_no_hook_open() -> None:
    side = _Side()
    with pytest.raises(RuntimeError):
        side.outer(fail=True)
    assert not side.engine_time.inside
    spent = side.engine_time.hooks["commit"]
    assert spent > 0
    side.inner()
    assert side.engine_time.hooks["finished_outside"] > 0  # not taken for a nested call


def test_log_lines_are_written_when_the_outermost_hook_returns() -> None:
    side = _Side()
    side.outer()
    assert side.seen_inside == ""  # the nested hook did not write
    line = '{"seq":2,"trigger":"inner","event":"retire.transition"}\n'
    assert side.written.getvalue() == line
    with pytest.raises(RuntimeError):
        side.outer(fail=True)  # a hook that raises still writes what it logged
    assert side.written.getvalue().count("\n") == 2 and side.log.pending == []
    assert side.written.durable == 0  # lines of steps wait in the file's buffer
    side.utility()  # a utility call's answer: its lines (and all before) are handed on
    assert side.written.durable == 1 and side.written.getvalue().count("\n") == 3


def test_a_hook_without_a_core_log_does_not_ask_whether_the_engine_went_idle() -> None:
    side = _Side()
    side.log = NullLogger()  # type: ignore[assignment]
    side.running = 0
    asked: list[bool] = []
    side.idle = lambda: asked.append(True) or True  # type: ignore[method-assign]
    side.outer()
    side.utility()
    assert asked == [] and side.written.durable == 0
    side.log = JsonLinesBuffer(side.written)
    side.outer()  # with a log, the commit asks (and the idle engine's lines are made durable)
    assert asked == [True] and side.written.durable == 1


def test_log_lines_are_made_durable_when_the_engine_goes_idle() -> None:
    side = _Side()
    side.outer()
    assert side.written.durable == 0  # a request still runs: the lines wait in the buffer
    side.running = 0
    side.outer()  # the commit that finished the last request: nothing more is coming
    assert side.written.durable == 1 and side.written.getvalue().count("\n") == 2
    side.inner()  # and so after a request finished from outside (vLLM's abort)
    assert side.written.durable == 2


class _Steps(_Side):
    @_hook("schedule", step_scheduled=True)
    def after_schedule(self) -> None:
        self.ran.append("after_schedule")

    @_hook("schedule", boundary=False)
    def allocating(self) -> None:
        self.ran.append("allocating")


def test_opens_decided_off_the_loop_are_carried_out_first_at_the_next_boundary_hook() -> None:
    side = _Steps()
    side.early_tails = ["a", "b"]
    side.allocating()  # vLLM is allocating the step's blocks: not a boundary
    assert side.carried == [] and side.early_tails == ["a", "b"]
    side.after_schedule()  # the step is scheduled: its fences wait for its commit
    assert side.carried == [("a", True, True), ("b", True, True)]  # before the hook's own work
    side.early_tails = ["c"]
    side.ran.clear()
    side.outer()  # carried out once, by the outermost hook, before it runs
    assert side.carried[-1] == ("c", False, False) and side.early_tails == []
    assert side.ran == ["outer", "inner"]


def test_a_hook_holds_the_lock_that_the_open_thread_decides_under() -> None:
    side = _Side()
    inside, release = threading.Event(), threading.Event()
    order: list[str] = []

    @_hook("commit")
    def long_hook(s: _Side) -> None:
        inside.set()
        release.wait(5)
        order.append("hook done")

    def open_thread() -> None:
        inside.wait(5)
        with side.lock:
            order.append("decided")

    hook = threading.Thread(target=long_hook, args=(side,))
    other = threading.Thread(target=open_thread)
    hook.start()
    other.start()
    inside.wait(5)
    other.join(0.2)  # it cannot decide while the hook runs
    release.set()
    hook.join(5)
    other.join(5)
    assert order == ["hook done", "decided"]


class _Stage(Enum):
    FENCE = "fence"


def test_the_buffer_writes_what_structlog_would() -> None:
    fields = {
        "seq": 7,
        "trigger": "Supersede",
        "transition": "supersede",
        "stage": _Stage.FENCE,
        "scope": "s",
        "version": 2,
        "pages": (3, 4),
        "held": frozenset({5}),
        "digest": b"\x01\xff",
    }
    direct, buffered = io.StringIO(), io.StringIO()
    json_lines_logger(direct).info("retire.transition", **fields)
    log = JsonLinesBuffer(buffered)
    log.info("retire.transition", **fields)
    assert buffered.getvalue() == ""
    log.flush()
    assert buffered.getvalue() == direct.getvalue()


def test_a_log_line_holds_the_values_json_would_write() -> None:
    fields = {
        "stage": _Stage.FENCE,
        "pages": (3, 4),
        "held": frozenset({5}),
        "digest": b"\x01\xff",
        "changed": {"epoch": 1, 2: "int key"},
        "name": "caf\u00e9",
        "key": 2**70,  # a block key may be any int: past 64 bits orjson refuses it
    }
    expected = json.loads(json.dumps(fields, default=json_default))
    assert json.loads(encode(fields)) == expected
    assert expected["key"] == 2**70 and expected["changed"] == {"epoch": 1, "2": "int key"}
    assert encode({"seq": 1, "stage": _Stage.FENCE}) == '{"seq":1,"stage":"fence"}'


def test_steps_count_from_their_schedule_to_their_commit_oldest_first() -> None:
    clock = EngineTime()
    clock.step_committed(5.0)  # a commit of a step scheduled before the side attached
    assert (clock.steps, clock.step_seconds) == (0, 0.0)
    clock.step_scheduled(1.0)
    clock.step_scheduled(2.0)  # scheduled ahead (a batch queue)
    clock.step_committed(3.0)
    clock.step_committed(4.5)
    assert clock.steps == 2 and clock.step_seconds == pytest.approx(2.0 + 2.5)
    assert clock.as_dict()["steps"] == 2


def test_a_schedule_that_raises_leaves_no_step_behind() -> None:
    clock = EngineTime()
    with pytest.raises(RuntimeError), clock.scheduling():
        raise RuntimeError("the scheduler failed")
    assert not clock.step_starts
    with clock.scheduling():
        pass
    clock.step_committed(clock.step_starts[0] + 1.0)
    assert (clock.steps, clock.step_seconds) == (1, pytest.approx(1.0))


def test_the_benchmark_reads_per_step_figures() -> None:
    first = {
        "utility": 0.002,
        "add_request": 0.001,
        "schedule": 0.010,
        "commit": 0.030,
        "finished_outside": 0.0,
        "open_early": 0.001,
        "step_seconds": 2.0,
        "steps": 200.0,
        "worker_seconds": 0.008,
        "worker_digest_seconds": 0.012,
        "api_gate": 0.003,
        "api_stamp": 0.001,
        "api_outputs": 800.0,
    }
    rounds = [{"engine_time": first}, {"engine_time": {**first, "utility": 0.0}}]
    share = engine_share(rounds)
    assert share["steps"] == 400
    assert share["step_ms"] == pytest.approx(10.0)
    assert share["in_step_us_per_step"] == pytest.approx(200.0)
    assert share["in_step_share"] == pytest.approx(0.02)
    assert share["between_steps_us_per_step"] == pytest.approx(15.0)
    assert share["commit_us_per_step"] == pytest.approx(150.0)
    assert share["worker_wait_us_per_step"] == pytest.approx(40.0)
    assert share["api_us_per_output"] == pytest.approx(5.0)
    assert share["api_us_per_step"] == pytest.approx(20.0)
    assert share["api_share"] == pytest.approx(0.002)
    assert share["worker_digest_us_per_step"] == pytest.approx(60.0)
    assert share["worker_digest_share"] == pytest.approx(0.006)
    assert share["retire_share"] == pytest.approx(0.02 + 0.006 + 0.002)
    with pytest.raises(ValueError):
        engine_share([{"engine_time": {**first, "steps": 0.0}}])
