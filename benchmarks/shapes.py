"""Execution shapes beside the plain path: revisions inside active speculative decoding, and on a
model with two KV cache groups.

``python -m retire_bench.shapes [--seeds 0 1 2] [--json PATH]`` runs one workload in four shapes:
the plain path on the tiny default model, speculative decoding whose draft model rejects almost
every draft (a tiny model of other weights), speculative decoding whose draft model accepts every
draft (the target itself), three drafts a step, and the ``hybrid`` default model (a sliding-window
layer and a full-attention layer: two KV cache groups; the successor adopts every block before
the cut in one and the window's last blocks in the other). Each scope is revised at one of three
moments: between steps; inside a step, after its drafts were proposed and before the model runs;
after the model verified them and before the commit. Per shape: supersede-to-last-receipt time of
every revision, the successor's reuse (blocks adopted against those of the common prefix), the
checker's verdict on every successor (tokens and adopted bytes against a clean reference that runs
the same draft model: its layers share the target's KV blocks), the draft window as the core's log
saw it, and that log validated against the spec when the facade closes. Figures count only from
runs the checker admits. The workload and its driver (``plans``, ``run_plans``) are also what
``tests/vllm/test_facade_speculative.py`` runs.

``--serving`` adds the same revisions through ``retire serve`` and the ``openai`` client, in four
server shapes: plain, speculative (rejecting draft model), two KV cache groups (the ``hybrid``
model) and data parallel 2 (two engine cores, scopes by affinity). Each predecessor streams; after
some of its tokens were read its scope is revised; the native baseline (``stock_let_run``) is stock
vLLM's server with the same client, the revision a new request and the old call left to finish
(over the hybrid model: ``stock_let_run_kv_groups`` with vLLM's defaults, ``..._dense`` with its
sliding-window prefix cache kept dense as ``retire serve`` keeps it).
Measured from the client: revision sent to the successor's completion and to the end of the old
stream (read to its end, so this includes what was already on its way; how many old versions ran to
their end is counted: all of them natively, under Retire those that ended before the revision
arrived), the successor's cached tokens against the common prefix's blocks, and its text against an
unscoped (cold) run on the same server (a successor counts as admitted only if they are equal); the
server's core logs (one per engine) validate against the spec when it closes. What does not live
here: how the integration reports drafts (``retire_vllm.observe``), the data-parallel routing
(``retire_vllm.serving``) and the campaign commands.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import attrs


@attrs.frozen
class Shape:
    """A shape's model (a default model's size) and draft model (a seed of the tiny default
    model; seed 0 is the target; None: no speculative decoding)."""

    size: str = "tiny"
    draft_seed: int | None = None
    # (two groups need twice the blocks for one request of the longest length: vLLM refuses
    # a pool that cannot hold one)
    max_model_len: int | None = None


SHAPES: dict[str, Shape] = {
    "plain": Shape(),
    "spec_rejecting": Shape(draft_seed=1),
    "spec_accepting": Shape(draft_seed=0),
    "kv_groups": Shape(size="hybrid", max_model_len=2048),
}
MOMENTS = ("between_steps", "drafts_proposed", "drafts_verified")
NUM_BLOCKS = 256
PRED_LEN, PRED_MAX, SUCC_MAX = 150, 60, 24
# (common prefix with the predecessor's prompt, successor length, predecessor tokens generated
# before the revision): block boundaries, a mid-block cut, the whole prompt.
CASES = ((64, 90, 5), (100, 130, 17), (150, 160, 30))


def speculative_config(draft_seed: int) -> dict[str, Any]:
    """vLLM's speculative decoding with the tiny default model of ``draft_seed`` as the draft
    model, three drafts a step."""
    from retire_vllm.default_model import ensure_default_model

    draft = ensure_default_model(seed=draft_seed)
    return {"method": "draft_model", "model": str(draft), "num_speculative_tokens": 3}


@attrs.frozen
class Plan:
    scope: str
    moment: str
    pred: tuple[int, ...]
    succ: tuple[int, ...]
    after: int  # predecessor tokens generated before the revision


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(1, 2048) for _ in range(n)]


def plans(seed: int) -> list[Plan]:
    """One scope per (moment, case); successors really diverge right after the common prefix."""
    rng = random.Random(seed)
    out = []
    for moment in MOMENTS:
        for lcp, n, after in CASES:
            pred = _tokens(rng, PRED_LEN)
            succ = pred[:lcp] + _tokens(rng, n - lcp)
            if lcp < len(pred):
                succ[lcp] = (pred[lcp] % 2047) + 1
            out.append(Plan(f"{moment}-l{lcp}-s{seed}", moment, tuple(pred), tuple(succ), after))
    return out


def run_plans(facade: Any, todo: Sequence[Plan], max_steps: int = 400) -> int:
    """Submit every plan's predecessor, revise each at its moment, step until idle; returns the
    steps taken. Raises if a plan was never revised."""
    from retire_core import DEFAULT_CONTRACT

    at_commit: list[Plan] = []
    before_commit = facade.before_commit

    def revise_then_commit(scheduler: Any, scheduler_output: Any) -> set[str]:
        while at_commit:  # the model has run and verified the drafts; nothing is committed yet
            p = at_commit.pop()
            facade.supersede(p.scope, list(p.succ), DEFAULT_CONTRACT, SUCC_MAX)
        return before_commit(scheduler, scheduler_output)  # type: ignore[no-any-return]

    def revise_now(f: Any, p: Plan) -> None:
        f.supersede(p.scope, list(p.succ), DEFAULT_CONTRACT, SUCC_MAX)

    facade.before_commit = revise_then_commit
    try:
        for p in todo:
            facade.submit(p.scope, list(p.pred), DEFAULT_CONTRACT, PRED_MAX)
        revised: set[str] = set()
        steps = 0
        while steps < max_steps:
            for p in todo:
                generated = len(facade.version_record(p.scope, 0).output_token_ids)
                if p.scope in revised or generated < p.after:
                    continue
                revised.add(p.scope)
                if p.moment == "between_steps":
                    revise_now(facade, p)
                elif p.moment == "drafts_proposed":
                    facade.during_next_step(lambda f, p=p: revise_now(f, p))
                else:
                    at_commit.append(p)
            if len(revised) == len(todo) and not at_commit and not facade.has_unfinished():
                break
            facade.step()
            steps += 1
    finally:
        facade.before_commit = before_commit
    missing = {p.scope for p in todo} - revised
    if missing:
        raise RuntimeError(f"never revised within {max_steps} steps: {sorted(missing)}")
    return steps


def draft_window(log: Iterable[dict[str, Any]]) -> dict[str, int]:
    """What the core's log shows of the draft window: draft writes, those that completed a block
    only tentatively, verifications that completed a block or left it incomplete, and writers
    closed over unverified drafts (rolled back)."""
    counts = dict.fromkeys(
        (
            "draft_writes",
            "tentative_completions",
            "verified_complete",
            "verified_incomplete",
            "rolled_back_at_close",
        ),
        0,
    )
    for line in log:
        t = line["transition"]
        if t == "write_draft":
            counts["draft_writes"] += 1
            counts["tentative_completions"] += line["completes"] is True
        elif t == "verify_drafts":
            counts["verified_complete" if line["completes"] else "verified_incomplete"] += 1
        elif t == "close_writer" and line["changed"].get("draft") is False:
            counts["rolled_back_at_close"] += 1
    return counts


def read_log(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _summary(ms: list[float]) -> dict[str, float | int | None]:
    if not ms:
        return {"n": 0, "p50": None, "max": None}
    return {"n": len(ms), "p50": round(statistics.median(ms), 2), "max": round(max(ms), 2)}


def run_shape(shape: str, seeds: Sequence[int], log_dir: Path) -> dict[str, Any]:
    """One engine (and its clean reference) for ``shape``; one facade per seed."""
    from retire_vllm import identity
    from retire_vllm.checker import Checker
    from retire_vllm.default_model import ensure_default_model
    from retire_vllm.engine_config import build_engine
    from retire_vllm.facade import RetireEngine
    from retire_vllm.scheduler import RetireScheduler

    draft_seed = SHAPES[shape].draft_seed
    extra: dict[str, Any] = {"model": ensure_default_model(size=SHAPES[shape].size)}
    if draft_seed is not None:
        extra["speculative_config"] = speculative_config(draft_seed)
    if SHAPES[shape].max_model_len is not None:
        extra["max_model_len"] = SHAPES[shape].max_model_len
    ref = build_engine(num_blocks=NUM_BLOCKS, **extra)
    engine = build_engine(num_blocks=NUM_BLOCKS, scheduler_cls=RetireScheduler, **extra)
    row: dict[str, Any] = {
        "shape": shape,
        "model": SHAPES[shape].size,
        "draft_model_seed": draft_seed,
        "errors": [],
    }
    cleanup: list[float] = []
    adopted = pages = reusable = admitted = successors = tokens = steps = 0
    window = draft_window(())
    wall = 0.0
    try:
        checker = Checker(ref)
        for seed in seeds:
            todo = plans(seed)
            log_path = log_dir / f"{shape}-seed{seed}.jsonl"
            facade = RetireEngine(engine=engine, log_path=log_path)
            try:
                start = time.perf_counter()
                steps += run_plans(facade, todo)
                wall += time.perf_counter() - start
                checker.references([(list(p.succ), SUCC_MAX) for p in todo])
                for p in todo:
                    verdict = checker.verify(facade, p.scope)
                    successors += 1
                    if not verdict.ok:
                        row["errors"].append(f"{p.scope}: {verdict.problems}")
                        continue
                    admitted += 1
                    pred, succ = facade.records[p.scope].versions[:2]
                    if pred.closed_at is not None:
                        cleanup.append(round((pred.closed_at - succ.submitted_at) * 1e3, 3))
                    adopted += succ.adopted_blocks
                    pages += len(succ.adopted_pages)
                    reusable += identity.expected_adopted_blocks(p.pred, p.succ, facade.block_size)
                    tokens += len(pred.output_token_ids) + len(succ.output_token_ids)
            finally:
                facade.close()  # validates the core log against the spec
            for key, n in draft_window(read_log(log_path)).items():
                window[key] += n
    except Exception as err:  # a shape that fails is reported, the others still run
        row["errors"].append(f"{type(err).__name__}: {err}")
    finally:
        engine.engine_core.shutdown()
        ref.engine_core.shutdown()
    row.update(
        successors=successors,
        checker_admitted=admitted,
        supersede_to_last_receipt_ms=_summary(cleanup),
        adopted_blocks=adopted,
        adopted_pages=pages,
        reusable_blocks=reusable,
        tokens_generated=tokens,
        steps=steps,
        wall_s=round(wall, 2),
        tokens_per_s=round(tokens / wall, 1) if wall else None,
        draft_window=window,
        core_logs_valid=not row["errors"],
    )
    return row


COLUMNS: tuple[tuple[str, str, Callable[[dict[str, Any]], str]], ...] = (
    ("shape", "shape", lambda r: r["shape"]),
    ("admitted", "admitted", lambda r: f"{r['checker_admitted']}/{r['successors']}"),
    ("p50", "cleanup p50 ms", lambda r: str(r["supersede_to_last_receipt_ms"]["p50"])),
    ("max", "cleanup max ms", lambda r: str(r["supersede_to_last_receipt_ms"]["max"])),
    ("reuse", "reuse", lambda r: f"{r['adopted_blocks']}/{r['reusable_blocks']}"),
    ("pages", "pages adopted", lambda r: str(r["adopted_pages"])),
    ("tps", "tok/s", lambda r: str(r["tokens_per_s"])),
    ("drafts", "draft writes", lambda r: str(r["draft_window"]["draft_writes"])),
    ("tent", "tentative", lambda r: str(r["draft_window"]["tentative_completions"])),
    ("vc", "verified full", lambda r: str(r["draft_window"]["verified_complete"])),
    ("vi", "verified partial", lambda r: str(r["draft_window"]["verified_incomplete"])),
    ("rb", "rolled back at close", lambda r: str(r["draft_window"]["rolled_back_at_close"])),
)


def table(rows: list[dict[str, Any]]) -> str:
    head = [title for _, title, _ in COLUMNS]
    cells = [[cell(r) for _, _, cell in COLUMNS] for r in rows]
    widths = [max(len(x[i]) for x in [head, *cells]) for i in range(len(head))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(x, widths, strict=True)) for x in [head, *cells]
    )


# --- the serving shapes ---------------------------------------------------------------------------


#: ``stock_let_run`` is the native baseline: stock vLLM's server, the revision a new request and
#: the old call left to finish (what a framework without revisions does), read by the same client.
SERVING_SHAPES = (
    "stock_let_run",
    "serve_plain",
    "serve_spec_rejecting",
    "stock_let_run_kv_groups",
    "stock_let_run_kv_groups_dense",
    "serve_kv_groups",
    "serve_dp2",
)


#: The serving shapes' client: a starved 2-core machine can keep a connection waiting for long.
CLIENT_TIMEOUT = 300.0


def serving_shapes() -> dict[str, list[str]]:
    """``retire serve`` options per serving shape."""
    from retire_vllm.default_model import ensure_default_model

    spec = json.dumps(speculative_config(1))
    hybrid = str(ensure_default_model(size="hybrid"))
    shapes = {
        "stock_let_run": [],
        "serve_plain": [],
        "serve_spec_rejecting": ["--speculative-config", spec],
        # two KV cache groups need twice the blocks of one request of the longest length
        "serve_kv_groups": ["--model", hybrid, "--num-gpu-blocks-override", "1024"],
        # stock vLLM's server over the hybrid model with vLLM's own defaults (its sliding-window
        # prefix cache kept sparse), the engine settings otherwise those of retire serve's
        "stock_let_run_kv_groups": [
            *("--model", hybrid, "--dtype", "float32", "--block-size", "32", "--enforce-eager"),
            *("--num-gpu-blocks-override", "1024", "--enable-prompt-tokens-details"),
            *("--kv-cache-memory-bytes", str(128 << 20)),  # (vLLM's default: most of the RAM)
            *("--max-num-seqs", "16", "--seed", "0"),
        ],
        "serve_dp2": ["--data-parallel-size", "2"],
    }
    shapes["stock_let_run_kv_groups_dense"] = [
        *shapes["stock_let_run_kv_groups"],
        *("--prefix-cache-retention-interval", "None"),  # as retire serve runs it
    ]
    return shapes


async def _revise_mid_stream(base: str, model: str, p: Plan, scoped_run: bool) -> dict[str, Any]:
    import openai

    from retire_vllm.client import read_stream, scoped

    c = openai.AsyncOpenAI(
        base_url=f"{base}/v1", api_key="none", max_retries=0, timeout=CLIENT_TIMEOUT
    )
    stage = "old stream"
    try:
        old = await c.completions.create(
            model=model,
            prompt=list(p.pred),
            max_tokens=2000,
            temperature=0,
            stream=True,
            extra_body={"ignore_eos": True, **(scoped(p.scope) if scoped_run else {})},
        )
        read = 0
        async for _ in old:
            read += 1
            if read == max(1, p.after):
                break
        stage = "revision"
        start = time.perf_counter()

        async def drain() -> tuple[Any, float]:
            rest = await read_stream(old)
            return (rest[-1] if rest else None), time.perf_counter() - start

        draining = asyncio.ensure_future(drain())  # the old stream is read while the revision runs
        new = await c.completions.create(
            model=model,
            prompt=list(p.succ),
            max_tokens=SUCC_MAX,
            temperature=0,
            extra_body={"ignore_eos": True, **(scoped(p.scope) if scoped_run else {})},
        )
        new_done = time.perf_counter() - start
        last, old_end = await draining
        stage = "cold run"
        cold = await c.completions.create(
            model=model,
            prompt=list(p.succ),
            max_tokens=SUCC_MAX,
            temperature=0,
            extra_body={"ignore_eos": True},
        )
        details = new.usage.prompt_tokens_details if new.usage else None
        return {
            "old_finish": last.choices[0].finish_reason if last is not None else None,
            "old_end_ms": old_end * 1e3,
            "new_done_ms": new_done * 1e3,
            "cached_tokens": int(details.cached_tokens or 0) if details else 0,
            "matches_cold": new.choices[0].text == cold.choices[0].text,
        }
    except openai.APIError as err:
        return {"error": f"{stage}: {type(err).__name__}: {err}"}
    finally:
        await c.close()


def run_serving_shape(shape: str, options: list[str], seeds: Sequence[int]) -> dict[str, Any]:
    """One ``retire serve`` for ``shape``; each seed's plans revised mid-stream, one at a time."""
    import httpx

    from retire_bench.servers import RetireServer, StockServer
    from retire_vllm import identity
    from retire_vllm.default_model import ensure_default_model

    row: dict[str, Any] = {"shape": shape, "errors": []}
    old_end: list[float] = []
    new_done: list[float] = []
    admitted = successors = cached = reusable = ran_to_end = 0
    tmp = Path(tempfile.mkdtemp(prefix=f"retire-{shape}-"))
    stock = shape.startswith("stock")
    server: Any = (
        StockServer(tmp, str(ensure_default_model()), options or None)
        if stock
        else RetireServer(tmp, options)
    )
    try:
        for seed in seeds:
            for p in plans(seed):
                successors += 1
                r = asyncio.run(_revise_mid_stream(server.base, server.model, p, not stock))
                if not stock:
                    httpx.post(f"{server.scope_url(p.scope)}/cancel")
                ended = r.get("old_finish") in ("superseded", "length")
                if "error" in r or not ended or not r["matches_cold"]:
                    row["errors"].append(f"{p.scope}: {r}")
                    continue
                admitted += 1
                new_done.append(round(r["new_done_ms"], 2))
                old_end.append(round(r["old_end_ms"], 2))
                ran_to_end += r["old_finish"] == "length"  # stock: always; Retire: it came first
                cached += r["cached_tokens"]
                reusable += identity.expected_adopted_blocks(p.pred, p.succ, 32) * 32
        if not stock:
            server.check_clean()
    except Exception as err:
        row["errors"].append(f"{type(err).__name__}: {err}")
    finally:
        try:
            if stock:
                server.stop()
            else:
                row["core_logs"] = server.close()  # validates every engine's core log
        except AssertionError as err:
            row["errors"].append(str(err)[:2000])
    row.update(
        successors=successors,
        checker_admitted=admitted,
        old_ran_to_its_end=ran_to_end,
        revision_to_old_stream_end_ms=_summary(old_end),
        revision_to_successor_done_ms=_summary(new_done),
        cached_tokens=cached,
        reusable_tokens=reusable,
    )
    return row


