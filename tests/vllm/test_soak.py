"""The short soak (``retire_bench.soak``) against a real ``retire serve``, and its checker.

The short form of the benchmark's load: 120 scopes revised in bursts by 16 concurrent clients for
45 s, with a small KV pool and a 10 s scope expiry, so that vLLM evicts cached blocks and the
server expires idle scopes and forgets cancelled ones while the load runs. Asserted are counts
the server and the client report, never a time or a memory figure (those are the benchmark's,
``docs/results.md``): every request and stream ended in a known way, every structure the server
reports stayed within its bound in every sample, and at the end, once every scope is cancelled
and forgotten, nothing is left. The core log is not written here: a log of this load takes
minutes to validate (the other serving tests validate theirs).

The checker's own tests come first: each verdict is shown to fail on a synthetic report that
holds what it must catch (a leaked pin, a scope record left, a structure over its bound,
cancelled scopes never forgotten, memory that grows).
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from retire_bench import soak
from retire_bench.servers import RetireServer

pytestmark = pytest.mark.vllm

MIB = 1 << 20
#: Every tenth burst leaves its scope idle until it expires: a client that is never starved
#: visits all 120 scopes within the 10 s expiry.
CFG = soak.SoakConfig(
    scopes=120, clients=16, seconds=45.0, ttl_s=10.0, rest_every=10, sample_s=3.0, seed=1
)
BLOCKS = 192


def _clean_leaks() -> dict[str, Any]:
    """A ``GET /v1/retire/leaks`` answer of a server that holds nothing."""
    sizes = dict.fromkeys(soak.AT_REST_ZERO, 0)
    sizes.update(core_generations=40, core_ledger=300, spy_generations=40, spy_listeners=1)
    return {
        **{key: [] for key in ("ledger_blocks", "ledger_pins", "ledger_cached", "core_pages")},
        **{key: [] for key in ("core_pinned", "managed_requests", "scheduler_requests")},
        **{
            key: []
            for key in ("admissions", "openings", "pipelined", "held_requests", "early_openings")
        },
        "live_scopes": [],
        "free_blocks": 191,
        "initial_free_blocks": 191,
        "scope_records": 0,
        "counters": {},
        "sizes": sizes,
        "bounds": {"blocks": BLOCKS, "core_ledger": 1024},
        "api_sizes": {"streams": 0, "tasks": 0, "output_states": 0, "parent_requests": 0},
    }


def test_the_end_check_sees_a_leaked_pin_a_scope_record_and_a_request() -> None:
    assert soak.end_problems(_clean_leaks()) == {}
    leaked = _clean_leaks()
    leaked["ledger_pins"] = [7]
    leaked["core_pinned"] = [7]
    leaked["free_blocks"] = 190
    assert set(soak.end_problems(leaked)) == {"ledger_pins", "core_pinned", "free_blocks"}
    record = _clean_leaks()
    record["scope_records"] = 1
    record["sizes"]["scope_infos"] = 1
    assert set(soak.end_problems(record)) == {"scope_records", "sizes.scope_infos"}
    stream = _clean_leaks()
    stream["api_sizes"]["streams"] = 1
    assert set(soak.end_problems(stream)) == {"api_streams"}


def _sample(t: float, **sizes: int) -> dict[str, Any]:
    live = sizes.pop("live", 10)
    cancels = sizes.pop("cancels", 0)
    base = dict.fromkeys(soak.AT_REST_ZERO, 0)
    base.update(core_scopes=live, scope_infos=live, spy_listeners=1)
    base.update(sizes)
    return {
        "t": t,
        "sizes": base,
        "api_sizes": {"streams": 0, "tasks": 0, "output_states": 0},
        "live_scopes": live,
        "counters": dict.fromkeys(soak.COUNTERS, 0) | {"cancels": cancels},
    }


def test_the_bounds_check_sees_a_structure_over_its_bound() -> None:
    bounds = {"blocks": BLOCKS, "core_ledger": 1024}
    fine = [_sample(t, core_pages=100, requests=20) for t in range(0, 60, 3)]
    assert soak.bound_problems(fine, bounds, CFG) == []
    over = copy.deepcopy(fine)
    over[5]["sizes"]["ledger_refs"] = BLOCKS + 1
    over[7]["api_sizes"]["output_states"] = 10_000
    over[9]["sizes"]["requests"] = 3 * CFG.clients + 11  # 10 live scopes: one too many
    found = soak.bound_problems(over, bounds, CFG)
    assert len(found) == 3
    assert any("ledger_refs" in p for p in found) and any("output_states" in p for p in found)


def test_the_bounds_check_sees_cancelled_scopes_never_forgotten() -> None:
    """Scopes cancelled at a steady rate and forgotten one ttl later keep the records flat;
    records that are never forgotten pile up beyond what the last window cancelled."""
    bounds = {"blocks": BLOCKS, "core_ledger": 1024}
    window = CFG.ttl_s + soak.sweep_period(CFG.ttl_s) + 10 + CFG.sample_s
    forgotten, kept = [], []
    for t in range(0, 120, 3):
        cancels = 2 * t  # two scopes a second
        gone = 2 * max(0, int(t - CFG.ttl_s - soak.sweep_period(CFG.ttl_s)))
        forgotten.append(_sample(t, live=10, cancels=cancels, core_scopes=10 + cancels - gone))
        kept.append(_sample(t, live=10, cancels=cancels, core_scopes=10 + cancels))
    assert soak.bound_problems(forgotten, bounds, CFG) == []
    late = soak.bound_problems(kept, bounds, CFG)
    assert late and all(float(p.split("s:")[0][2:]) >= window for p in late)


def test_the_growth_detector_tells_flat_from_growing_memory() -> None:
    flat = [(t, 500 * MIB + (t * 7919 % 13) * MIB) for t in range(0, 600, 5)]
    growing = [(t, 500 * MIB + t * 0.2 * MIB) for t in range(0, 600, 5)]  # 120 MiB in the run
    g_flat, g_grow = soak.growth(flat), soak.growth(growing)
    assert g_flat is not None and g_grow is not None
    assert abs(g_flat["delta"]) < 8 * MIB and g_grow["delta"] > 40 * MIB  # 225 s apart
    assert g_grow["slope_per_h"] == pytest.approx(0.2 * 3600 * MIB)
    assert soak.growth(flat[:4]) is None  # too few samples after start-up
    report = {
        "errors": {},
        "ends": {"superseded": 3},
        "bound_problems": [],
        "leaks_at_end": {},
        "supersede_ms": {"n": 3},
        "rss_growth": {"api": g_flat, "engine_core": g_grow},
    }
    assert soak.verdict(report, None) == []  # memory not judged
    problems = soak.verdict(report, 32)
    assert len(problems) == 1 and problems[0].startswith("engine_core: RSS grew")
    report["rss_growth"]["engine_core"] = g_flat
    assert soak.verdict(report, 32) == []
    report["errors"] = {"stall": 1}
    report["ends"]["eos"] = 1
    assert len(soak.verdict(report, 32)) == 2


def test_the_generation_spy_is_bounded_by_the_pool_not_by_the_run() -> None:
    """Every allocation of a block whose prefix-cache hash vLLM drops is an eviction: the spy
    counts them, and remembers each block id once (it kept a list of every eviction ever,
    which a server that runs for hours grew without end)."""
    from retire_vllm.introspect import GenerationSpy

    blocks = [
        SimpleNamespace(block_id=i, block_hash=f"h{i}", next_free_block=None) for i in range(8)
    ]
    for a, b in itertools.pairwise(blocks):
        a.next_free_block = b
    head = SimpleNamespace(next_free_block=blocks[0])
    pool = SimpleNamespace(
        free_block_queue=SimpleNamespace(fake_free_list_head=head),
        get_new_blocks=lambda n: blocks[:n],
    )
    spy = GenerationSpy(pool).install()  # type: ignore[arg-type]
    for _ in range(1000):
        pool.get_new_blocks(4)
    assert spy.evictions == 4000
    assert spy.evicted == {0, 1, 2, 3} and len(spy.generation) == 4
    assert spy.gen(0) == 1000


@pytest.fixture(scope="module")
def soak_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RetireServer]:
    server = soak.start_server(tmp_path_factory.mktemp("retire-soak"), CFG, BLOCKS, log=False)
    try:
        yield server
    finally:
        server.close()


def test_short_soak_ends_clean_and_stays_within_bounds(soak_server: RetireServer) -> None:
    report = soak.soak(soak_server, CFG)
    summary = {k: report[k] for k in ("requests", "bursts", "ends", "errors", "error_samples")}
    assert report["errors"] == {}, summary
    assert set(report["ends"]) <= soak.KNOWN_ENDS, summary
    assert report["bound_problems"] == [], report["bound_problems"][:10]
    assert report["leaks_at_end"] == {}, report["leaks_at_end"]
    assert soak.verdict(report, None) == []
    # the load did what a soak is for (on a starved machine too): revisions superseded running
    # versions and inherited their blocks, scopes finished, were cancelled and closed, idle
    # scopes expired and cancelled ones were forgotten while the load ran
    ends = report["ends"]
    assert ends["superseded"] >= 20 and ends["length"] > 0
    assert ends["cancelled"] > 0 and ends["closed"] > 0
    during = report["after_load"]["counters"]
    assert during["forgotten"] > 0 and during["expired"] > 0
    assert report["counters_at_end"]["adopted_blocks"] > 0
    # every sample answered with every structure, and memory figures for both processes
    assert len(report["samples"]) >= 5
    assert all(s["rss_api"] and s["rss_engine"] for s in report["samples"])
    print("\n" + soak.table(report, []))
