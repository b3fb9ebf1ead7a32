"""The data-parallel routing pieces of ``retire_vllm.serving.wire``, without vLLM.

``affinity`` must send every call on a scope to one engine, the same in every process (it is
computed in the API process on each request) and spread scopes over the engines; ``merge_answers``
must combine the engines' answers so that a leak on any one engine still shows.
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter

from retire_vllm.serving import wire


def test_affinity_is_stable_across_processes_and_spreads_scopes() -> None:
    names = [f"scope-{i}" for i in range(400)]
    here = [wire.affinity("acme", n, 2) for n in names]
    code = (
        "from retire_vllm.serving import wire\n"
        f"print([wire.affinity('acme', n, 2) for n in {names!r}])"
    )
    there = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert str(here) == there.strip()  # another process (another string hash seed) agrees
    counts = Counter(here)
    assert set(counts) == {0, 1} and min(counts.values()) > 150
    assert any(wire.affinity("acme", n, 2) != wire.affinity("globex", n, 2) for n in names)
    assert {wire.affinity("acme", n, 1) for n in names} == {0}


def test_merged_answers_keep_every_engines_leaks() -> None:
    clean = {
        "ok": True,
        "free_blocks": 100,
        "initial_free_blocks": 100,
        "core_pages": [],
        "live_scope_tenants": {},
        "counters": {"fences": 2},
        "cleanup_seconds": {"bounds": [0.1, 1.0], "counts": [1, 0, 0], "sum": 0.05, "count": 1},
    }
    leaking = {
        "ok": True,
        "free_blocks": 97,
        "initial_free_blocks": 100,
        "core_pages": [7, 9],
        "live_scope_tenants": {"s": "acme"},
        "counters": {"fences": 1, "expired": 3},
        "cleanup_seconds": {"bounds": [0.1, 1.0], "counts": [0, 2, 1], "sum": 4.5, "count": 3},
    }
    merged = wire.merge_answers([clean, leaking])
    assert merged["ok"] is True
    assert (merged["free_blocks"], merged["initial_free_blocks"]) == (197, 200)
    assert merged["core_pages"] == [7, 9]
    assert merged["live_scope_tenants"] == {"s": "acme"}
    assert merged["counters"] == {"fences": 3, "expired": 3}
    assert merged["cleanup_seconds"] == {
        "bounds": [0.1, 1.0],
        "counts": [1, 2, 1],
        "sum": 4.55,
        "count": 4,
    }
    assert wire.merge_answers([clean, {**clean, "ok": False}])["ok"] is False
