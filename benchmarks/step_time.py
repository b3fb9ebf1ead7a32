"""Decode step time against batch size and context length, per locally built model (issue 15,
item 2): does work sharing a step cost the other sequences time on this machine?

``python -m retire_bench.step_time [--sizes tiny small] [--json PATH] [--plot PATH]`` builds an
in-process engine per model (prefix caching off, so every sequence computes its own context),
and for each context length and batch size submits that many random prompts, steps until every
one has its first token (the prefills), then times ``--steps`` decode steps in which every
sequence decodes one token, and aborts them. It prints a table of median step times and writes
the JSON and a plot. What does not live here: the engine settings (``retire_vllm.engine_config``)
and the replays that use these models (``replay``, ``curve``).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

BATCHES = (1, 4, 16, 32)
CONTEXTS = (128, 1024)


def measure(size: str, steps: int, batches: tuple[int, ...], contexts: tuple[int, ...]) -> Any:
    from vllm.sampling_params import SamplingParams

    from retire_vllm.default_model import ensure_default_model
    from retire_vllm.engine_config import BLOCK_SIZE, build_engine

    per_seq = (max(contexts) + steps + 8) // BLOCK_SIZE + 2
    engine = build_engine(
        ensure_default_model(size=size),
        num_blocks=max(batches) * per_seq + 1,
        max_num_seqs=max(batches),
        enable_prefix_caching=False,
    )
    rng = random.Random(0)
    rows = []
    for context in contexts:
        for batch in batches:
            ids = [f"{size}-{context}-{batch}-{i}" for i in range(batch)]
            params = SamplingParams(temperature=0.0, max_tokens=steps + 8, ignore_eos=True)
            for rid in ids:
                prompt = [rng.randrange(10, 2000) for _ in range(context)]
                engine.add_request(rid, {"prompt_token_ids": prompt}, params)
            started: set[str] = set()
            while len(started) < batch:  # the prefills
                for out in engine.step():
                    outputs: Any = out.outputs  # a generation request's completions
                    if outputs and outputs[0].token_ids:
                        started.add(out.request_id)
            times = []
            for _ in range(steps):
                t0 = time.perf_counter()
                engine.step()
                times.append((time.perf_counter() - t0) * 1000.0)
            engine.abort_request(ids)
            while engine.has_unfinished_requests():
                engine.step()
            rows.append(
                {
                    "model": size,
                    "context": context,
                    "batch": batch,
                    "step_ms_median": statistics.median(times),
                    "step_ms_min": min(times),
                    "step_ms_max": max(times),
                }
            )
            median = rows[-1]["step_ms_median"]
            print(f"  {size:5s} context {context:5d} batch {batch:3d}: {median:.1f} ms")
    engine.engine_core.shutdown()
    return rows


def plot(rows: list[dict[str, Any]], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for model in dict.fromkeys(r["model"] for r in rows):
        for context in dict.fromkeys(r["context"] for r in rows):
            pts = [r for r in rows if r["model"] == model and r["context"] == context]
            ax.plot(
                [r["batch"] for r in pts],
                [r["step_ms_median"] for r in pts],
                marker="o",
                label=f"{model}, context {context}",
            )
    ax.set_xscale("log", base=2)
    ax.set_xlabel("sequences decoding in the step (batch size)")
    ax.set_ylabel("decode step, ms (median)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m retire_bench.step_time", description=__doc__)
    p.add_argument("--sizes", nargs="+", default=["tiny", "small"])
    p.add_argument("--steps", type=int, default=12, help="decode steps timed per point")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--plot", type=Path, default=None)
    args = p.parse_args(argv)
    from retire_bench.systems import prepare_env

    prepare_env()
    rows = [r for size in args.sizes for r in measure(size, args.steps, BATCHES, CONTEXTS)]
    print("model  context  " + "  ".join(f"batch {b:>2}" for b in BATCHES))
    for model in args.sizes:
        for context in CONTEXTS:
            cells = [
                f"{r['step_ms_median']:6.1f} ms"
                for r in rows
                if r["model"] == model and r["context"] == context
            ]
            print(f"{model:5s}  {context:7d}  " + "  ".join(cells))
    if args.json is not None:
        args.json.write_text(json.dumps({"rows": rows}, indent=2) + "\n")
        print(f"results: {args.json}")
    if args.plot is not None:
        print(f"plot: {plot(rows, args.plot)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
