"""The demo's console: the in-process engine's chatter goes to the engine log, not the console."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from retire_bench.systems import CHATTY_LOGGERS, prepare_env


@pytest.fixture
def restored_loggers() -> Iterator[None]:
    saved = {
        name: (list(lg.handlers), lg.level, lg.propagate)
        for name, lg in ((n, logging.getLogger(n)) for n in CHATTY_LOGGERS)
    }
    yield
    for name, (handlers, level, propagate) in saved.items():
        logger = logging.getLogger(name)
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
            handler.close()
        for handler in handlers:
            logger.addHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate


@pytest.mark.usefixtures("restored_loggers")
def test_engine_messages_go_to_the_engine_log_not_the_console(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "engine.log"
    prepare_env(engine_log=log)
    logging.getLogger("vllm.model_executor.model_loader").info("Loading weights took 0.1 s")
    logging.getLogger("transformers.tokenization_utils").warning("gloo is slow")
    for handler in logging.getLogger("vllm").handlers:
        handler.flush()
    written = log.read_text()
    assert "Loading weights took 0.1 s" in written and "gloo is slow" in written
    out, err = capfd.readouterr()
    assert "Loading weights" not in out + err and "gloo" not in out + err
