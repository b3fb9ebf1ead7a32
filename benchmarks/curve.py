"""Every native behaviour users have, and Retire, over a range of offered load: ``--system all``.

One evaluation runs five arms on one engine configuration, interleaved (every repetition runs
every time scale, and every time scale every arm, in a fixed order): ``inprocess_abort``
(``native.NativeAbortResubmit`` in-process, through ``replay.run_once``) and the four HTTP arms of
``arms.py`` against two long-lived server processes started here with the same engine options --
stock vLLM's OpenAI server (``http_abort``, ``let_run``, ``stop_reading``) and ``retire serve``
(``retire``). Offered load is varied by the trace's time scale (smaller = the same revisions
compressed into less time). For every (time scale, arm) it reports the replay metrics
(``metrics.compute`` over the harness's own records), engine utilisation and queueing; the
*operating point* is chosen by :data:`OPERATING_POINT_RULE` from the Retire arm's utilisation
alone, before any ratio is computed, and the ratios are Retire's figures over each arm's there.
The Retire server's leak check after each of its runs and the validation of its whole core log
at the end are part of ``checker_admitted``.
"""

from __future__ import annotations

import asyncio
import json
import math
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

import attrs

from retire_bench import metrics as M
from retire_bench.replay_table import fmt
from retire_bench.traces import Trace, final_versions, materialize, stats, version_numbers

SCHEMA: Final[str] = "retire-load-results/1"
ARMS: Final[tuple[str, ...]] = (
    "inprocess_abort",
    "http_abort",
    "let_run",
    "stop_reading",
    "retire",
)
LABELS: Final[dict[str, str]] = {
    "inprocess_abort": "in-process abort+resubmit",
    "http_abort": "HTTP: close stream (vLLM aborts)",
    "let_run": "HTTP: let the old call run (queued)",
    "stop_reading": "HTTP: stop reading",
    "retire": "Retire (retire serve + ScopeReader)",
}
#: Written before any run was looked at; ``pick_operating_point`` implements it.
OPERATING_POINT_RULE: Final[str] = (
    "the time scale at which the Retire arm alone keeps the engine about half busy: of the "
    "measured time scales, the one whose Retire runs have a median engine utilisation (share of "
    "/metrics samples with at least one running request, from the trace start to the read of "
    "the last final version's finishing chunk) closest to 0.5; ties go to the larger time scale"
)
#: Engine regime (chosen before any ratio was seen): every scope's current version has a slot
#: and one more (max_num_seqs = scopes + 1), so the engine can hold all current work at once and
#: any queueing comes from work that is not current.
DEFAULT_NUM_BLOCKS: Final[int] = 512  # KV pool, 32-token blocks (as engine_config)
DEFAULT_TIME_SCALES: Final[tuple[float, ...]] = (0.25, 0.5, 1.0, 2.0)
#: Keys of every arm's object in the JSON (a test pins them).
ARM_KEYS: Final[tuple[str, ...]] = (
    "obsolete_tokens",
    "obsolete_tokens_computed",
    "peak_live_obsolete",
    "cleanup_ms_median",
    "cleanup_ms_p99",
    "final_versions_advanced",
    "final_versions_total",
    "goodput_tok_s",
    "ttft_final_ms_median",
    "ttft_final_ms_p90",
    "engine_utilisation",
    "queue_delay_ms",
    "admitted",
    "admission",
    "runs",
)
TOP_KEYS: Final[tuple[str, ...]] = (
    "schema",
    "trace",
    "config",
    "arms",
    "curve",
    "operating_point",
    "goodput_ratio_vs",
    "checker_admitted",
)
#: Extra per-run figures carried into the aggregate (median over runs).
_EXTRA: Final[tuple[str, ...]] = (
    "engine_utilisation",
    "mean_running",
    "mean_waiting",
    "server_queue_ms_mean",
    "server_generated_tokens",
    "client_wait_ms_median",
    "headers_ms_median",
    "versions_not_sent",
    "obsolete_tokens_after_accept",
    "obsolete_tokens_before_accept",
)
TARGETS: Final[dict[str, float]] = {
    "goodput_ratio_vs_let_run": 5.53,
    "ttft_ratio_vs_let_run": 100.0,
    "goodput_ratio_vs_inprocess_abort": 0.97,
}


