"""``retire_bench.servers``' start-up of several servers at once (``wait=False`` and
``ready_together``, as the serving tests' package and ``retire replay --system all`` start
``retire serve`` beside stock vLLM's server): one that exits while the others start stops them
all and names itself, and a server's model is not read before it answered. Plain processes
stand in for the servers (what is checked is the waiting, not vLLM); marked ``vllm`` because
``retire_bench.servers`` needs ``httpx``, which comes with the vLLM environment."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from retire_bench.servers import Server, ready_together

pytestmark = pytest.mark.vllm


def _process(tmp: Path, name: str, code: str) -> Server:
    # ``python -c`` leaves the ``--host``/``--port`` arguments Server appends to ``sys.argv``
    return Server([sys.executable, "-c", code], tmp / name, name, wait=False)


def test_a_server_that_exits_while_others_start_stops_them_all(tmp_path: Path) -> None:
    slow = _process(tmp_path, "slow", "import time; time.sleep(300)")
    failing = _process(tmp_path, "failing", "print('no model here'); raise SystemExit(3)")
    with pytest.raises(RuntimeError, match="server exited; log:\nno model here"):
        ready_together([slow, failing])  # the slow one first: it is not waited for to the end
    assert failing.proc.returncode == 3
    assert slow.proc.returncode is not None  # stopped, not left running
    with pytest.raises(RuntimeError, match="slow server not ready: call wait_ready first"):
        _ = slow.model
