"""The systems a replay compares, built from one engine configuration.

``native`` (abort and resubmit) and ``native_stop_reading`` come from :mod:`retire_bench.native`;
``retire`` is ``retire_vllm.facade.RetireEngine`` (imported lazily: it is optional for the native
arms). Every system is constructed the same way -- model path, the harness's clock, and the same
``engine_overrides`` handed to ``retire_vllm.engine_config.build_engine`` -- so both arms run the
same model on the same engine settings.

Also here: :func:`quiet_logger` (the core's structured log, filtered at WARNING, for a Retire
arm built without ``$RETIRE_CORE_LOG_DIR``; with it, the facade keeps the core's log in that
directory and validates it against the spec when the run closes) and :class:`CoreTimer`, which
wraps the facade's ``retire_core.Retire.handle`` and ``handle_batch`` on the instance to measure
the time spent inside the core.
"""

from __future__ import annotations

import logging
import os
import pickle
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

SYSTEMS: Final[tuple[str, ...]] = ("native", "native_stop_reading", "retire")
NATIVE_SYSTEMS: Final[tuple[str, ...]] = ("native", "native_stop_reading")
LABELS: Final[dict[str, str]] = {
    "native": "native abort+resubmit",
    "native_stop_reading": "native stop-reading",
    "retire": "Retire",
}


_ENV: Final[dict[str, str]] = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # in-process engine core, stepped by the harness
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "VLLM_LOGGING_LEVEL": "ERROR",  # keep vLLM's start-up chatter off the results table
    # One unbound OpenMP thread per engine. As fast as vLLM's default (one thread bound to each
    # core) for the tiny model on an idle machine, and it does not fall off a cliff when another
    # process's bound OpenMP threads compete for the same two cores: measured 2.7-4.7 ms per
    # step instead of 12-108 ms with a second vLLM process running (docs/results.md). Same
    # setting for every arm; set the variables yourself to override.
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "OMP_NUM_THREADS": "1",
}


#: The libraries whose start-up chatter :func:`prepare_env` keeps off the console.
CHATTY_LOGGERS: Final[tuple[str, ...]] = ("vllm", "torch", "transformers")
#: Those whose records :func:`prepare_env` can send to a file instead (torch's loggers carry
#: console handlers of their own, logger by logger: only its errors are kept).
ROUTED_LOGGERS: Final[tuple[str, ...]] = ("vllm", "transformers")


def prepare_env(engine_log: Path | None = None) -> None:
    """Environment for the benchmark commands (existing values win); call before vLLM loads.

    With ``engine_log``, vLLM's and transformers' log records from INFO up, and what native code
    writes to stderr, go to that file instead of the console; without it, only their errors are
    kept, on the console. torch's log records are kept at errors either way."""
    import warnings

    for key, value in _ENV.items():
        os.environ.setdefault(key, value)
    warnings.filterwarnings("ignore")
    if engine_log is not None:
        import vllm.logger  # noqa: F401  (imports torch, and vLLM may set up "vllm" at import)
    for name in CHATTY_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    if engine_log is None:
        return
    _native_stderr_to(engine_log)
    handler = logging.FileHandler(engine_log)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    for name in ROUTED_LOGGERS:
        logger = logging.getLogger(name)
        for old in list(logger.handlers):
            logger.removeHandler(old)
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False


def _native_stderr_to(path: Path) -> None:
    """Send what native code writes to the process's stderr (torch's and oneDNN's C++ warnings,
    such as the NUMA binding notice of every engine start) to ``path``; Python's ``sys.stderr``
    (progress lines, errors) stays on the console."""
    console = os.dup(2)
    log = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stderr.flush()
    os.dup2(log, 2)
    os.close(log)
    sys.stderr = os.fdopen(console, "w", buffering=1, encoding="utf-8", errors="replace")


class FacadeMissing(RuntimeError):
    """``retire_vllm.facade`` is not importable yet."""


def quiet_logger() -> Any:
    import structlog

    return structlog.wrap_logger(
        structlog.PrintLogger(),
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
    )


def facade_available() -> bool:
    try:
        import retire_vllm.facade  # noqa: F401
    except ModuleNotFoundError as err:
        if err.name and err.name.startswith("retire_vllm.facade"):
            return False
        raise
    return True


