"""Clean reference outputs and run admission.

:func:`clean_reference` runs every prompt of a replay cold -- a fresh in-process engine with the
same settings as the arms, prefix caching off, greedy, fixed length -- and returns the token ids
each version must produce. :func:`admit` decides whether a run's numbers count: the current-version
output must match the reference (``metrics.output_problems``), the system must close without a
leak, the harness must not have seen a request launched for a version it had already retired, and,
for Retire, the project's checker (``retire_vllm.checker``, when it is installed) must accept the
run's page ownership, digests and receipts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import attrs

from retire_bench.metrics import RunRecord, output_problems

Key = tuple[str, int]
K = TypeVar("K", bound=tuple[Any, ...])  # (scope, version) in a replay; a cell of the handoff grid


def clean_reference(
    prompts: Mapping[K, Sequence[int]],
    max_tokens: Mapping[K, int],
    *,
    model_path: str | None = None,
    engine_overrides: Mapping[str, Any] | None = None,
) -> dict[K, tuple[int, ...]]:
    """Greedy outputs of every prompt, cold, in one batch (outputs are batch-invariant here)."""
    from vllm import RequestOutput

    from retire_vllm.engine_config import build_engine, greedy

    overrides = dict(engine_overrides or {})
    overrides["enable_prefix_caching"] = False
    engine = build_engine(model_path, **overrides)
    ids: dict[str, K] = {}
    for n, key in enumerate(sorted(prompts)):
        rid = engine.add_request(
            f"ref-{n}", {"prompt_token_ids": list(prompts[key])}, greedy(max_tokens[key])
        )
        ids[rid] = ids[f"ref-{n}"] = key  # outputs carry the external id
    out: dict[K, tuple[int, ...]] = {}
    for _ in range(1_000_000):
        if not engine.has_unfinished_requests():
            break
        for o in engine.step():
            if o.finished and isinstance(o, RequestOutput):  # (never a pooling output here)
                out[ids[o.request_id]] = tuple(o.outputs[0].token_ids)
    shutdown = getattr(engine.engine_core, "shutdown", None)
    if shutdown is not None:
        shutdown()
    missing = set(prompts) - set(out)
    if missing:
        raise RuntimeError(f"reference run did not finish {sorted(missing)}")
    return out


@attrs.frozen
class Admission:
    admitted: bool
    problems: tuple[str, ...]
    checker: str  # "retire_vllm.checker", "harness" (no project checker for this system), ...

    def to_json(self) -> dict[str, Any]:
        return {"admitted": self.admitted, "problems": list(self.problems), "checker": self.checker}


def admit(
    record: RunRecord,
    reference: Mapping[Key, Sequence[int]],
    *,
    close_error: str | None = None,
    harness_problems: Sequence[str] = (),
    facade_verdict: Any = None,
    needs_facade_verdict: bool = False,
) -> Admission:
    problems = list(output_problems(record, dict(reference)))
    problems.extend(harness_problems)
    if close_error:
        problems.append(f"close() failed: {close_error}")
    checker = "harness"
    if needs_facade_verdict:
        checker = "retire_vllm.checker"
        if facade_verdict is None:
            problems.append("retire_vllm.checker gave no verdict (not installed?)")
        else:
            ok, why = verdict_ok(facade_verdict)
            if not ok:
                problems.extend(f"checker: {w}" for w in why or ["rejected the run"])
    return Admission(not problems, tuple(problems), checker)


def verdict_ok(verdict: Any) -> tuple[bool, list[str]]:
    """Read the checker's verdict object: ``admitted``/``ok`` flag plus ``problems``/``reasons``."""
    flag = None
    for name in ("admitted", "ok", "passed"):
        if hasattr(verdict, name):
            flag = getattr(verdict, name)
            break
    if flag is None and isinstance(verdict, Mapping):
        flag = verdict.get("admitted", verdict.get("ok"))
    why: list[str] = []
    for name in ("problems", "reasons", "failures"):
        value = getattr(verdict, name, None)
        if value is None and isinstance(verdict, Mapping):
            value = verdict.get(name)
        if value:
            why = [str(v) for v in value]
            break
    return bool(flag), why
