"""KV memory of a model with sliding-window layers: stock vLLM's OpenAI server against ``retire
serve``, same model, engine options and streams, in one run.

``python -m retire_bench.window [--streams 4] [--prompt 300] [--output 900] [--blocks 512]
[--json PATH]`` starts each server in turn on the ``hybrid`` default model (a 64-token
sliding-window layer and a full-attention layer: two KV cache groups over one pool of
``--blocks`` blocks) and opens ``--streams`` greedy completion streams at once (``--prompt``
tokens each, ``--output`` out, EOS ignored; Retire's on scopes of their own). While they run it
reads vLLM's own ``vllm:kv_cache_usage_perc`` from ``/metrics`` every 0.1 s and reports the
peak (a sample: it moves by a block or two between runs), with the tokens each stream received
and the round's wall time. vLLM frees a sliding-window block once its window has passed it;
Retire gives such a block back as well (``PageUnreferenced``, results 4.9), so the peaks should
match: before that change ``retire serve`` held every block of the sliding group until the
version ended (57.9% against stock's 31.3% with the defaults). A table and the JSON. Not here:
revisions (``shapes --shapes serve_kv_groups``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from retire_bench.servers import (
    CLIENT_TIMEOUT_S,
    RetireServer,
    Server,
    StockServer,
    greedy_stream,
    model_options,
)
from retire_vllm.client import scoped


def kv_usage(text: str) -> float | None:
    """vLLM's ``vllm:kv_cache_usage_perc`` (a fraction of the pool) in a ``/metrics`` text."""
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "vllm:kv_cache_usage_perc":
                return float(sample.value)
    return None


async def _round(server: Server, args: argparse.Namespace, scoped_streams: bool) -> dict[str, Any]:
    client = server.openai(asynchronous=True)
    peak = 0.0
    done = asyncio.Event()

    async def poll() -> None:
        nonlocal peak
        async with httpx.AsyncClient(timeout=CLIENT_TIMEOUT_S) as h:
            while not done.is_set():
                usage = kv_usage((await h.get(f"{server.base}/metrics")).text)
                if usage is not None:
                    peak = max(peak, usage)
                await asyncio.sleep(0.1)

    async def stream(i: int) -> int:
        prompt = [(j * 7919 + i) % 2000 + 1 for j in range(args.prompt)]
        extra: dict[str, Any] = scoped(f"window-{i}") if scoped_streams else {}
        tokens = 0
        response = await greedy_stream(client, server.model, prompt, args.output, extra)
        async for chunk in response:
            if chunk.usage is not None:
                tokens = chunk.usage.completion_tokens
        return tokens

    poller = asyncio.create_task(poll())
    t0 = time.perf_counter()
    tokens = await asyncio.gather(*(stream(i) for i in range(args.streams)))
    wall = time.perf_counter() - t0
    done.set()
    await poller
    return {"peak_kv_usage": peak, "tokens": list(tokens), "seconds": wall}


def run(args: argparse.Namespace) -> dict[str, Any]:
    from retire_vllm.default_model import ensure_default_model

    model = str(ensure_default_model(size="hybrid"))
    options = ["--model", model, *model_options(model, args.blocks), "--max-model-len", "2048"]
    tmp = Path(tempfile.mkdtemp(prefix="retire-window-"))
    out: dict[str, Any] = {"config": vars(args) | {"json": None}}
    for name in ("stock", "retire"):
        print(f"[window] {name}: starting the server", file=sys.stderr, flush=True)
        server: Server = (
            StockServer(tmp / name, model, options)
            if name == "stock"
            else RetireServer(tmp / name, options=options, log=False)
        )
        try:
            out[name] = asyncio.run(_round(server, args, scoped_streams=name == "retire"))
            if isinstance(server, RetireServer):
                server.release_all()
                server.check_clean()
        finally:
            server.stop()
    out["peak_ratio"] = out["retire"]["peak_kv_usage"] / max(out["stock"]["peak_kv_usage"], 1e-9)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m retire_bench.window", description=__doc__)
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--prompt", type=int, default=300)
    ap.add_argument("--output", type=int, default=900)
    ap.add_argument("--blocks", type=int, default=512)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    doc = run(args)
    print("| server | peak KV cache use | tokens per stream | wall s |")
    print("|---|---:|---|---:|")
    for name in ("stock", "retire"):
        r = doc[name]
        print(
            f"| {name} | {r['peak_kv_usage']:.1%} | {sorted(set(r['tokens']))} "
            f"| {r['seconds']:.1f} |"
        )
    print(f"retire / stock peak: {doc['peak_ratio']:.2f}x")
    if args.json:
        args.json.write_text(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
