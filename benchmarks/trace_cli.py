"""The traces CLI (`python -m retire_bench.traces`, `python -m retire_bench.trace_cli`):
generate, import, window and print a trace's statistics as JSON.

Each command prints the statistics (plus `shape_problems` and `final_versions`); errors go to
stderr with exit status 1. The format lives in `traces`, the generators and the importer in
`trace_sources`; nothing here drives an engine.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import attrs

from retire_bench.trace_sources import (
    BurstyParams,
    SessionParams,
    generate_bursty,
    generate_sessions,
    import_agent_log,
    paper_params,
    window,
)
from retire_bench.traces import (
    DEFAULT_SEED,
    ReusePolicy,
    Trace,
    TraceFormatError,
    check_shape,
    dump_trace,
    final_versions,
    load_trace,
    stats,
)


def _print_stats(trace: Trace) -> None:
    s = stats(trace)
    out = {
        "name": trace.name,
        **s.to_json(),
        "shape_problems": check_shape(s),
        "final_versions": [list(pair) for pair in final_versions(trace)],
    }
    print(json.dumps(out, indent=2))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m retire_bench.traces", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="generate the bursty densest-window trace")
    gen.add_argument("--seed", type=int, default=DEFAULT_SEED)
    gen.add_argument("--out", type=Path, required=True)
    gen.add_argument("--paper", action="store_true", help="paper scale: 120 s, 8192-token prompt")
    defaults = BurstyParams()
    shape = ("scopes", "revisions", "bursts", "intra_gap_fraction")
    for field in (
        *shape,
        "duration_s",
        "prompt_tokens",
        "prefix_overlap",
        "max_new_tokens",
        "target_cv",
    ):
        value = getattr(defaults, field)
        gen.add_argument(f"--{field.replace('_', '-')}", type=type(value), default=None)
    gen.add_argument("--reuse", choices=[r.value for r in ReusePolicy], default=None)
    ses = sub.add_parser("sessions", help="generate many scopes at a lower density")
    ses.add_argument("--seed", type=int, default=DEFAULT_SEED)
    ses.add_argument("--out", type=Path, required=True)
    for field, value in attrs.asdict(SessionParams()).items():
        if field != "reuse":
            ses.add_argument(f"--{field.replace('_', '-')}", type=type(value), default=None)
    st = sub.add_parser("stats", help="print a trace's statistics as JSON")
    st.add_argument("path", type=Path)
    imp = sub.add_parser("import", help="import an agent session log")
    imp.add_argument("log", type=Path)
    imp.add_argument("--out", type=Path, required=True)
    imp.add_argument("--window", type=float, default=None, help="keep the densest window (s)")
    imp.add_argument("--seed", type=int, default=DEFAULT_SEED)
    imp.add_argument("--prompt-tokens", type=int, default=512)
    imp.add_argument("--prefix-overlap", type=float, default=0.0)
    imp.add_argument("--max-new-tokens", type=int, default=64)
    args = parser.parse_args(argv)
    try:
        if args.command == "generate":
            base = paper_params() if args.paper else BurstyParams()
            changes = {
                k: getattr(args, k)
                for k in (
                    *shape,
                    "duration_s",
                    "prompt_tokens",
                    "prefix_overlap",
                    "max_new_tokens",
                    "target_cv",
                    "reuse",
                )
                if getattr(args, k) is not None
            }
            trace = generate_bursty(args.seed, attrs.evolve(base, **changes))
            dump_trace(trace, args.out)
        elif args.command == "sessions":
            fields = attrs.fields_dict(SessionParams)
            given = {k: getattr(args, k) for k in fields if getattr(args, k, None) is not None}
            trace = generate_sessions(args.seed, SessionParams(**given))
            dump_trace(trace, args.out)
        elif args.command == "import":
            trace = import_agent_log(
                args.log,
                seed=args.seed,
                prompt_tokens=args.prompt_tokens,
                prefix_overlap=args.prefix_overlap,
                max_new_tokens=args.max_new_tokens,
            )
            if args.window is not None:
                trace = window(trace, args.window)
            dump_trace(trace, args.out)
        else:
            trace = load_trace(args.path)
        _print_stats(trace)
    except (TraceFormatError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