@attrs.frozen
class LoadConfig:
    time_scales: tuple[float, ...] = DEFAULT_TIME_SCALES
    reps: int = 1
    consumer_delay_s: float = 0.2
    model_path: str | None = None
    num_blocks: int = DEFAULT_NUM_BLOCKS
    max_num_seqs: int | None = None  # None: scopes + 1
    cleanup_limit_s: float | None = None
    arms: tuple[str, ...] = ARMS
    server_logs: Path | None = None  # where the servers' logs are kept; None: their temp dir

    def seqs(self, trace: Trace) -> int:
        return self.max_num_seqs or stats(trace).scopes + 1

    def limit(self, trace: Trace, scale: float) -> float:
        if self.cleanup_limit_s is not None:
            return self.cleanup_limit_s
        return max(30.0, 1.5 * float(stats(trace).duration_s) * scale)


def pick_operating_point(utilisation: dict[float, float | None]) -> float | None:
    """:data:`OPERATING_POINT_RULE` over ``{time_scale: Retire's median utilisation}``."""
    known = [(abs(u - 0.5), -s, s) for s, u in utilisation.items() if u is not None]
    return min(known)[2] if known else None


def kv_block_bytes(model_path: str, block_size: int = 32) -> int:
    """Bytes one fp32 KV block of the model takes (from its ``config.json``)."""
    cfg = json.loads((Path(model_path) / "config.json").read_text())
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    layers, kv_heads = int(cfg["num_hidden_layers"]), int(cfg["num_key_value_heads"])
    return 2 * layers * block_size * kv_heads * int(head_dim) * 4


def engine_overrides(model_path: str, num_blocks: int, max_num_seqs: int) -> dict[str, Any]:
    """The in-process arm's ``build_engine`` keywords; :func:`server_options` says the same."""
    return {
        "num_blocks": num_blocks,
        "max_num_seqs": max_num_seqs,
        "kv_cache_memory_bytes": num_blocks * kv_block_bytes(model_path),
    }


def server_options(model_path: str, num_blocks: int, max_num_seqs: int) -> list[str]:
    """Server options equal to the in-process engine's settings (``engine_config``)."""
    from retire_vllm.engine_config import engine_kwargs

    kw = engine_kwargs(model_path, **engine_overrides(model_path, num_blocks, max_num_seqs))
    return [
        "--model", model_path,
        "--dtype", "float32",
        "--block-size", str(kw["block_size"]),
        "--kv-cache-memory-bytes", str(kw["kv_cache_memory_bytes"]),
        "--num-gpu-blocks-override", str(kw["num_gpu_blocks_override"]),
        "--max-model-len", str(kw["max_model_len"]),
        "--max-num-batched-tokens", str(kw["max_num_batched_tokens"]),
        "--max-num-seqs", str(kw["max_num_seqs"]),
        "--seed", str(kw["seed"]),
        "--enforce-eager",
        "--enable-prompt-tokens-details",
    ]  # fmt: skip


def _median(values: Sequence[Any]) -> float | None:
    xs = [float(v) for v in values if v is not None and not math.isnan(float(v))]
    return M.percentile(xs, 50)


def aggregate(runs: Sequence[tuple[M.RunRecord, dict[str, Any], Any]]) -> dict[str, Any]:
    """One (time scale, arm)'s figures over its repetitions (``metrics.aggregate`` + extras)."""
    agg = M.aggregate([m for _, m, _ in runs], [r for r, _, _ in runs])
    agg.pop("per_run", None)
    for key in _EXTRA:
        agg[key] = _median([m.get(key) for _, m, _ in runs])
    computed = [m.get("obsolete_tokens_computed") for _, m, _ in runs]
    agg["obsolete_tokens_computed"] = max((c for c in computed if c is not None), default=None)
    agg["queue_delay_ms"] = {
        "server_mean": agg["server_queue_ms_mean"],
        "client_median": agg["client_wait_ms_median"],
        "headers_median": agg["headers_ms_median"],
    }
    loads = [x for _, m, _ in runs for x in m.get("load_avg_1m") or ()]
    agg["load_avg_1m_max"] = max(loads) if loads else None
    agg["admitted"] = all(a.admitted for _, _, a in runs)
    agg["admission"] = [a.to_json() for _, _, a in runs]
    return agg


