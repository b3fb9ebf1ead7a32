"""Handoff under cache pressure: how much of the common prefix a successor really reuses.

Grid: prompt length x common-prefix fraction x co-tenant eviction pressure (nine points, 0 to 1
in eighths, like the paper's nine pressure points), each cell run as a quartet (``Grid.trials``
= 4 trials, as the paper; each trial with prompts of its own, so no trial finds another's prefix
in the cache) and reported with its spread (``points``: median, min and max over the trials).
One trial, driven identically through the ``ReplacementEngine`` API for native abort+resubmit
and for Retire:

1. scope ``h`` is submitted with prompt ``P`` (``L`` tokens) and runs until its consumer has read
   a few tokens (its prompt blocks are complete and in the prefix cache);
2. co-tenant scopes are submitted -- prompts of 8 blocks, one output token each -- demanding
   ``pressure x usable pool`` KV blocks in total; they are queued *ahead* of the successor;
3. ``h`` is revised to ``S`` = the first ``K = floor(f L)`` tokens of ``P`` plus ``L - K`` new
   tokens (the divergence rule of ``docs/traces.md`` makes the common prefix exactly ``K``);
4. the engine runs until ``S`` has produced its tokens, the consumer reading after every step.

Measured per trial, by the harness: successor TTFT (revision to first token read, in milliseconds
and in engine steps -- the step count does not depend on how busy the CPU is), the prefix
tokens vLLM reports as cached for ``S`` (``num_cached_tokens`` of its request state, read
from vLLM's output processor after the first step that produced output) and hence the
recomputed prefill tokens ``len(S) - cached``, and whether ``S``'s output equals its clean cold
reference. Native reuse is opportunistic: abort frees ``P``'s blocks into vLLM's LRU free queue
and co-tenant allocations evict them tail-first. Retire pins the certified prefix until the
successor adopts it.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

import attrs

from retire_bench.reference import clean_reference
from retire_bench.replay import CONTENDED_PROBE_MS, FIRST_ID, RequestSpy, cpu_probe_ms
from retire_bench.systems import LABELS, make_system, prepare_env
from retire_bench.traces import (
    EditContext,
    TokenSpec,
    derive_seed,
    expand_tokens,
    materialize_context,
)

BLOCK = 32
CO_TENANT_BLOCKS = 8
TRIAL_LIMIT_S = 30.0  # a successor that has not finished by then is reported as such


@attrs.frozen
class Grid:
    prompt_tokens: tuple[int, ...] = (256, 1024)
    prefix_fractions: tuple[float, ...] = (0.5, 0.9)
    pressures: tuple[float, ...] = tuple(k / 8 for k in range(9))
    num_blocks: int = 96
    predecessor_tokens: int = 4  # tokens the consumer reads from P before the revision
    successor_max_tokens: int = 16
    seed: int = 0
    trials: int = 4  # per cell: the paper's quartets


def demo_grid() -> Grid:
    return Grid()


def full_grid() -> Grid:
    return Grid(prompt_tokens=(256, 1024, 2048), prefix_fractions=(0.25, 0.5, 0.9), num_blocks=160)


def _contract() -> Any:
    from retire_core import Contract

    return Contract()


def _prompts(
    grid: Grid, length: int, frac: float, pressure: float, trial: int, vocab: int
) -> dict[str, Any]:
    # (the first trial keeps the seeds of the single-trial grid, so its cells are unchanged)
    base = ("handoff", grid.seed, length, frac, pressure, *((trial,) if trial else ()))
    p = expand_tokens(
        TokenSpec(derive_seed(*base, "P"), length), vocab_size=vocab, first_id=FIRST_ID
    )
    keep = int(frac * length)
    s = materialize_context(
        EditContext(keep, TokenSpec(derive_seed(*base, "S"), length - keep)),
        p,
        vocab_size=vocab,
        first_id=FIRST_ID,
    )
    usable = grid.num_blocks - 1
    demand = round(pressure * usable)
    co = []
    left = demand
    j = 0
    while left > 0:
        blocks = min(CO_TENANT_BLOCKS, left)
        # blocks*32 tokens occupy exactly `blocks` blocks at prefill (the sampled token needs none)
        co.append(
            expand_tokens(
                TokenSpec(derive_seed(*base, "co", j), blocks * BLOCK),
                vocab_size=vocab,
                first_id=FIRST_ID,
            )
        )
        left -= blocks
        j += 1
    certifiable = min(keep // BLOCK, (len(s) - 1) // BLOCK) * BLOCK
    return {"P": p, "S": s, "co": co, "keep": keep, "demand": demand, "certifiable": certifiable}


def run_trial(
    system: Any, trial: str, spec: dict[str, Any], grid: Grid, checker: Any = None
) -> dict[str, Any]:
    clock = time.perf_counter
    engine = system.engine
    states = engine.output_processor.request_states
    spy = RequestSpy(engine, {("S", 0): tuple(spec["S"])}, clock)
    contract = _contract()
    scope = f"h{trial}"
    system.submit(scope, list(spec["P"]), contract, grid.predecessor_tokens + 64)
    got = 0
    for _ in range(100_000):
        system.step()
        got += sum(len(d.token_ids) for d in system.consume(scope))
        if got >= grid.predecessor_tokens:
            break
    for j, prompt in enumerate(spec["co"]):
        # other tenants' traffic: plain vLLM requests, not under either replacement scheme
        system.add_external(f"c{trial}-{j}", list(prompt), 1)
    t_rev = clock()
    version = system.supersede(scope, list(spec["S"]), contract, grid.successor_max_tokens)
    ttft = None
    tokens: list[int] = []
    cached = None
    finished = False
    stale = 0
    deadline = clock() + TRIAL_LIMIT_S
    steps = 0
    ttft_steps = None
    while clock() < deadline:
        if system.has_unfinished():
            system.step()
            steps += 1
        for rid in spy.ids.get(("S", 0), ()):
            st = states.get(rid)
            if cached is None and st is not None and not st.is_prefilling:
                cached = int(st.num_cached_tokens)
        for d in system.consume(scope):
            if d.version != version:
                stale += len(d.token_ids)
                continue
            if d.token_ids and ttft is None:
                ttft = clock() - t_rev
                ttft_steps = steps
            tokens.extend(d.token_ids)
            finished = finished or d.finished
        if finished and not system.has_unfinished():
            break
    details: dict[str, Any] = {}
    rec_fn = getattr(system, "version_record", None)
    if callable(rec_fn):
        try:
            rec = rec_fn(scope, version)
            for name in ("adopted_blocks", "num_cached_tokens"):
                if hasattr(rec, name):
                    details[f"system_{name}"] = getattr(rec, name)
        except Exception:
            pass
    if checker is not None and isinstance(getattr(system, "records", None), dict):
        # Retire: the project's checker judges output, adopted pages (generation, digests,
        # bytes against the clean reference's KV) and the predecessor's receipts.
        try:
            verdict = checker.verify(system, scope, version)
            details["checker_ok"] = bool(verdict.ok)
            problems = verdict.problems
            details["checker_problems"] = list(problems() if callable(problems) else problems)
        except Exception as err:
            details["checker_ok"] = False
            details["checker_problems"] = [f"checker raised {type(err).__name__}: {err}"]
    # End of trial: the scope is done; cancel it so that neither system keeps its pages.
    system.cancel(scope)
    for _ in range(100_000):
        if not system.has_unfinished():
            break
        system.step()
    return {
        "ttft_ms": None if ttft is None else ttft * 1000.0,
        "ttft_steps": ttft_steps,
        "cached_tokens": cached,
        "tokens": tokens,
        "stale_tokens_read": stale,
        "finished": finished,
        **details,
    }


def run_grid(
    grid: Grid,
    systems: Sequence[str],
    *,
    model_path: str | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    from retire_vllm.default_model import VOCAB_SIZE

    t0 = time.perf_counter()
    groups = [(length, frac) for length in grid.prompt_tokens for frac in grid.prefix_fractions]
    if grid.trials < 1:
        raise ValueError(f"a grid needs at least one trial per cell, got {grid.trials}")
    specs = {
        (length, frac, x, t): _prompts(grid, length, frac, x, t, VOCAB_SIZE)
        for length, frac in groups
        for x in grid.pressures
        for t in range(grid.trials)
    }
    overrides = {"num_blocks": grid.num_blocks}
    reference = clean_reference(
        {k: tuple(v["S"]) for k, v in specs.items()},
        {k: grid.successor_max_tokens for k in specs},
        model_path=model_path,
        engine_overrides=overrides,
    )
    checker = None
    if "retire" in systems:
        checker = _checker(
            [tuple(v["S"]) for v in specs.values()],
            grid.successor_max_tokens,
            model_path,
            overrides,
        )
    bar = None
    if progress:
        try:
            from tqdm import tqdm  # type: ignore[import-untyped]

            bar = tqdm(total=len(specs) * len(systems), desc="handoff grid", file=sys.stderr)
        except ModuleNotFoundError:  # pragma: no cover
            bar = None
    cells: list[dict[str, Any]] = []
    n = 0
    for length, frac in groups:
        for name in systems:  # A/B per group, fresh engine per (group, system)
            system = make_system(name, model_path, engine_overrides=overrides)
            # trial by trial across the pressures, so a slow spell of the machine spreads over
            # the cells instead of falling on one
            for t, x in [(t, x) for t in range(grid.trials) for x in grid.pressures]:
                spec = specs[(length, frac, x, t)]
                n += 1
                probe = cpu_probe_ms()
                out = run_trial(system, f"{n}", spec, grid, checker)
                ref = list(reference[(length, frac, x, t)])
                cached = out["cached_tokens"]
                cells.append(
                    {
                        "system": name,
                        "prompt_tokens": length,
                        "prefix_fraction": frac,
                        "pressure": x,
                        "trial": t,
                        "co_tenant_blocks": spec["demand"],
                        "common_prefix_tokens": spec["keep"],
                        "certifiable_tokens": spec["certifiable"],
                        "reused_tokens": cached,
                        "recomputed_prefill_tokens": None
                        if cached is None
                        else len(spec["S"]) - cached,
                        "ttft_ms": out["ttft_ms"],
                        "ttft_steps": out["ttft_steps"],
                        "cpu_probe_ms": probe,
                        "output_matches_reference": out["tokens"] == ref,
                        "stale_tokens_read": out["stale_tokens_read"],
                        **{k: v for k, v in out.items() if k.startswith(("system_", "checker_"))},
                    }
                )
                if bar is not None:
                    bar.update(1)
            close_error = None
            try:
                system.close()
            except Exception as err:
                close_error = f"{type(err).__name__}: {err}"
            for c in cells:
                if (
                    c["system"] == name
                    and c["prompt_tokens"] == length
                    and c["prefix_fraction"] == frac
                ):
                    c["close_error"] = close_error
            shutdown = getattr(getattr(system.engine, "engine_core", None), "shutdown", None)
            if callable(shutdown):
                shutdown()
            del system
    if bar is not None:
        bar.close()
    admitted = all(
        c["output_matches_reference"]
        and c.get("close_error") is None
        and c.get("checker_ok", c["system"] != "retire")
        for c in cells
    )
    return {
        "schema": "retire-handoff-results/1",
        "checker_admitted": admitted,
        "grid": attrs.asdict(grid),
        "systems": list(systems),
        "cells": cells,
        "points": points(cells),
        "all_outputs_match": all(c["output_matches_reference"] for c in cells),
        "wall_s": time.perf_counter() - t0,
    }


def _spread(values: list[Any]) -> dict[str, Any]:
    got = sorted(v for v in values if v is not None)
    if not got:
        return {"median": None, "min": None, "max": None}
    return {"median": statistics.median(got), "min": got[0], "max": got[-1]}


def points(cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One point per (system, prompt length, prefix fraction, pressure): the cell's trials
    aggregated, reused tokens and TTFT (steps and ms) as median, min and max."""
    keys = ("system", "prompt_tokens", "prefix_fraction", "pressure")
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for c in cells:
        groups.setdefault(tuple(c[k] for k in keys), []).append(c)
    out = []
    for key, trials in groups.items():
        out.append(
            {
                **dict(zip(keys, key, strict=True)),
                "certifiable_tokens": trials[0]["certifiable_tokens"],
                "trials": len(trials),
                "reused_tokens": _spread([c["reused_tokens"] for c in trials]),
                "ttft_steps": _spread([c["ttft_steps"] for c in trials]),
                "ttft_ms": _spread([c["ttft_ms"] for c in trials]),
            }
        )
    return out


