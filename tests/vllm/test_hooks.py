"""The vLLM symbols the integration relies on still exist with the expected parameters.

vLLM must be importable: a missing or broken install makes these tests fail, never skip.
"""

from __future__ import annotations

import importlib

import pytest

from retire_vllm.hooks import HOOKS, VLLM_VERSION, Hook, Kind, check_hook, check_hooks

pytestmark = pytest.mark.vllm


def test_vllm_importable_at_pinned_version() -> None:
    vllm = importlib.import_module("vllm")  # ImportError here is a failure, by design
    assert vllm.__version__ == VLLM_VERSION
    from vllm import LLM, LLMEngine  # noqa: F401  (a broken torchvision breaks this import)


def test_every_hook_present() -> None:
    assert check_hooks() == []


def test_hook_list_is_not_trivial() -> None:
    kinds = {h.kind for h in HOOKS}
    assert kinds == set(Kind)
    assert len(HOOKS) > 100
    assert len({h.name for h in HOOKS}) == len(HOOKS), "duplicate hook entries"


_POOL = "vllm.v1.core.block_pool"


@pytest.mark.parametrize(
    ("mutant", "needle"),
    [
        (Hook(_POOL, "BlockPool.touch_blocks"), "missing"),
        (Hook(_POOL, "BlockPool.touch", Kind.CALLABLE, ("block_list",)), "parameters"),
        (
            Hook(_POOL, "BlockPool.free_blocks", Kind.CALLABLE, ("ordered_blocks", "x")),
            "parameters",
        ),
        (
            Hook(
                "vllm.v1.core.kv_cache_manager",
                "KVCacheManager.allocate_slots",
                Kind.CALLABLE,
                ("num_new_tokens", "request"),
            ),
            "parameters",
        ),  # order matters
        (Hook(_POOL, "BlockPool.block_generation", Kind.INSTANCE_ATTR), "no assignment"),
        (Hook("vllm.engine.arg_utils", "EngineArgs.kv_pin_budget", Kind.FIELD), "missing field"),
        (Hook("vllm.v1.engine", "EngineCoreOutput.scope_version", Kind.FIELD), "missing field"),
        (Hook("vllm.v1.core.no_such_module", "Thing"), "cannot import"),
        (Hook("vllm.v1.request", "RequestStatus.FINISHED_REVOKED", Kind.MEMBER), "missing"),
    ],
)
def test_mutant_hook_is_reported(mutant: Hook, needle: str) -> None:
    problem = check_hook(mutant)
    assert problem is not None and needle in problem, problem
    assert check_hooks([*HOOKS[:3], mutant]) == [problem]


def test_version_mismatch_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    import retire_vllm.hooks as hooks

    monkeypatch.setattr(hooks, "VLLM_VERSION", "0.0.1")
    problems = hooks.check_hooks([Hook("vllm", "__version__", Kind.MEMBER)])
    assert len(problems) == 1 and "pinned" in problems[0]


def test_the_serving_plugin_is_an_installed_general_plugin() -> None:
    """vLLM loads ``vllm.general_plugins`` in the engine-core process; Retire's entry point adds
    its utility method there, and vLLM's utility dispatch still finds methods by name."""
    import inspect
    from importlib.metadata import entry_points

    from vllm.v1.engine.core import EngineCore, EngineCoreProc

    from retire_vllm.serving import plugin, wire

    found = {ep.name: ep.value for ep in entry_points(group="vllm.general_plugins")}
    assert found.get("retire") == "retire_vllm.serving.plugin:register"
    plugin.register()
    assert getattr(EngineCore, wire.UTILITY) is plugin.retire_call
    assert "getattr(self, method_name)" in inspect.getsource(EngineCoreProc._handle_client_request)
