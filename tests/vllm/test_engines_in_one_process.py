"""Several in-process engines in one process: shutting one down leaves the others running.

vLLM keeps its distributed state (world, TP and PP groups) in module globals that every
in-process engine shares, and ``EngineCore.shutdown`` tears it down. Without
``introspect.share_distributed_state`` the shutdown (or garbage collection) of one engine broke
every other engine of the process at its next step; a ``RetireFleet``, the benchmarks' reference
engines and the test suite all keep several engines in one process.
"""

from __future__ import annotations

from typing import Any

import pytest

from retire_vllm import introspect
from retire_vllm.engine_config import build_engine, greedy
from tests.vllm.support import shutdown

pytestmark = pytest.mark.vllm


def _generate(engine: Any, rid: str) -> tuple[int, ...]:
    engine.add_request(rid, {"prompt_token_ids": [5, 6, 7, 8]}, greedy(4))
    out: tuple[int, ...] = ()
    while engine.has_unfinished_requests():
        for o in engine.step():
            if o.finished:
                out = tuple(o.outputs[0].token_ids)
    return out


def test_shutting_one_engine_down_leaves_the_other_running() -> None:
    a, b = build_engine(num_blocks=64), build_engine(num_blocks=64)
    try:
        before = _generate(b, "before")
        shutdown(a)
        assert _generate(b, "after") == before  # steps, and computes the same thing
    finally:
        shutdown(b)


def _teardowns(monkeypatch: pytest.MonkeyPatch) -> tuple[list[str], Any, Any]:
    """Two engines, with vLLM's teardown replaced by a recorder (nothing is really torn down)."""
    from vllm.v1.engine import core as core_module

    calls: list[str] = []
    monkeypatch.setattr(core_module, "cleanup_dist_env_and_memory", lambda: calls.append("x"))
    return calls, build_engine(num_blocks=64), build_engine(num_blocks=64)


def test_only_the_last_engine_tears_the_distributed_state_down(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls, a, b = _teardowns(monkeypatch)
    others = set(introspect._LIVE_CORES) - {introspect.engine_core(a), introspect.engine_core(b)}
    shutdown(a)
    assert calls == []  # b still runs
    shutdown(b)
    assert calls == ([] if others else ["x"])  # the last registered core tears it down


def test_the_check_catches_a_shutdown_that_tears_down_under_a_running_engine(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Seeded bug: the registry forgets the other engine (as if nobody had registered it)."""
    calls, a, b = _teardowns(monkeypatch)
    monkeypatch.setattr(introspect, "_LIVE_CORES", type(introspect._LIVE_CORES)())
    try:
        shutdown(a)
        assert calls == ["x"]  # the teardown the test above forbids while b runs
    finally:
        shutdown(b)


def test_an_engine_built_without_registering_is_registered_by_its_core(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A plain vLLM engine built beside a Retire one (nobody calls share_distributed_state for
    it) still counts: shutting the other engine down must leave it running."""
    a = build_engine(num_blocks=64)  # the first call installs the shared shutdown
    with monkeypatch.context() as m:
        m.setattr(introspect, "share_distributed_state", lambda engine: None)
        b = build_engine(num_blocks=64)  # as a user would build a native engine
    try:
        assert introspect.engine_core(b) in introspect._LIVE_CORES
        before = _generate(b, "before")
        shutdown(a)
        assert _generate(b, "after") == before
    finally:
        shutdown(b)