def _checker(
    prompts: list[tuple[int, ...]],
    max_tokens: int,
    model_path: str | None,
    overrides: dict[str, Any],
) -> Any:
    try:
        from retire_vllm.checker import Checker
    except ImportError:
        return None
    from retire_vllm.engine_config import build_engine

    engine = build_engine(model_path, **overrides)
    checker = Checker(engine)
    checker.references([(p, max_tokens) for p in prompts])
    shutdown = getattr(engine.engine_core, "shutdown", None)
    if callable(shutdown):
        shutdown()
    return checker


def _ranges(doc: dict[str, Any], system: str, field: str) -> list[float]:
    pts = doc.get("points") or points(doc["cells"])
    return [
        p[field]["max"] - p[field]["min"]
        for p in pts
        if p["system"] == system and p[field]["min"] is not None
    ]


def _range_median(doc: dict[str, Any], system: str, field: str) -> float | None:
    got = _ranges(doc, system, field)
    return statistics.median(got) if got else None


def _range_max(doc: dict[str, Any], system: str, field: str) -> float | None:
    got = _ranges(doc, system, field)
    return max(got) if got else None


def summary(doc: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "all_outputs_match": doc["all_outputs_match"],
        "checker_admitted": doc.get("checker_admitted"),
    }
    for name in doc["systems"]:
        cells = [c for c in doc["cells"] if c["system"] == name]
        reusable = sum(c["certifiable_tokens"] for c in cells)
        reused = sum(c["reused_tokens"] or 0 for c in cells)
        ttft = sorted(c["ttft_ms"] for c in cells if c["ttft_ms"] is not None)
        steps = sorted(c["ttft_steps"] for c in cells if c["ttft_steps"] is not None)
        out[name] = {
            "reused_share_of_reusable": reused / reusable if reusable else None,
            "recomputed_prefill_tokens": sum(c["recomputed_prefill_tokens"] or 0 for c in cells),
            "ttft_ms_median": ttft[len(ttft) // 2] if ttft else None,
            "ttft_steps_median": steps[len(steps) // 2] if steps else None,
            "ttft_steps_max": steps[-1] if steps else None,
            # how far a cell's trials lie apart: the median over its cells of max - min
            "ttft_ms_trial_range_median": _range_median(doc, name, "ttft_ms"),
            "reused_tokens_trial_range_max": _range_max(doc, name, "reused_tokens"),
            "contended_cells": sum(c["cpu_probe_ms"] > CONTENDED_PROBE_MS for c in cells),
            "cells": len(cells),
        }
    return out


def _median_cell(point: dict[str, Any]) -> str:
    m = point["reused_tokens"]["median"]
    return "-" if m is None else f"{m:g}"


def table(doc: dict[str, Any]) -> str:
    """Reused prefix tokens per pressure point, one row per (system, length, fraction)."""
    pressures = doc["grid"]["pressures"]
    head = f"{'handoff: tokens reused (of reusable)':<44}" + "".join(
        f"{p:>6.2f}" for p in pressures
    )
    lines = [head, "-" * len(head)]
    pts = doc.get("points") or points(doc["cells"])
    groups = sorted({(c["prompt_tokens"], c["prefix_fraction"]) for c in pts})
    spread = []
    for length, frac in groups:
        for name in doc["systems"]:
            row = sorted(
                (c["pressure"], c)
                for c in pts
                if c["system"] == name
                and c["prompt_tokens"] == length
                and c["prefix_fraction"] == frac
            )
            if not row:
                continue
            label = f"{LABELS[name]}, L={length}, f={frac} ({row[0][1]['certifiable_tokens']})"
            lines.append(f"{label:<44}" + "".join(f"{_median_cell(c):>6}" for _, c in row))
            spread += [
                f"{LABELS[name]}, L={length}, f={frac}, pressure {x:.2f}: "
                f"{c['reused_tokens']['min']}-{c['reused_tokens']['max']}"
                for x, c in row
                if c["reused_tokens"]["min"] != c["reused_tokens"]["max"]
            ]
    trials = sorted({c["trials"] for c in pts})
    lines.append(
        f"(median of {'/'.join(map(str, trials))} trials per cell; "
        + (
            "reuse differed between trials in: " + "; ".join(spread) + ")"
            if spread
            else "every trial of a cell reused the same)"
        )
    )
    s = summary(doc)
    lines.append("")
    for name in doc["systems"]:
        share = s[name]["reused_share_of_reusable"]
        lines.append(
            f"{LABELS[name]}: reused {share:.0%} of the reusable prefix over the grid, "
            f"recomputed {s[name]['recomputed_prefill_tokens']} prefill tokens, "
            f"successor TTFT median {s[name]['ttft_ms_median']:.0f} ms (a cell's trials "
            f"{s[name]['ttft_ms_trial_range_median']:.0f} ms apart, median) / "
            f"{s[name]['ttft_steps_median']} engine steps (max {s[name]['ttft_steps_max']}); "
            f"{s[name]['contended_cells']}/{s[name]['cells']} cells on a contended CPU"
            if share is not None and s[name]["ttft_ms_median"] is not None
            else f"{LABELS[name]}: -"
        )
    lines.append(
        f"successor output equals the clean reference in every cell: {doc['all_outputs_match']}; "
        f"checker admitted every cell: {doc.get('checker_admitted')}"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import argparse
    import json
    from pathlib import Path

    ap = argparse.ArgumentParser(prog="python -m retire_bench.handoff", description=__doc__)
    ap.add_argument("--system", choices=("native", "retire", "both"), default="both")
    ap.add_argument("--full", action="store_true", help="the larger grid (slower)")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--plot", type=Path, default=None)
    args = ap.parse_args(argv)
    prepare_env()
    systems = ["native", "retire"] if args.system == "both" else [args.system]
    doc = run_grid(full_grid() if args.full else demo_grid(), systems)
    print(table(doc))
    if args.json:
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
    if args.plot:
        from retire_bench.plots import handoff_plot

        handoff_plot(doc, args.plot)
    return 0 if doc["checker_admitted"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