def _inprocess(
    trace: Trace, scale: float, config: LoadConfig, overrides: dict[str, Any], reference: Any
) -> tuple[M.RunRecord, dict[str, Any], Any]:
    from retire_bench.replay import ReplayConfig, run_once

    rc = ReplayConfig(
        time_scale=scale,
        consumer_delay_s=config.consumer_delay_s,
        cleanup_limit_s=config.limit(trace, scale),
        reps=1,
        engine_overrides=overrides,
        model_path=config.model_path,
    )
    res = run_once(trace, "native", rc, reference)
    m = dict(res.metrics)
    busy = sum(res.step_ms) / 1000.0
    window = m["goodput_window_s"]
    m["engine_utilisation"] = min(1.0, busy / window) if window else None
    m["obsolete_tokens_computed"] = res.obsolete_tokens_computed
    m["load_avg_1m"] = list(res.load_avg)
    return res.record, m, res.admission


def evaluate(
    trace: Trace,
    config: LoadConfig,
    *,
    trace_path: str | None = None,
    log: Callable[[str], None] = lambda s: print(s, file=sys.stderr),
) -> dict[str, Any]:
    """Run every arm at every time scale; return the JSON document."""
    from retire_bench.arms import HTTP_ARMS
    from retire_bench.http_replay import run_http
    from retire_bench.reference import clean_reference
    from retire_bench.replay import FIRST_ID
    from retire_bench.servers import RetireServer, StockServer, ready_together
    from retire_vllm.default_model import VOCAB_SIZE, ensure_default_model

    t_all = time.perf_counter()
    model = config.model_path or str(ensure_default_model())
    config = attrs.evolve(config, model_path=model)
    seqs = config.seqs(trace)
    overrides = engine_overrides(model, config.num_blocks, seqs)
    prompts = materialize(trace, vocab_size=VOCAB_SIZE, first_id=FIRST_ID)
    max_tokens = {
        (ev.scope, v): ev.max_new_tokens
        for ev, v in zip(trace.events, version_numbers(trace), strict=True)
        if ev.max_new_tokens is not None
    }
    options = server_options(model, config.num_blocks, seqs)
    tmp = Path(tempfile.mkdtemp(prefix="retire-load-"))  # short: vLLM's IPC sockets live here
    needs = {HTTP_ARMS[a].server for a in config.arms if a in HTTP_ARMS}
    kept = config.server_logs or tmp
    log(f"starting servers ({', '.join(sorted(needs))}); their logs go to {kept}")
    servers: dict[str, Any] = {}
    problems: list[str] = []
    runs: dict[tuple[float, str], list[tuple[M.RunRecord, dict[str, Any], Any]]] = {}
    try:
        if "retire" in needs:
            servers["retire"] = RetireServer(tmp / "retire", options=options, wait=False)
        if "stock" in needs:
            servers["stock"] = StockServer(tmp / "stock", model, options, wait=False)
        # the clean reference runs in this process while the servers start
        log(f"clean reference: {len(prompts)} versions, cold, prefix caching off")
        reference = clean_reference(
            prompts, max_tokens, model_path=model, engine_overrides=overrides
        )
        ready_together(servers.values())
        for rep in range(config.reps):
            for scale in config.time_scales:
                for arm in config.arms:
                    tag = f"r{rep}-x{scale:g}-{arm}".replace(".", "_")
                    if arm == "inprocess_abort":
                        got = _inprocess(trace, scale, config, overrides, reference)
                    else:
                        cls = HTTP_ARMS[arm]
                        server = servers[cls.server]
                        res = asyncio.run(
                            run_http(
                                cls,
                                server.base,
                                server.model,
                                trace,
                                time_scale=scale,
                                consumer_delay_s=config.consumer_delay_s,
                                cleanup_limit_s=config.limit(trace, scale),
                                reference=reference,
                                vocab_size=VOCAB_SIZE,
                                tag=tag,
                            )
                        )
                        got = (res.record, res.metrics, res.admission)
                        if cls.server == "retire":
                            try:
                                server.check_clean()
                            except AssertionError as err:
                                problems.append(f"{tag}: {err}")
                    runs.setdefault((scale, arm), []).append(got)
                    m = got[1]
                    log(
                        f"  rep {rep + 1} x{scale:g} {arm:<16} goodput "
                        f"{m['goodput_tok_s']:6.1f} tok/s, obsolete {m['obsolete_tokens']:4d}, "
                        f"finals {m['final_versions_advanced']}/{m['final_versions_total']}, "
                        f"util {fmt(m.get('engine_utilisation'), 2)}, "
                        f"load {fmt(max(m.get('load_avg_1m') or [math.nan]), 1)}, "
                        f"{'admitted' if got[2].admitted else 'NOT admitted'}"
                    )
    finally:
        if "stock" in servers:
            servers["stock"].stop()
        if "retire" in servers:
            try:
                verdict = servers["retire"].close()
                log(f"retire serve core log: {verdict.strip()}")
            except AssertionError as err:
                problems.append(str(err))
    doc = results_json(trace, config, runs, problems, trace_path=trace_path)
    doc["config"]["server_options"] = options
    doc["config"]["server_logs"] = str(_keep_logs(tmp, config.server_logs))
    doc["wall_s"] = time.perf_counter() - t_all
    return doc


