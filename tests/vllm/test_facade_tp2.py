"""Receipts from every worker rank: RetireEngine over tensor parallel 2 on CPU.

The scheduler stays in this process, the two ranks run in worker processes (``mp`` executor), so
the scenario runs as its own process (``tp2_scenario.py``).  Every retired version is closed only
after the request *and both ranks* (``<request>/rank0``, ``<request>/rank1``, answered through
``collective_rpc`` after any step in flight) delivered their receipts; page digests combine both
ranks' halves of the KV heads, so a corruption on the ranks is caught at adoption.  Under a pool
too small for its scopes, vLLM's preemption closes the request and both ranks before the pages
go, and the request runs again under renamed participants (``<request>#<n>/rank<r>``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from retire_bench.campaign_tp import tp2_env

pytestmark = pytest.mark.vllm

SCRIPT = Path(__file__).with_name("tp2_scenario.py")


def _scenario(*args: str) -> dict[str, Any]:
    # vLLM's IPC sockets live under TMPDIR and their paths must stay under 107 bytes (pytest's
    # tmp_path under an xdist worker is longer)
    with tempfile.TemporaryDirectory(prefix="rt") as short:
        proc = subprocess.run(
            [sys.executable, str(SCRIPT), *args],
            capture_output=True,
            text=True,
            timeout=420,
            env=tp2_env(short),
        )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    result: dict[str, Any] = json.loads(lines[-1][len("RESULT ") :])
    return result


def test_tp2_receipts_from_every_rank() -> None:
    r = _scenario()
    print(f"\n[tp2] {r}")
    assert r["executor"] == "MultiprocExecutor" and r["tp"] == 2
    for parts, receipts in zip(r["participants"], r["receipts"], strict=True):
        rid = parts[0]
        assert parts == [rid, f"{rid}/rank0", f"{rid}/rank1"]
        assert receipts == sorted(parts)  # every participant of every version closed
    assert r["rank_receipts"][:2] == [[0, 1], [0, 1]]  # fenced versions: both ranks answered
    assert len(r["rank_digest_blocks"]) == 2 and r["rank_digest_blocks"][0]
    assert r["adopted"] == [0, 3, 1] and r["num_cached"] == [0, 96, 32]
    assert r["released"][0] == [r["victim"], "digest_mismatch"]
    assert r["v1_ok"], r["v1_problems"]
    assert r["v2_ok"], r["v2_problems"]
    # vLLM's preemption under TP=2: receipts from the request and both ranks before the pages
    # go, then the request runs again under renamed participants (ranks too)
    assert r["preemptions"] > 0 and r["preempted_participants"]
    for parts, receipts, ranks in zip(
        r["preempted_participants"],
        r["preempted_receipts"],
        r["preempted_rank_receipts"],
        strict=True,
    ):
        head = parts[0]
        rid, n = head.rsplit("#", 1)
        assert parts == [head, f"{head}/rank0", f"{head}/rank1"] and int(n) >= 1
        before = [rid if int(n) == 1 else f"{rid}#{int(n) - 1}"]
        before += [f"{before[0]}/rank0", f"{before[0]}/rank1"]
        assert set(before + parts) <= set(receipts)  # every run's request and ranks closed
        assert ranks.count(0) >= 2 and ranks.count(1) >= 2  # both ranks, at each close
    assert r["preempted_ok"], r["preempted_problems"]
    assert r["closed_clean"]
    assert r["core_log_validated"] > 0  # the run's core log was a behaviour of the spec


def test_tp2_with_two_kv_cache_groups() -> None:
    """The hybrid model over two ranks: the revision adopts both groups' slots, and each rank's
    receipt digests every page the retired version still references. The sliding-window blocks
    its window had passed are not among them: vLLM dropped them from the table, Retire gave them
    back to vLLM's cache then (``PageUnreferenced``), and the revision certified two of them
    from there."""
    r = _scenario("hybrid")
    print(f"\n[tp2 hybrid] {r}")
    assert r["windows"] == [2, 0]
    assert r["rank_receipts"] == [[0, 1], [0, 1]]
    assert len(r["v0_pages"]) == 20  # 10 blocks of the prompt in each group
    # pages 1-10 are the sliding group's (allocated first), 11-20 the full group's; after 311
    # tokens the window (63 tokens) holds sliding blocks 7-9: blocks 0-6 were passed
    still = r["v0_pages"][7:]
    assert r["v0_rank_digest_blocks"] == [still, still]
    assert r["adopted"] == 6
    assert r["slots"] == sorted([[1, i] for i in range(6)] + [[0, 4], [0, 5]])
    assert r["v1_ok"], r["v1_problems"]
    assert r["core_log_validated"] > 0
