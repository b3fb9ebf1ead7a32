"""``retire demo`` and ``retire replay`` (registered in the ``retire`` console script).

``retire replay [TRACE] [--system native|retire|both] [--json PATH]`` replays a trace (default: the
shipped ``benchmarks/data/default_trace.jsonl``) against the chosen systems and prints the
side-by-side table. ``native`` runs both native baselines (abort+resubmit and stop-reading);
``both`` adds Retire. ``retire demo`` is the main job: it builds the tiny default model if absent,
replays the built-in trace both ways with progress bars, runs the handoff grid and the overhead
measurements, prints the table and writes the JSON and the plots (``--out``, default
``./retire-demo``). Every in-process Retire run of both keeps the core's transition log
(``--core-logs DIR``) and validates it against the spec when it closes: a rejected log fails the
run, and the command exits 1. (``--system all`` runs Retire over ``retire serve``, whose log
``RetireServer.close`` validates.)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from retire_bench.systems import prepare_env
from retire_checks.cli import command


def _bar_factory(enabled: bool) -> Any:
    if not enabled:
        return None
    try:
        from tqdm import tqdm  # type: ignore[import-untyped]
    except ModuleNotFoundError:  # pragma: no cover - tqdm comes with vLLM
        return None

    class Bar:
        def __init__(self, label: str) -> None:
            self._bar = tqdm(
                total=100,
                desc=f"{label:<28}",
                bar_format="{desc} {bar} {percentage:3.0f}% {postfix}",
                file=sys.stderr,
                leave=True,
            )
            self._last = 0

        def update(self, elapsed: float, duration: float) -> None:
            pct = 100 if duration <= 0 else min(100, int(100 * elapsed / duration))
            if pct != self._last:
                self._bar.update(pct - self._last)
                self._last = pct
                self._bar.set_postfix_str(f"t={elapsed:5.1f}s")

        def close(self) -> None:
            if self._last < 100:
                self._bar.update(100 - self._last)
            self._bar.close()

    return Bar


def _configure_replay(p: argparse.ArgumentParser) -> None:
    p.add_argument("trace", nargs="?", default=None, help="trace file (default: the shipped one)")
    p.add_argument(
        "--system",
        choices=("native", "retire", "both", "all"),
        default="both",
        help="all: every native behaviour (in-process abort, and over HTTP: close the stream, "
        "let the old call run, stop reading) and Retire over retire serve, at every --time-scales",
    )
    p.add_argument(
        "--time-scales",
        default=None,
        help="--system all: comma-separated trace time scales (default 0.25,0.5,1,2)",
    )
    p.add_argument(
        "--max-num-seqs",
        type=int,
        default=None,
        help="--system all: the engine's max_num_seqs (default: the trace's scopes + 1)",
    )
    p.add_argument("--json", type=Path, default=None, help="write the results JSON here")
    p.add_argument(
        "--save-core-calls",
        type=Path,
        default=None,
        help="write the last Retire run's core calls here (for python -m retire_bench.interleave)",
    )
    _common(p)


def _common(p: argparse.ArgumentParser) -> None:
    from retire_vllm.default_model import SIZES  # no vLLM or torch import

    p.add_argument("--reps", type=int, default=2, help="interleaved repetitions per system")
    p.add_argument("--time-scale", type=float, default=1.0, help="multiply trace times by this")
    p.add_argument(
        "--consumer-delay-ms",
        type=float,
        default=200.0,
        help="the slow consumer stays busy this long after each read",
    )
    p.add_argument("--cleanup-limit-s", type=float, default=None)
    p.add_argument("--num-blocks", type=int, default=None, help="KV pool size in 32-token blocks")
    p.add_argument("--model", default=None, help="model directory (default: tiny default model)")
    p.add_argument(
        "--model-size",
        choices=tuple(SIZES),
        default=None,
        help="without --model: which locally built default model (small: a heavier step; "
        "default tiny, small for replay --system all)",
    )
    p.add_argument("--plots", type=Path, default=None, help="write plots into this directory")
    p.add_argument(
        "--core-logs",
        type=Path,
        default=None,
        help="every Retire run writes the core's transition log here and validates it against "
        "the spec when it closes; a rejected log fails the run (default: a new temporary "
        "directory; demo: OUT/core-logs)",
    )
    p.add_argument("--no-progress", action="store_true")


def _core_logs(args: argparse.Namespace, default: Path | None = None) -> Path:
    """Point $RETIRE_CORE_LOG_DIR at ``--core-logs`` (else the variable's own value, else
    ``default``, else a new temporary directory): every ``RetireEngine`` built from here on keeps
    and validates its core log."""
    import os
    import tempfile

    from retire_vllm.corelog import LOG_DIR_ENV

    directory = args.core_logs or (
        Path(os.environ[LOG_DIR_ENV]) if os.environ.get(LOG_DIR_ENV) else None
    )
    directory = directory or default or Path(tempfile.mkdtemp(prefix="retire-core-logs-"))
    directory.mkdir(parents=True, exist_ok=True)
    os.environ[LOG_DIR_ENV] = str(directory.resolve())
    return directory


def _model(args: argparse.Namespace) -> str | None:
    """``--model``, else the locally built default model of ``--model-size`` (``None``: the
    engine's own default, the tiny model)."""
    if args.model_size is None:
        args.model_size = "small" if getattr(args, "system", None) == "all" else "tiny"
    if args.model is None and args.model_size != "tiny":
        from retire_vllm.default_model import ensure_default_model

        args.model = str(ensure_default_model(size=args.model_size))
    return args.model  # type: ignore[no-any-return]


def _config(args: argparse.Namespace) -> Any:
    from retire_bench.replay import ReplayConfig

    overrides: dict[str, Any] = {}
    if args.num_blocks is not None:
        overrides["num_blocks"] = args.num_blocks
    return ReplayConfig(
        time_scale=args.time_scale,
        consumer_delay_s=args.consumer_delay_ms / 1000.0,
        cleanup_limit_s=args.cleanup_limit_s,
        reps=args.reps,
        engine_overrides=overrides,
        model_path=_model(args),
        core_calls_path=getattr(args, "save_core_calls", None),
    )


def _systems(choice: str) -> list[str]:
    from retire_bench.systems import NATIVE_SYSTEMS, SYSTEMS

    return (
        list(NATIVE_SYSTEMS)
        if choice == "native"
        else (["retire"] if choice == "retire" else list(SYSTEMS))
    )


@command("replay", "replay a revision trace against native vLLM and Retire", _configure_replay)
def _replay(args: argparse.Namespace) -> int:
    prepare_env()
    from retire_bench import replay as R
    from retire_bench.systems import FacadeMissing

    trace, path = R.load(args.trace)
    if args.system == "all":
        return _replay_all(args, trace, path)
    logs = _core_logs(args)
    try:
        doc, results = R.replay(
            trace,
            _systems(args.system),
            _config(args),
            trace_path=path,
            progress_factory=_bar_factory(not args.no_progress),
        )
    except FacadeMissing as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    from retire_bench.replay_table import table

    print(table(doc))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, indent=2, default=str) + "\n")
        print(f"results: {args.json}")
    if args.plots is not None:
        from retire_bench import plots

        for p in plots.replay_plots(results, args.plots):
            print(f"plot: {p}")
    if "retire" in results:
        print(f"core logs: {logs} (validated against the spec when each Retire run closed)")
    return 0 if doc["checker_admitted"] else 1