def _keep_logs(tmp: Path, keep: Path | None) -> Path:
    """Copy each server's console and core logs from ``tmp`` to ``keep`` (when given)."""
    if keep is None:
        return tmp
    for log_file in [*tmp.glob("*/*.log"), *tmp.glob("*/*.jsonl")]:
        target = keep / log_file.parent.name / log_file.name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(log_file, target)
    return keep


def results_json(
    trace: Trace,
    config: LoadConfig,
    runs: dict[tuple[float, str], list[tuple[M.RunRecord, dict[str, Any], Any]]],
    problems: Sequence[str] = (),
    *,
    trace_path: str | None = None,
) -> dict[str, Any]:
    scales = sorted({s for s, _ in runs})
    arms = [a for a in ARMS if any(a == b for _, b in runs)]
    by_scale = {s: {a: aggregate(runs[(s, a)]) for a in arms if (s, a) in runs} for s in scales}
    util = {s: by_scale[s].get("retire", {}).get("engine_utilisation") for s in scales}
    point = pick_operating_point(util) if "retire" in arms else (scales[0] if scales else None)
    at = by_scale.get(point, {}) if point is not None else {}
    retire = at.get("retire")
    ratios: dict[str, float | None] = {}
    ttft: dict[str, float | None] = {}
    for a in arms:
        if a == "retire" or retire is None:
            continue
        g, r = at[a]["goodput_tok_s"], retire["goodput_tok_s"]
        ratios[a] = r / g if g else None
        t, rt = at[a]["ttft_final_ms_median"], retire["ttft_final_ms_median"]
        ttft[a] = t / rt if t is not None and rt else None
    admitted = not problems and all(x["admitted"] for v in by_scale.values() for x in v.values())
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "trace": {
            "name": trace.name,
            "path": trace_path,
            "stats": stats(trace).to_json(),
            "final_versions": [list(k) for k in final_versions(trace)],
        },
        "config": {
            "model": config.model_path,
            "num_blocks": config.num_blocks,
            "max_num_seqs": config.seqs(trace),
            "consumer_delay_s": config.consumer_delay_s,
            "reps": config.reps,
            "time_scales": list(config.time_scales),
            "order": "interleaved: every repetition runs every time scale, each every arm",
        },
        "arms": at,
        "curve": [
            {
                "time_scale": s,
                "goodput": {a: by_scale[s][a]["goodput_tok_s"] for a in by_scale[s]},
                "engine_utilisation": {
                    a: by_scale[s][a]["engine_utilisation"] for a in by_scale[s]
                },
            }
            for s in scales
        ],
        "operating_point": {
            "time_scale": point,
            "rule": OPERATING_POINT_RULE,
            "retire_utilisation_by_time_scale": {str(s): u for s, u in util.items()},
        },
        "goodput_ratio_vs": ratios,
        "ttft_ratio_vs": ttft,
        "checker_admitted": admitted,
        "problems": list(problems),
        "by_time_scale": {str(s): v for s, v in by_scale.items()},
        "targets": _targets(ratios, ttft, retire),
    }
    return doc