SERVING_COLUMNS: tuple[tuple[str, Callable[[dict[str, Any]], str]], ...] = (
    ("shape", lambda r: r["shape"]),
    ("admitted", lambda r: f"{r['checker_admitted']}/{r['successors']}"),
    ("old ran to its end", lambda r: str(r["old_ran_to_its_end"])),
    ("old stream end p50 ms", lambda r: str(r["revision_to_old_stream_end_ms"]["p50"])),
    ("max", lambda r: str(r["revision_to_old_stream_end_ms"]["max"])),
    ("successor done p50 ms", lambda r: str(r["revision_to_successor_done_ms"]["p50"])),
    ("max ", lambda r: str(r["revision_to_successor_done_ms"]["max"])),
    ("cached/reusable tokens", lambda r: f"{r['cached_tokens']}/{r['reusable_tokens']}"),
    (
        "core logs valid",
        lambda r: str(r["core_logs"].count(": valid — ")) if "core_logs" in r else "n/a",
    ),
)


def serving_table(rows: list[dict[str, Any]]) -> str:
    head = [title for title, _ in SERVING_COLUMNS]
    cells = [[cell(r) for _, cell in SERVING_COLUMNS] for r in rows]
    widths = [max(len(x[i]) for x in [head, *cells]) for i in range(len(head))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(x, widths, strict=True)) for x in [head, *cells]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m retire_bench.shapes", description=__doc__)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument(
        "--shapes",
        nargs="+",
        choices=[*SHAPES, *SERVING_SHAPES],
        default=list(SHAPES),
        help="which shapes (default: the in-process ones; --serving adds the serving ones)",
    )
    parser.add_argument("--json", type=Path, default=None, help="write the report JSON here")
    parser.add_argument("--core-logs", type=Path, default=None, help="directory for core logs")
    parser.add_argument(
        "--serving", action="store_true", help="also the serving shapes (retire serve, openai)"
    )
    args = parser.parse_args(argv)
    if args.serving:
        args.shapes = [*args.shapes, *(s for s in SERVING_SHAPES if s not in args.shapes)]
    from retire_bench.systems import prepare_env

    prepare_env()
    logs = args.core_logs or Path(tempfile.mkdtemp(prefix="retire-shapes-"))
    logs.mkdir(parents=True, exist_ok=True)
    rows = []
    for shape in (s for s in args.shapes if s in SHAPES):
        print(f"[shapes] {shape} ...", file=sys.stderr, flush=True)
        rows.append(run_shape(shape, args.seeds, logs))
    if rows:
        print(table(rows))
    serving_rows = []
    for shape in (s for s in args.shapes if s in SERVING_SHAPES):
        print(f"[shapes] {shape} ...", file=sys.stderr, flush=True)
        serving_rows.append(run_serving_shape(shape, serving_shapes()[shape], args.seeds))
    if serving_rows:
        print(serving_table(serving_rows))
    for r in [*rows, *serving_rows]:
        for line in r["errors"][:5]:
            print(f"{r['shape']}: {line}", file=sys.stderr)
    doc = {
        "seeds": args.seeds,
        "rows": rows,
        "serving_rows": serving_rows,
        "passed": all(not r["errors"] for r in [*rows, *serving_rows]),
    }
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
        print(f"results: {args.json}")
    print(f"core logs: {logs} (validated against the spec when each facade closed)")
    return 0 if doc["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