def _replay_all(args: argparse.Namespace, trace: Any, path: str) -> int:
    from retire_bench import curve

    scales = curve.DEFAULT_TIME_SCALES
    if args.time_scales:
        scales = tuple(float(x) for x in args.time_scales.split(","))
    if args.reps < 1 or any(s <= 0 for s in scales):
        print("error: --reps and every time scale must be positive", file=sys.stderr)
        return 2
    config = curve.LoadConfig(
        time_scales=scales,
        reps=args.reps,
        consumer_delay_s=args.consumer_delay_ms / 1000.0,
        model_path=_model(args),
        num_blocks=args.num_blocks or curve.DEFAULT_NUM_BLOCKS,
        max_num_seqs=args.max_num_seqs,
        cleanup_limit_s=args.cleanup_limit_s,
    )
    doc = curve.evaluate(trace, config, trace_path=path)
    print(curve.table(doc))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, indent=2, default=str) + "\n")
        print(f"results: {args.json}")
    if args.plots is not None:
        from retire_bench import plots

        print(f"plot: {plots.goodput_curve(doc, args.plots / 'goodput_vs_load.png')}")
    return 0 if doc["checker_admitted"] else 1


def _configure_demo(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=Path, default=Path("retire-demo"), help="output directory")
    p.add_argument("--skip-handoff", action="store_true", help="skip the handoff grid")
    p.add_argument("--native-only", action="store_true", help="run only the native baselines")
    p.add_argument(
        "--no-load",
        dest="load",
        action="store_false",
        help="skip the evaluation at load: every native behaviour over HTTP and Retire over "
        "retire serve on the small model at time scales 0.5 and 1, one run each (docs/results.md "
        "section 7; about 5 minutes; server logs go to files)",
    )
    _common(p)


