"""Retire's vLLM integration (import name ``retire_vllm``), built against vLLM 0.32.0 on CPU.

``default_model`` builds the tiny deterministic test model, ``engine_config`` holds the engine
settings known to work on CPU and an in-process engine builder, ``introspect`` is the single place
that reaches into vLLM internals (scheduler, KV cache manager, block pool, worker KV tensors),
``hooks`` lists and checks every vLLM symbol relied on, and ``experiments`` reproduces the findings
in ``docs/vllm_research.md``.  ``install_cpu.sh`` installs the pinned CPU build.  Importing this
package does not import vLLM or torch.
"""
