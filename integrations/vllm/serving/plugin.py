"""The ``vllm.general_plugins`` entry point: Retire's one utility method on vLLM's engine core.

vLLM loads general plugins in every process it starts (``load_general_plugins`` in
``EngineCore.__init__`` and in each worker). The API process reaches code in the engine-core
process only through utility calls, which ``EngineCore`` dispatches by method name
(``getattr(self, method_name)``); ``register`` adds one method, ``retire_call``, that forwards to
the scheduler's ``EngineSide``. It replaces nothing of vLLM's: no existing method is wrapped or
changed, and ``hooks`` checks that the dispatch by name still exists.
"""

from __future__ import annotations

from typing import Any

from . import wire


def retire_call(engine_core: Any, op: str, payload: dict[str, Any]) -> Any:
    side = getattr(engine_core.scheduler, "retire_side", None)
    if side is None:
        return {
            "ok": False,
            "error": "NotInstalled",
            "message": "the engine core's scheduler is not Retire's (start it with retire serve, "
            "or --scheduler-cls retire_vllm.serving.scheduler.RetireServingScheduler)",
        }
    return side.call(engine_core, op, payload)


def register() -> None:
    from vllm.v1.engine.core import EngineCore

    if getattr(EngineCore, wire.UTILITY, None) is None:
        setattr(EngineCore, wire.UTILITY, retire_call)