def _targets(
    ratios: dict[str, float | None], ttft: dict[str, float | None], retire: dict[str, Any] | None
) -> dict[str, Any]:
    def met(value: float | None, target: float) -> dict[str, Any]:
        return {"target": target, "measured": value, "met": value is not None and value >= target}

    out: dict[str, Any] = {
        "goodput_ratio_vs_let_run": met(ratios.get("let_run"), TARGETS["goodput_ratio_vs_let_run"]),
        "ttft_ratio_vs_let_run": met(ttft.get("let_run"), TARGETS["ttft_ratio_vs_let_run"]),
        "goodput_ratio_vs_inprocess_abort": met(
            ratios.get("inprocess_abort"), TARGETS["goodput_ratio_vs_inprocess_abort"]
        ),
    }
    out["retire_obsolete_published"] = None if retire is None else retire["obsolete_tokens"]
    return out


def table(doc: dict[str, Any]) -> str:
    """The operating point's side-by-side table, the curve, and the ratios."""
    arms = list(doc["arms"])
    rows = [
        ("obsolete tokens published", "obsolete_tokens", 0),
        ("  of which after acceptance", "obsolete_tokens_after_accept", 0),
        ("obsolete tokens computed", "obsolete_tokens_computed", 0),
        ("peak live obsolete executions", "peak_live_obsolete", 0),
        ("cleanup ms, median", "cleanup_ms_median", 1),
        ("final versions advanced", None, 0),
        ("current-version goodput tok/s", "goodput_tok_s", 1),
        ("TTFT of finals ms, median", "ttft_final_ms_median", 0),
        ("TTFT of finals ms, p90", "ttft_final_ms_p90", 0),
        ("engine utilisation", "engine_utilisation", 2),
        ("mean requests waiting (server)", "mean_waiting", 2),
        ("queue ms, server mean", "server_queue_ms_mean", 1),
        ("client wait ms (finals, median)", "client_wait_ms_median", 1),
        ("request to headers ms (finals, median)", "headers_ms_median", 1),
        ("versions never sent (replaced while waiting)", "versions_not_sent", 0),
        ("1-minute load average, max (2 CPUs)", "load_avg_1m_max", 1),
        ("admitted", "admitted", 0),
    ]
    lines = [["metric", *arms]]
    for label, key, digits in rows:
        row = [label]
        for a in arms:
            m = doc["arms"][a]
            if key is None:
                row.append(f"{m['final_versions_advanced']}/{m['final_versions_total']}")
            else:
                row.append(fmt(m.get(key), digits))
        lines.append(row)
    widths = [max(len(r[i]) for r in lines) for i in range(len(lines[0]))]
    out = [
        "  ".join(
            c.rjust(w) if j else c.ljust(w) for j, (c, w) in enumerate(zip(r, widths, strict=True))
        )
        for r in lines
    ]
    out.insert(1, "  ".join("-" * w for w in widths))
    op = doc["operating_point"]
    out += ["", f"operating point: time scale {op['time_scale']} ({op['rule']})", ""]
    out.append("goodput tok/s by time scale: " + ", ".join(arms))
    for p in doc["curve"]:
        vals = ", ".join(fmt(p["goodput"].get(a)) for a in arms)
        out.append(f"  x{p['time_scale']:g}: {vals}")
    out.append("")
    for a, r in doc["goodput_ratio_vs"].items():
        out.append(
            f"Retire / {a}: goodput {fmt(r, 2)}x, final TTFT {a}/Retire "
            f"{fmt(doc['ttft_ratio_vs'].get(a), 1)}x"
        )
    out.append(f"checker admitted every run: {doc['checker_admitted']}")
    return "\n".join(out)
