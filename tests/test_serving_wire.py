"""The data-parallel routing pieces of ``retire_vllm.serving.wire``, and its ``Server-Timing``,
without vLLM.

``affinity`` must send every call on a scope to one engine, the same in every process (it is
computed in the API process on each request) and spread scopes over the engines; ``merge_answers``
must combine the engines' answers so that a leak on any one engine still shows.
``server_timing`` must name each phase whose two moments are known, in milliseconds.
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


def test_server_timing_names_each_phase_whose_ends_are_known() -> None:
    moments = {"arrived": 10.0, "sent": 10.002, "received": 10.0125, "decided": 10.013}
    header = wire.server_timing(moments)
    parts = [p.split(";") for p in header.split(", ")]
    assert [p[0] for p in parts] == ["retire-api", "retire-queue", "retire-authority"]
    assert [float(p[1].removeprefix("dur=")) for p in parts] == [2.0, 10.5, 0.5]
    assert all(p[2].startswith('desc="') and p[2].endswith('"') for p in parts)
    answered = wire.server_timing({**moments, "carried_out": 10.015, "answered": 10.02})
    assert answered.split(", ")[-2].startswith("retire-commands;dur=2.000;")
    assert answered.split(", ")[-1].startswith("retire-admission;dur=5.000;")
    # a revision that fenced a running version: its terminal output's moment, within the commands
    fenced = wire.server_timing({**moments, "fenced": 10.0135, "carried_out": 10.015})
    assert [p.split(";")[0] for p in fenced.split(", ")][-2:] == ["retire-fence", "retire-commands"]
    assert fenced.split(", ")[-2].startswith("retire-fence;dur=0.500;")
    assert wire.server_timing({"arrived": 1.0}) == ""


def test_the_serving_benchmark_reads_the_header_back() -> None:
    from retire_bench.serving import _server_timing

    moments = {"arrived": 5.0, "sent": 5.25, "received": 5.5, "decided": 5.625}
    read = _server_timing(
        wire.server_timing({**moments, "fenced": 5.6875, "carried_out": 5.75, "answered": 6.0})
    )
    assert read == {
        "retire-api": 250.0,
        "retire-queue": 250.0,
        "retire-authority": 125.0,
        "retire-fence": 62.5,
        "retire-commands": 125.0,
        "retire-admission": 250.0,
    }
    assert _server_timing("") == {}


def test_a_request_runs_as_an_admitted_version_only_once_the_engine_side_stamped_it() -> None:
    import types

    def request(extra_args: dict[str, object] | None) -> object:
        return types.SimpleNamespace(sampling_params=types.SimpleNamespace(extra_args=extra_args))

    following = request({wire.XARG_SCOPE: "s", wire.XARG_OPENING: "o1"})
    assert wire.opening_of(following) == "o1"
    assert wire.admitted_version(following) is None  # not admitted yet
    wire.stamp_version(following, 3)
    assert wire.admitted_version(following) == ("s", 3)
    assert wire.opening_of(following) is None  # it follows no open any more
    assert wire.admitted_version(request({wire.XARG_SCOPE: "s"})) is None
    assert wire.admitted_version(request(None)) is None
    assert wire.opening_of(request(None)) is None
    assert wire.admitted_version(types.SimpleNamespace(sampling_params=None)) is None  # pooling
    assert wire.opening_of(types.SimpleNamespace(sampling_params=None)) is None
