"""An engine whose model mixes attention types is refused before Retire attaches.

The ``hybrid`` default model (a tiny Llama: one sliding-window layer, one full-attention layer)
makes vLLM build two KV cache groups; a sliding-window group hands a request the null block for
positions outside its window, and its pages are not the prefix state Retire certifies. Until groups
are a dimension of the protocol, ``RetireEngine`` must refuse such an engine with a clear
``IntegrationError`` and leave it untouched (before this check it failed mid-run, naming block 0).
"""

from __future__ import annotations

import pytest

from retire_vllm import introspect as ix
from retire_vllm.default_model import ensure_default_model
from retire_vllm.errors import IntegrationError
from tests.vllm.support import build, shutdown

pytestmark = pytest.mark.vllm


def test_two_kv_cache_groups_are_refused_before_attaching() -> None:
    from retire_vllm.facade import RetireEngine

    engine = build(
        num_blocks=256, model=str(ensure_default_model(size="hybrid")), max_model_len=2048
    )
    try:
        groups = ix.kv_cache_manager(engine).kv_cache_config.kv_cache_groups
        assert len(groups) == 2
        with pytest.raises(IntegrationError, match="2 KV cache groups"):
            RetireEngine(engine=engine)
        assert ix.scheduler(engine).retire_hooks is None  # nothing attached
    finally:
        shutdown(engine)
