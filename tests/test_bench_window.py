"""``retire_bench.window`` reads vLLM's KV cache use from a ``/metrics`` text (its servers are
started only by the benchmark itself: results 4.9)."""

from __future__ import annotations

from retire_bench.window import kv_usage

METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 4.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.3131
"""


def test_the_kv_cache_use_is_read_from_vllms_gauge() -> None:
    assert kv_usage(METRICS) == 0.3131
    assert kv_usage(METRICS.split("# HELP vllm:kv_cache_usage_perc")[0]) is None
