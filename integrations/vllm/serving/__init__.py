"""Retire in vLLM's serving path (``retire serve``): the OpenAI-compatible server with scopes.

vLLM serves through two processes: an API process (``AsyncLLM``: input and output processing)
and an engine-core process (scheduler, KV cache, executor), joined by ZMQ queues. The one
``retire_core.Retire`` instance, the version authority, lives in the engine-core process beside
the scheduler (``engine_side``), where the write gate, the commit gate and every block operation
are synchronous; the API process reaches it through one utility call (``plugin``) and carries
out the authority's fences on its streams (``front_end``); ``http`` puts scopes on the standard
endpoints and adds the scope routes; ``server`` is ``retire serve``. ``wire`` names what crosses
the process boundary, ``ledger`` owns every reference Retire holds on a vLLM block, ``records``
holds the engine side's plain records, ``metrics`` renders Retire's Prometheus metrics,
``step_digests`` is the KV connector through which the workers digest the blocks a step fills
within that step. The
in-process ``retire_vllm.facade`` stays the benchmarks' deterministic driver.
"""
