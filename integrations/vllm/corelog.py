"""``CoreLog``: the core's transition log of one ``RetireEngine``, validated when the run closes.

The facade hands ``CoreLog`` to ``retire_core.Retire`` as its structlog logger. While the engine
runs, each transition's fields are only kept in memory (one dict per transition: no rendering,
no I/O on the step path); ``finish`` appends them to the log file as JSON lines -- the format
``retire validate-trace`` reads -- and validates the file against the spec
(``retire_checks.trace_validation``). A rejected log raises :class:`TraceRejected` naming the
file, the first offending line and the reason; so does a log that lost or gained lines (its
``seq`` numbers must run without a gap, and every kept line must be replayed). A log with no
transition (an engine that never handled an event) is written empty and not validated: there is
nothing to replay.

Where the log goes (``log_path_for``): the ``log_path`` the caller gives, else a file in the
directory named by ``RETIRE_CORE_LOG_DIR`` (the vLLM test suite sets it for every test), else
nowhere (the core then logs through the caller's logger, or not at all). The serving path's
engine side writes its log as it goes instead (``JsonLinesBuffer``, flushed at the end of each
of its hooks), or logs nothing (``NullLogger``); with data parallelism each engine core writes
its own (``engine_log_path``).
"""

from __future__ import annotations

import itertools
import json
import os
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

import orjson
import structlog

from .errors import IntegrationError

#: A directory: every ``RetireEngine`` created without a log path or logger writes its core log
#: there and validates it at ``close``.
LOG_DIR_ENV = "RETIRE_CORE_LOG_DIR"
EVENT = "retire.transition"

_NAMES = itertools.count()
#: Every ``CoreLog`` not finished yet (a test fixture finishes those its test left open).
_OPEN: weakref.WeakSet[CoreLog] = weakref.WeakSet()


class TraceRejected(IntegrationError):
    """The core log of a run is not a behaviour of the spec (or lost lines)."""

    def __init__(self, path: Path, line: int, message: str) -> None:
        super().__init__(f"core log rejected: {path}:{line}: {message}")
        self.path = path
        self.line = line
        self.message = message


def log_path_for(log_path: str | Path | None, logger: Any | None) -> Path | None:
    """The file a facade's core log goes to (``None``: no validated log)."""
    if log_path is not None:
        return Path(log_path)
    directory = os.environ.get(LOG_DIR_ENV)
    if logger is not None or not directory:
        return None
    Path(directory).mkdir(parents=True, exist_ok=True)
    return Path(directory) / f"core-{os.getpid()}-{next(_NAMES)}.jsonl"


def json_default(value: Any) -> Any:
    """``json.dumps``'s ``default`` for core log fields (enums, bytes, sets)."""
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, set | frozenset | tuple):
        return list(value)
    if hasattr(value, "value"):
        return value.value
    return str(value)


_json_encode = json.JSONEncoder(default=json_default).encode
_ORJSON_OPTIONS = orjson.OPT_NON_STR_KEYS  # as ``json``: a non-string key becomes a string


def encode(fields: Mapping[str, Any]) -> str:
    """One core log line's JSON text: ``orjson`` (about 9x ``json``'s encoder over a 2,048-block
    revision's 5,125 lines, 0.5 against 4.5 us a line: results.md 4.5), the same values as
    ``json.dumps(fields, default=json_default)`` in compact form. An int past 64 bits (a block
    key may be any int), which ``orjson`` refuses, takes ``json``'s encoder instead."""
    try:
        return orjson.dumps(fields, default=json_default, option=_ORJSON_OPTIONS).decode()
    except orjson.JSONEncodeError:
        return _json_encode(fields)


class CoreLog:
    """A structlog-compatible logger (``info``, ``is_enabled_for``) that keeps the core's
    transition events in memory until ``finish`` writes and validates them."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.records: list[dict[str, Any]] = []
        self.finished = False
        self.validated: int | None = None  # transitions replayed against the spec by ``finish``
        _OPEN.add(self)

    def is_enabled_for(self, level: int) -> bool:
        return True

    def info(self, event: str, **fields: Any) -> None:
        fields["event"] = event
        self.records.append(fields)

    def finish(self) -> int:
        """Append the kept records to the file (one JSON object per line), forget them, and
        validate what was appended; returns the number of transitions replayed against the spec.
        Raises ``TraceRejected`` (line numbers are the file's)."""
        from retire_checks.trace_validation import TraceError, validate_lines

        if self.finished:
            raise RuntimeError("the core log is already finished")
        self.finished = True
        _OPEN.discard(self)
        lines = [encode(record) + "\n" for record in self.records]
        self.records = []
        before = 0
        if self.path.exists():
            with open(self.path, encoding="utf-8") as fh:
                before = sum(1 for _ in fh)
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.writelines(lines)
        if not lines:
            self.validated = 0
            return 0
        try:
            report = validate_lines(lines)
        except TraceError as err:
            raise TraceRejected(self.path, before + err.line, err.message) from None
        if report.transitions != len(lines):
            raise TraceRejected(
                self.path,
                before + report.lines,
                f"{report.transitions} of {len(lines)} transitions replayed",
            )
        self.validated = report.transitions
        return report.transitions


def unfinished() -> list[CoreLog]:
    """The core logs of this process that no ``close`` has finished yet."""
    return list(_OPEN)


__all__ = ["LOG_DIR_ENV", "CoreLog", "TraceRejected", "log_path_for", "unfinished"]


class NullLogger:
    writes = False  # nothing to flush: a hook need not ask whether the engine went idle

    def flush(self, durable: bool = False) -> None:
        return None

    def is_enabled_for(self, level: int) -> bool:
        return False  # the core then builds no log fields at all

    def info(self, *_: Any, **__: Any) -> None:
        return None


class JsonLinesBuffer:
    """A structlog-compatible logger (``info``, ``is_enabled_for``) for the serving engine side:
    each transition's fields are kept until ``flush`` renders them as JSON lines -- the lines
    ``json_lines_logger`` writes, byte for byte -- into ``stream`` in one write. The engine side
    flushes whenever it hands control back to vLLM, and makes the lines durable (the stream's
    buffer handed to the OS) when a utility call returns and at shutdown: a line per write, as
    structlog's logger does, releases the GIL on the engine core's busy loop a dozen times a step,
    and its other threads take it (results.md, section 8.5). A killed process loses at most the
    stream's buffer; what is on disk is a prefix of the log."""

    writes = True

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.pending: list[dict[str, Any]] = []

    def is_enabled_for(self, level: int) -> bool:
        return True

    def info(self, event: str, **fields: Any) -> None:
        fields["event"] = event
        self.pending.append(fields)

    def flush(self, durable: bool = False) -> None:
        if self.pending:
            pending, self.pending = self.pending, []
            self.stream.write("".join([encode(f) + "\n" for f in pending]))
        if durable:
            self.stream.flush()


def json_lines_logger(stream: TextIO) -> Any:
    """A structlog logger that writes each event as one JSON object per line (trace validation
    reads these)."""
    return structlog.wrap_logger(
        structlog.WriteLogger(stream),
        processors=[lambda _logger, _method, fields: encode(fields)],  # the renderer: ``encode``
    )


def engine_log_path(path: str | Path, dp_rank: int, dp_size: int) -> Path:
    """The core log of one data-parallel engine core: ``path`` itself when there is one engine,
    else ``<stem>.dp<rank><suffix>`` beside it (every engine core has its own authority)."""
    path = Path(path)
    if dp_size <= 1:
        return path
    return path.with_name(f"{path.stem}.dp{dp_rank}{path.suffix}")