def make_system(
    name: str,
    model_path: str | None,
    *,
    clock: Callable[[], float] = time.perf_counter,
    engine_overrides: dict[str, Any] | None = None,
) -> Any:
    overrides = dict(engine_overrides or {})
    if name == "native":
        from retire_bench.native import NativeAbortResubmit

        return NativeAbortResubmit(model_path, clock=clock, **overrides)
    if name == "native_stop_reading":
        from retire_bench.native import NativeStopReading

        return NativeStopReading(model_path, clock=clock, **overrides)
    if name == "retire":
        if not facade_available():
            raise FacadeMissing(
                "retire_vllm.facade.RetireEngine is not available yet; run --system native"
            )
        from retire_vllm.corelog import LOG_DIR_ENV
        from retire_vllm.facade import RetireEngine

        # With $RETIRE_CORE_LOG_DIR set (``retire replay`` and ``retire demo`` set it; so does the
        # vLLM test suite) the facade keeps the core's log and validates it at ``close``.
        logger = None if os.environ.get(LOG_DIR_ENV) else quiet_logger()
        return RetireEngine(model_path, clock=clock, logger=logger, **overrides)
    raise ValueError(f"unknown system {name!r}; known: {', '.join(SYSTEMS)}")


# One recorded core call: batch?, its events, the harness step it ran in (0: outside steps),
# the commands it returned.
CoreCall = tuple[bool, tuple[Any, ...], int, list[Any]]
CALLS_FORMAT: Final[int] = 1


def replay_core_calls(
    initial: Any,
    calls: Sequence[CoreCall],
    clock: Callable[[], float] = time.perf_counter,
    between: Callable[[int], None] | None = None,
) -> float:
    """Run recorded core calls again, in order, on a fresh core started from ``initial`` (with a
    logger that drops INFO, as ``quiet_logger``); return the seconds spent in the in-step ones.
    Every call is replayed (those outside steps too, untimed) so each starts from the state it
    had in the run. A call whose commands differ from the recorded ones raises ``RuntimeError``
    (the figure would not be the same work). ``between(step)``, if given, runs once per step
    right after that step's first call (where the model's forward pass runs in a real step),
    untimed."""
    from retire_core import Retire

    core = Retire(logger=quiet_logger(), state=initial)
    handle, handle_batch = core.handle, core.handle_batch
    total = 0.0
    last_step = 0
    for i, (batch, events, step, commands) in enumerate(calls):
        t0 = clock()
        got = handle_batch(events) if batch else handle(events[0])
        dt = clock() - t0
        if step:
            total += dt
        if got != commands:
            raise RuntimeError(f"warm replay diverged at core call {i}: {got!r} != {commands!r}")
        if between is not None and step and step != last_step:
            between(step)
        last_step = step
    return total


def load_core_calls(path: str | os.PathLike[str]) -> tuple[Any, list[CoreCall]]:
    """The initial core state and the calls ``CoreTimer.save_calls`` wrote (a file this project
    wrote itself: it is a pickle)."""
    with open(path, "rb") as f:
        doc = pickle.load(f)
    if not isinstance(doc, dict) or doc.get("format") != CALLS_FORMAT:
        raise ValueError(f"{path}: not a core-calls file of format {CALLS_FORMAT}")
    return doc["initial"], list(doc["calls"])


