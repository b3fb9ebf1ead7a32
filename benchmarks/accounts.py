"""What a server spent, read from outside it: CPU seconds by process (the API process, the
engine core, its workers; psutil) and Retire's own accounts of the engine core's hooks, steps and
the API process's per-output code (``retire_engine_*`` and ``retire_api_*`` on ``/metrics``), with
``engine_share`` turning the latter into per-step figures and shares of the step. The benchmarks
that compare servers (``serving``, ``pressure``) read these beside their wall times; how a
round is driven lives in them, not here.
"""

from __future__ import annotations

from typing import Any

import httpx

from retire_vllm.serving.records import API_PARTS, ENGINE_HOOKS

from .servers import CLIENT_TIMEOUT_S, Server

#: The processes of a server whose CPU time is told apart (by vLLM's process titles; the
#: process the server was started as is its API process).
CPU_ROLES = ("api", "engine_core", "workers", "other")


def tree_cpu_seconds(pid: int) -> dict[str, float]:
    """CPU seconds (user and system) a server has spent so far, by ``CPU_ROLES``: the process
    ``pid`` (the API process) and every process under it (the engine core, its workers, vLLM's
    helpers). Unlike a latency, it counts every part of a server's work, Retire's included
    wherever it runs, and it adds up the same way however the processes were scheduled; it also
    counts busy waiting (vLLM's engine core spins on the workers' answer through the step)."""
    import psutil  # type: ignore[import-untyped]

    root = psutil.Process(pid)
    spent = dict.fromkeys(CPU_ROLES, 0.0)
    for process in [root, *root.children(recursive=True)]:
        try:
            times, name = process.cpu_times(), process.name()
        except psutil.NoSuchProcess:  # ended in between: its time is gone with it
            continue
        spent["api" if process.pid == pid else _cpu_role(name)] += times.user + times.system
    return spent


def _cpu_role(name: str) -> str:
    if name.startswith("VLLM::EngineCore"):
        return "engine_core"
    if name.startswith("VLLM::Worker"):
        return "workers"
    return "other"


async def engine_time(server: Server) -> dict[str, float]:
    """The engine core's time in Retire's hooks and in steps, so far (``retire_engine_*`` on
    ``/metrics``): seconds by hook, ``step_seconds``, ``steps``, ``worker_seconds`` (of the
    hooks' time, waiting for the workers' digests), ``worker_digest_seconds`` (the workers'
    digests taken within the steps, outside the hooks); and the API process's time in
    Retire's per-output code (``retire_api_*``): seconds by part as ``api_<part>``,
    ``api_outputs``."""
    from prometheus_client.parser import text_string_to_metric_families

    async with httpx.AsyncClient(timeout=CLIENT_TIMEOUT_S) as h:
        text = (await h.get(f"{server.base}/metrics")).text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "retire_engine_hook_seconds_total":
                out[sample.labels["hook"]] = sample.value
            elif sample.name == "retire_engine_step_seconds_total":
                out["step_seconds"] = sample.value
            elif sample.name == "retire_engine_steps_total":
                out["steps"] = sample.value
            elif sample.name == "retire_engine_worker_wait_seconds_total":
                out["worker_seconds"] = sample.value
            elif sample.name == "retire_engine_worker_digest_seconds_total":
                out["worker_digest_seconds"] = sample.value
            elif sample.name == "retire_api_seconds_total":
                out[f"api_{sample.labels['part']}"] = sample.value
            elif sample.name == "retire_api_outputs_total":
                out["api_outputs"] = sample.value
    return out


def spent_since(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    """What was spent between two readings of ``tree_cpu_seconds`` or ``engine_time``."""
    return {key: after[key] - before.get(key, 0.0) for key in after}


def engine_share(rounds: list[dict[str, Any]]) -> dict[str, float]:
    """Retire's part of the engine core's steps over ``rounds`` (their ``engine_time``): the
    in-step hooks (schedule, commit) per step and as a share of the steps' wall time, the hooks
    between steps (utility calls, added requests, requests finished from outside; and the opens
    the ``open`` thread decided, during a forward pass or between steps) per step, the
    hooks' wait for the workers' digests per step, the workers' digests within the steps per
    step and as a share; and the API process's per-output code per output, per step and as a
    share of the steps' wall time (what it adds to a step where the two processes share a CPU).
    ``retire_share``: the three shares together (schedule and commit hooks, the workers'
    digests, the API process)."""
    total: dict[str, float] = {}
    for r in rounds:
        for key, value in r["engine_time"].items():
            total[key] = total.get(key, 0.0) + value
    steps = total.get("steps", 0.0)
    if not steps:
        raise ValueError("no engine step was measured")
    in_step = total["schedule"] + total["commit"]
    between = sum(total[hook] for hook in ENGINE_HOOKS) - in_step
    api = sum(total[f"api_{part}"] for part in API_PARTS)
    nan = float("nan")
    return {
        "steps": steps,
        "step_ms": 1000 * total["step_seconds"] / steps,
        "in_step_us_per_step": 1e6 * in_step / steps,
        "in_step_share": in_step / total["step_seconds"],
        "between_steps_us_per_step": 1e6 * between / steps,
        "worker_wait_us_per_step": 1e6 * total["worker_seconds"] / steps,
        "worker_digest_us_per_step": 1e6 * total["worker_digest_seconds"] / steps,
        "worker_digest_share": total["worker_digest_seconds"] / total["step_seconds"],
        **{f"{hook}_us_per_step": 1e6 * total[hook] / steps for hook in ENGINE_HOOKS},
        "api_us_per_output": 1e6 * api / total["api_outputs"] if total["api_outputs"] else nan,
        "api_us_per_step": 1e6 * api / steps,
        "api_share": api / total["step_seconds"],
        "retire_share": (in_step + total["worker_digest_seconds"] + api) / total["step_seconds"],
    }
