"""The real CPU vLLM engine behaves as ``docs/vllm_research.md`` says (one engine per process).

Each test runs one experiment of :mod:`retire_vllm.experiments` in a fresh Python process (vLLM
keeps process-global state) and checks the facts the Retire integration is designed on:
determinism and prefix caching, block pinning across co-tenant eviction, KV digests catching an
injected page fault, a scheduler subclass refusing commits, stale tokens after ``abort`` with a
slow ``AsyncLLM`` consumer, and tensor parallel 2 with per-rank receipts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

pytestmark = pytest.mark.vllm


def run_experiment(*args: str, timeout: int = 420) -> dict[str, Any]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    proc = subprocess.run(
        [sys.executable, "-m", "retire_vllm.experiments", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, (
        f"experiment {args} failed (rc={proc.returncode}):\n{proc.stdout[-3000:]}\n"
        f"{proc.stderr[-6000:]}"
    )
    result: dict[str, Any] = json.loads(lines[-1][len("RESULT ") :])
    return result


def test_smoke_determinism_and_prefix_cache() -> None:
    r = run_experiment("smoke")
    assert r["same_on_repeat"] and r["same_in_batch"]
    assert r["cached_first"] == 0
    assert r["cached_repeat"] == 288  # 300-token prompt: 9 full blocks of 32


def test_pinned_blocks_survive_eviction_and_hit() -> None:
    r = run_experiment("pinning")
    assert r["blocks_still_mapped"] == 4
    assert r["generation_changed"] == [] and r["digest_changed"] == []
    assert r["b_num_cached_tokens"] == 128
    assert r["b_equals_cold_reference"]
    assert r["free_at_end"] == 23 and r["reset_prefix_cache_ok_at_end"]  # no leaked pin


def test_unpinned_blocks_are_lost_natively() -> None:
    r = run_experiment("pinning", "--no-pin")
    assert r["blocks_still_mapped"] == 0
    assert sorted(r["generation_changed"]) == sorted(r["a_cached_block_ids"])
    assert set(r["a_cached_block_ids"]) <= set(r["evicted_ids_seen"])
    assert r["b_num_cached_tokens"] == 0 and r["b_equals_cold_reference"]


def test_digest_catches_injected_page_fault() -> None:
    r = run_experiment("digest")
    assert r["digest_stable_without_writes"]
    assert r["mismatched_block_ids"] == [r["victim_block_id"]]
    assert r["native_cached_tokens"] == 128 and not r["native_equals_reference"]
    assert r["repaired_cached_tokens"] == 64 and r["repaired_equals_reference"]


def test_scheduler_subclass_refuses_commits() -> None:
    r = run_experiment("sched-gate")
    assert r["tokens_A"] == r["tokens_A_before_revoke"]
    assert r["tokens_B"] == 30
    assert r["finish"] == {"A": "abort", "B": "length"}
    assert len(r["dropped_commits"]) == 1
    assert not r["A_still_in_scheduler"] and r["free_blocks"] == 63


def test_async_llm_stale_tokens_after_abort() -> None:
    r = run_experiment("stale")
    assert all(r[mode]["running_at_abort"] for mode in ("native", "purge", "gated"))
    assert r["native"]["tokens_after_abort"] > 0  # the paper's stale publication
    assert r["purge"]["tokens_after_abort"] == 0
    assert r["gated"]["tokens_after_abort"] == 0 and r["gated"]["frames_after_abort"] == 0


def test_tensor_parallel_2_matches_tp1_and_gives_receipts() -> None:
    tp1 = run_experiment("tp2", "--tp", "1")
    tp2 = run_experiment("tp2", "--tp", "2")
    assert tp2["executor"] == "MultiprocExecutor"
    assert tp2["tokens"] == tp1["tokens"]
    assert [r["rank"] for r in tp2["receipts"]] == [0, 1]
    assert all(r["kv_shape"] == [[64, 1, 32, 64]] * 2 for r in tp2["receipts"])
    assert len({pid for _, pid in tp2["ranks_and_pids"]}) == 2
