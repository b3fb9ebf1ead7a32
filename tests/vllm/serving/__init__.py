"""The tests of ``retire serve`` that share one server (``conftest``): requests without a scope,
the handoff and the publication trials; races; the scope API and its edges. The serving tests
that need a server of their own (speculative decoding, data parallelism, KV cache groups, KV
connectors, TP=2, turns) live beside this package, in ``tests/vllm/test_serving_*.py``."""
