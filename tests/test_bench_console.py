"""The demo's console: the in-process engine's chatter (log records and native code's stderr)
goes to the engine log; the demo's own progress lines stay on the console."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from retire_bench.systems import CHATTY_LOGGERS, prepare_env


@pytest.fixture
def restored_loggers() -> Iterator[None]:
    stderr, fd2 = sys.stderr, os.dup(2)
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
    sys.stderr.flush()
    os.dup2(fd2, 2)
    os.close(fd2)
    sys.stderr = stderr


@pytest.mark.usefixtures("restored_loggers")
def test_engine_messages_go_to_the_engine_log_not_the_console(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    import torch.distributed  # noqa: F401  (its loggers get console handlers of their own)

    log = tmp_path / "engine.log"
    prepare_env(engine_log=log)
    logging.getLogger("vllm.model_executor.model_loader").info("Loading weights took 0.1 s")
    logging.getLogger("transformers.tokenization_utils").warning("slow tokenizer in use")
    logging.getLogger("torch.distributed.distributed_c10d").info("Using backend config: gloo")
    os.write(2, b"[W utils.cpp:68] Warning: NUMA binding\n")  # as torch's C++ code writes
    print("[2/6] replaying", file=sys.stderr)
    sys.stderr.flush()
    for handler in logging.getLogger("vllm").handlers:
        handler.flush()
    written = log.read_text()
    assert "Loading weights took 0.1 s" in written and "slow tokenizer in use" in written
    assert "NUMA binding" in written and "replaying" not in written
    out, err = capfd.readouterr()
    assert "Loading weights" not in out + err and "slow tokenizer" not in out + err
    assert "gloo" not in written + out + err  # torch's records below errors: nowhere
    assert "NUMA" not in err and "[2/6] replaying" in err
