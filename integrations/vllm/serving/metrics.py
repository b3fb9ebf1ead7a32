"""Retire's metrics in Prometheus' text format, appended to vLLM's own ``/metrics``.

The counters live where they are counted: the engine side's (revisions, frames dropped at the
engine boundary and at the commit gate, adopted and recomputed blocks, fences still draining,
cleanup latency, the engine core's time in Retire's hooks and in steps) come back from one
``metrics`` utility call, the API process's (``records.ApiAccount``: outputs gated, those
dropped behind a fence at the consumer boundary, its time in Retire's per-output code) are read
locally. Every name starts with ``retire_``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)


class _Snapshot:
    def __init__(self, engine: dict[str, Any], api: dict[str, Any]) -> None:
        self.engine = engine
        self.api = api

    def collect(self) -> Iterator[Metric]:
        counters: dict[str, int] = self.engine["counters"]

        def counter(name: str, help_text: str, key: str) -> CounterMetricFamily:
            return CounterMetricFamily(name, help_text, value=counters.get(key, 0))

        yield counter("retire_supersedes", "revisions accepted (ADVANCE)", "supersedes")
        yield counter("retire_submits", "scopes opened", "submits")
        yield counter("retire_cancels", "scopes cancelled (expired ones included)", "cancels")
        yield counter("retire_expired_scopes", "idle scopes cancelled by expiry", "expired")
        yield counter(
            "retire_forgotten_scopes", "cancelled scopes whose record expiry dropped", "forgotten"
        )
        dropped = CounterMetricFamily(
            "retire_obsolete_frames_dropped",
            "frames of retired versions dropped, by the boundary that dropped them",
            labels=["boundary"],
        )
        dropped.add_metric(["engine"], counters.get("frames_dropped_engine", 0))
        dropped.add_metric(["commit"], counters.get("commits_dropped", 0))
        dropped.add_metric(["consumer"], self.api["dropped_outputs"])
        yield dropped
        yield counter("retire_adopted_blocks", "blocks successors inherited", "adopted_blocks")
        yield counter(
            "retire_preemptions",
            "scoped requests vLLM preempted (their pages freed; run again from the start)",
            "preemptions",
        )
        yield counter(
            "retire_blocks_released_to_cache",
            "blocks given back to vLLM's prefix cache (finished versions', passed windows')",
            "blocks_released_to_cache",
        )
        yield counter(
            "retire_window_blocks_passed",
            "blocks of running versions a sliding window passed (given back to the cache)",
            "window_blocks_passed",
        )
        yield counter(
            "retire_cached_blocks_evicted",
            "blocks given back to the cache that vLLM evicted",
            "cached_blocks_evicted",
        )
        yield counter(
            "retire_recomputed_blocks",
            "prefix blocks a successor computed instead of inheriting",
            "recomputed_blocks",
        )
        yield counter(
            "retire_verification_failures",
            "certified blocks whose bytes or generation changed before adoption",
            "verification_failures",
        )
        yield counter(
            "retire_blocks_digested_in_step",
            "blocks whose writer closed with the digest the workers took within the step that "
            "filled them (step_digests' connector), not by a round trip after it",
            "step_digests",
        )
        early = CounterMetricFamily(
            "retire_early_fences",
            "fenced requests whose stream the open socket's thread ended at once, by whether a "
            "step was running then (early_opens)",
            labels=["during"],
        )
        early.add_metric(["step"], counters.get("fences_during_step", 0))
        early.add_metric(["between_steps"], counters.get("fences_between_steps", 0))
        yield early
        yield counter(
            "retire_early_opens",
            "opens decided by the open socket's thread (the rest by their utility call)",
            "early_opens",
        )
        yield GaugeMetricFamily(
            "retire_fences_in_progress",
            "participants of retired versions that still owe a receipt",
            value=self.engine["fences_in_progress"],
        )
        yield GaugeMetricFamily(
            "retire_live_scopes", "scopes not cancelled", value=self.engine["live_scopes"]
        )
        engine_time = self.engine["engine_time"]
        hooks = CounterMetricFamily(
            "retire_engine_hook_seconds",
            "engine-core time spent in Retire's hooks, by hook (the schedule and commit hooks "
            "run inside steps; utility calls and added requests between them)",
            labels=["hook"],
        )
        for hook, seconds in engine_time["hooks"].items():
            hooks.add_metric([hook], seconds)
        yield hooks
        yield CounterMetricFamily(
            "retire_engine_step_seconds",
            "wall time of the engine core's steps, from the schedule to the end of the commit "
            "(the model's forward pass included)",
            value=engine_time["step_seconds"],
        )
        yield CounterMetricFamily(
            "retire_engine_steps", "engine-core steps Retire observed", value=engine_time["steps"]
        )
        yield CounterMetricFamily(
            "retire_engine_worker_wait_seconds",
            "of Retire's hooks' time, the engine core's wait for the workers to digest KV blocks "
            "(the blocks a step filled, the byte check before an adoption)",
            value=engine_time["worker_seconds"],
        )
        yield CounterMetricFamily(
            "retire_engine_worker_digest_seconds",
            "the workers' time digesting, within each step, the blocks it filled (the slowest "
            "rank's; inside the forward pass's time, not in the hooks' seconds)",
            value=engine_time["worker_digest_seconds"],
        )
        api = CounterMetricFamily(
            "retire_api_seconds",
            "API-process time in Retire's per-output code, by part (gate: the publication check "
            "on each output of a scoped version; stamp: the version stamp on each response chunk)",
            labels=["part"],
        )
        for part, seconds in self.api["seconds"].items():
            api.add_metric([part], seconds)
        yield api
        yield CounterMetricFamily(
            "retire_api_outputs",
            "outputs of scoped versions that went through the publication check",
            value=self.api["outputs"],
        )
        yield CounterMetricFamily(
            "retire_api_openings_left",
            "scoped requests whose client left while their version was being opened",
            value=self.api["openings_left"],
        )
        h = self.engine["cleanup_seconds"]
        buckets = [(str(b), c) for b, c in zip(h["bounds"], h["counts"], strict=True)]
        yield HistogramMetricFamily(
            "retire_cleanup_seconds",
            "time the authority takes to carry out a revision or cancel (fence, receipts, "
            "ALIGN, admission)",
            buckets=[*buckets, ("+Inf", h["count"])],
            sum_value=h["sum"],
        )


def render(engine: dict[str, Any], api: dict[str, Any]) -> bytes:
    """Retire's metrics from the engine side's ``metrics`` answer and the API process's
    ``ApiAccount.as_dict()``."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Snapshot(engine, api))
    return generate_latest(registry)