#: The demo's offered loads: section 7's operating point and the trace as recorded.
DEMO_TIME_SCALES = (0.5, 1.0)


def _demo_load(out: Path, trace: Any, path: str) -> bool:
    """The demo at load: section 7's arms at ``DEMO_TIME_SCALES``, one run each, its operating
    point chosen among them by the section's rule."""
    from retire_bench import curve, plots
    from retire_vllm.default_model import ensure_default_model

    print(
        "[6/6] at load over HTTP: five arms at time scales 0.5 and 1 (two servers start)",
        file=sys.stderr,
    )
    config = curve.LoadConfig(
        time_scales=DEMO_TIME_SCALES,
        reps=1,
        model_path=str(ensure_default_model(size="small")),
        server_logs=out / "servers",
    )
    ldoc = curve.evaluate(trace, config, trace_path=path)
    (out / "load.json").write_text(json.dumps(ldoc, indent=2, default=str) + "\n")
    print()
    print(curve.table(ldoc))
    print(f"results: {out / 'load.json'}")
    print(f"plot: {plots.goodput_curve(ldoc, out / 'goodput_vs_load.png')}")
    return bool(ldoc["checker_admitted"])


@command(
    "demo", "the main job: build the model, replay both ways, print the table", _configure_demo
)
def _demo(args: argparse.Namespace) -> int:
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    prepare_env(engine_log=out / "engine.log")
    t0 = time.perf_counter()
    from retire_bench import replay as R
    from retire_bench.systems import facade_available

    logs = _core_logs(args, out / "core-logs")
    steps = 6 if args.load else 5
    print(f"[1/{steps}] {args.model_size or 'tiny'} default model", file=sys.stderr)
    if _model(args) is None:
        from retire_vllm.default_model import ensure_default_model

        args.model = str(ensure_default_model())
    print(f"      {args.model}", file=sys.stderr)
    systems = _systems("native" if args.native_only else "both")
    if "retire" in systems and not facade_available():
        print(
            "      retire_vllm.facade is not installed yet: running the native baselines only",
            file=sys.stderr,
        )
        systems = _systems("native")
    print(f"[2/{steps}] replaying the built-in trace (interleaved runs)", file=sys.stderr)
    trace, path = R.load(None)
    doc, results = R.replay(
        trace,
        systems,
        _config(args),
        trace_path=path,
        progress_factory=_bar_factory(not args.no_progress),
    )
    print(f"[3/{steps}] retire_core overhead", file=sys.stderr)
    from retire_bench import overhead

    doc["overhead"] = overhead.summary(doc, quick=True)
    handoff_doc = None
    if not args.skip_handoff:
        print(f"[4/{steps}] handoff under cache pressure", file=sys.stderr)
        from retire_bench import handoff

        hsys = [s for s in ("native", "retire") if s in systems]
        handoff_doc = handoff.run_grid(
            handoff.demo_grid(), hsys, model_path=args.model, progress=not args.no_progress
        )
        (out / "handoff.json").write_text(json.dumps(handoff_doc, indent=2) + "\n")
        doc["handoff"] = handoff.summary(handoff_doc)
    print(f"[5/{steps}] plots and JSON", file=sys.stderr)
    from retire_bench import plots
    from retire_bench.replay_table import table as replay_table

    written = plots.replay_plots(results, out)
    if handoff_doc is not None:
        written.append(plots.handoff_plot(handoff_doc, out / "handoff_grid.png"))
    doc["demo_wall_s"] = time.perf_counter() - t0
    (out / "results.json").write_text(json.dumps(doc, indent=2, default=str) + "\n")
    print()
    print(replay_table(doc))
    if handoff_doc is not None:
        print()
        print(handoff.table(handoff_doc))
    print()
    print(overhead.table(doc["overhead"]))
    print()
    print(f"results: {out / 'results.json'}")
    for p in written:
        print(f"plot: {p}")
    load_admitted = True
    if args.load:
        load_admitted = _demo_load(out, trace, path)
        doc["demo_wall_s"] = time.perf_counter() - t0
    if "retire" in systems:
        print(f"core logs: {logs} (validated against the spec when each Retire run closed)")
    print(f"engine log: {out / 'engine.log'} (vLLM's start-up and run messages)")
    print(f"demo wall time: {doc['demo_wall_s']:.0f} s")
    handoff_admitted = handoff_doc is None or bool(handoff_doc["checker_admitted"])
    return 0 if doc["checker_admitted"] and load_admitted and handoff_admitted else 1