class CoreTimer:
    """Where a system's step time goes, measured by wrapping methods on the instances.

    * ``Retire.handle`` and ``Retire.handle_batch`` of a system with a ``.retire`` (the facade):
      every core event (a batch counts its events), and the part of that time spent inside the
      harness's ``step()`` call (``in_step_s``);
    * ``LLMEngine.step`` of ``system.engine``: the engine's own step (``engine_s``);
    * the facade's scheduler hooks (``withheld``, ``after_schedule``, ``before_commit``), which
      run *inside* ``LLMEngine.step`` (``hooks_s``);
    * vLLM's request API (``add_request``, ``abort_request`` of ``system.engine``) when a
      harness step calls it outside ``LLMEngine.step`` (``engine_api_s``): the facade admits a
      successor and carries out a fence deferred to the step boundary inside its ``step()``.
      That is the engine's own work, the same a native client pays in its submit and abort.

    So the integration's work during a step is ``step - engine - engine_api + hooks`` (core
    included).

    With ``record=True`` it also keeps every core call that returned (its events, the number of
    the harness step it ran in -- 0 outside steps, 1 for the first -- and the commands it
    returned), so that :meth:`warm_replay` can run the same calls again, back to back on a fresh
    core, after the run: what the core's in-step calls cost when the model's kernels have not
    evicted the CPU caches in between. :meth:`save_calls` writes them for
    ``retire_bench.interleave``. A run longer than ``record_limit`` calls stops recording
    (``calls`` becomes None: no warm figure) rather than hold every event of a long trace in
    memory.
    """

    RECORD_LIMIT = 200_000  # calls (the shipped trace's replay makes about 1,700 per run)

    HOOKS = ("withheld", "after_schedule", "before_commit")
    ENGINE_API = ("add_request", "abort_request")

    def __init__(
        self,
        system: Any,
        clock: Callable[[], float] = time.perf_counter,
        *,
        record: bool = False,
        record_limit: int = RECORD_LIMIT,
    ) -> None:
        self.total_s = 0.0
        self.events = 0
        self.in_step_s = 0.0
        self.engine_s = 0.0
        self.hooks_s = 0.0
        self.engine_api_s = 0.0
        self._in_step = False
        self._step = 0  # the harness step in progress (numbered from 1), 0 between steps
        self.steps = 0
        self._in_engine = False
        self._clock = clock
        core: Any = getattr(system, "retire", None)
        self.active = core is not None and hasattr(core, "handle")
        # (batch?, events, step number or 0, commands) of each call that returned, in order,
        # and the core's state before the first (see warm_replay)
        self.calls: list[CoreCall] | None = None
        self._initial: Any = None
        self._record_limit = record_limit
        if self.active:
            if record:
                self.calls = []
                self._initial = core.snapshot()
            core.handle = self._timed_core(core.handle, lambda _event: 1, batch=False)
            if hasattr(core, "handle_batch"):
                # A batch counts as many events as it holds (the facade hands lists over).
                core.handle_batch = self._timed_core(core.handle_batch, len, batch=True)
        engine: Any = getattr(system, "engine", None)
        if engine is not None:
            engine.step = self._timed_engine_step(engine.step)
            for name in self.ENGINE_API:
                if hasattr(engine, name):
                    setattr(engine, name, self._timed_engine_api(getattr(engine, name)))
        if getattr(getattr(system, "scheduler", None), "retire_hooks", None) is system:
            for name in self.HOOKS:
                if hasattr(system, name):
                    setattr(system, name, self._timed(getattr(system, name), "hooks_s"))

    def _timed_core(
        self, original: Callable[[Any], Any], count: Callable[[Any], int], *, batch: bool
    ) -> Callable[[Any], Any]:
        """Wrap ``Retire.handle`` / ``handle_batch`` on the instance (the facade's calls go
        through the instance attribute): time inside the core, and the events it handled."""
        clock = self._clock

        def timed(arg: Any) -> Any:
            t0 = clock()
            try:
                result = original(arg)
            finally:
                dt = clock() - t0
                self.total_s += dt
                self.events += count(arg)
                if self._in_step:
                    self.in_step_s += dt
            calls = self.calls
            if calls is not None:  # a call that raised changed nothing: nothing to replay
                if len(calls) >= self._record_limit:
                    self.calls = None  # too long a run to keep: no warm figure
                else:
                    entry = (batch, tuple(arg) if batch else (arg,), self._step, list(result))
                    calls.append(entry)
            return result

        return timed

    def warm_replay(self, reps: int = 3) -> float:
        """Seconds the recorded in-step core calls take when replayed back to back on a fresh
        core built like the system's (``replay_core_calls``), best of ``reps`` passes."""
        if self.calls is None:
            raise ValueError(
                "no calls to replay: CoreTimer(record=True) keeps them, up to record_limit"
            )
        passes = [
            replay_core_calls(self._initial, self.calls, self._clock) for _ in range(max(1, reps))
        ]
        return min(passes)

    def save_calls(self, path: str | os.PathLike[str]) -> None:
        """Write the recorded calls and the core's initial state (``load_core_calls`` reads
        them back), for ``retire_bench.interleave``."""
        if self.calls is None:
            raise ValueError(
                "no calls to save: CoreTimer(record=True) keeps them, up to record_limit"
            )
        with open(path, "wb") as f:
            pickle.dump({"format": CALLS_FORMAT, "initial": self._initial, "calls": self.calls}, f)

    def _timed(self, fn: Callable[..., Any], field: str) -> Callable[..., Any]:
        clock = self._clock

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                setattr(self, field, getattr(self, field) + clock() - t0)

        return timed

    def _timed_engine_step(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        clock = self._clock

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = clock()
            self._in_engine = True
            try:
                return fn(*args, **kwargs)
            finally:
                self._in_engine = False
                self.engine_s += clock() - t0

        return timed

    def _timed_engine_api(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        clock = self._clock

        def timed(*args: Any, **kwargs: Any) -> Any:
            if not self._in_step or self._in_engine:  # outside steps, or already engine time
                return fn(*args, **kwargs)
            t0 = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                self.engine_api_s += clock() - t0

        return timed

    def stepping(self, flag: bool) -> None:
        self._in_step = flag
        if flag:
            self.steps += 1
            self._step = self.steps
        else:
            self._step = 0
