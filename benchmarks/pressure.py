"""KV-pool pressure over HTTP: concurrent streams through a pool too small for all of them at
once, stock vLLM's OpenAI server against ``retire serve``, same model and engine options.

``python -m retire_bench.pressure [--blocks 24] [--streams 3 5] [--json PATH]`` starts each server
in turn on the tiny default model with a KV pool of ``--blocks`` blocks, and for each stream count
opens that many greedy completion streams at once (``--prompt`` tokens each, new random prompts,
``--output`` tokens out, EOS ignored; Retire's on scopes of their own), each bounded by
``--stream-timeout`` seconds. When their blocks outgrow the pool vLLM preempts a request: it frees
the request's blocks and computes them again later. Reported per server and stream count: the
streams that ended with every token, the tokens received, the wall time, vLLM's preemption count
(stock: its metric; Retire: ``retire_preemptions_total``) and, for ``retire serve``, how many
finished texts equal stock vLLM's (greedy, the same prompts), what its ledger still retains once the
clients are done and how many blocks are free after the scopes are cancelled. Measured here because
it is where Retire's retention of a running version's pages meets vLLM's preemption
(docs/design-preemption.md); a table and the JSON. Not here: revisions (``serving``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from retire_bench.servers import HTTP, RetireServer, Server, StockServer, model_options
from retire_vllm.client import scoped
from retire_vllm.default_model import ensure_default_model


async def _round(
    server: Server, streams: int, args: argparse.Namespace, seed: int, retire: bool
) -> dict[str, Any]:
    rng = random.Random(seed)
    client = server.openai(asynchronous=True)
    finished = 0
    timed_out = 0
    chunks = 0
    texts: list[str | None] = [None] * streams  # a stream's whole text, once it finished

    async def one(i: int) -> None:
        nonlocal finished, timed_out, chunks
        tokens = [rng.randrange(10, 2000) for _ in range(args.prompt)]
        body = scoped(f"pressure-{seed}-{i}") if retire else {}
        stream = None
        try:
            async with asyncio.timeout(args.stream_timeout):
                stream = await client.completions.create(
                    model=server.model,
                    prompt=tokens,
                    max_tokens=args.output,
                    temperature=0,
                    stream=True,
                    stream_options={"include_usage": True},
                    extra_body={"ignore_eos": True, **body},
                )
                usage = None
                text: list[str] = []
                async for chunk in stream:
                    chunks += 1
                    usage = chunk.usage or usage
                    text.extend(c.text for c in chunk.choices)
                if usage is not None and usage.completion_tokens == args.output:
                    finished += 1
                    texts[i] = "".join(text)
        except TimeoutError:
            timed_out += 1
        finally:
            if stream is not None:
                await stream.close()

    start = time.monotonic()
    await asyncio.gather(*(one(i) for i in range(streams)))
    wall = time.monotonic() - start
    await client.close()
    return {
        "streams": streams,
        "finished": finished,
        "timed_out": timed_out,
        "chunks": chunks,
        "wall_s": wall,
        "texts": texts,
    }


def _preemptions(server: Server) -> float | None:
    """vLLM's preemption count (stock), or Retire's of its scoped requests (``retire serve``
    disables vLLM's log stats, and with them that metric)."""
    for line in HTTP.get(f"{server.base}/metrics").text.splitlines():
        if line.startswith(("vllm:num_preemptions_total", "retire_preemptions_total")):
            return float(line.rsplit(" ", 1)[1])
    return None


def run(args: argparse.Namespace) -> dict[str, Any]:
    model = str(ensure_default_model())
    options = model_options(model, args.blocks)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="retire-pressure-") as tmp:
        for name in ("stock", "retire"):
            print(f"starting {name} with a pool of {args.blocks} blocks ...", flush=True)
            if name == "stock":
                server: Server = StockServer(Path(tmp) / name, model, ["--model", model, *options])
            else:
                server = RetireServer(Path(tmp) / name, options=options, log=False)
            try:
                for seed, streams in enumerate(args.streams):
                    before = _preemptions(server)
                    row = asyncio.run(_round(server, streams, args, seed, name == "retire"))
                    time.sleep(2.0)  # vLLM's metrics lag its steps: let the last ones land
                    after = _preemptions(server)
                    row["server"] = name
                    row["preemptions"] = None if before is None or after is None else after - before
                    if isinstance(server, RetireServer):
                        leaks = server.leaks()
                        row["retained_blocks_after_clients"] = len(leaks["ledger_blocks"])
                        row["free_blocks_after_clients"] = leaks["free_blocks"]
                        server.release_all()  # cancel: what the scopes hold is given back
                        server.check_clean()
                        row["free_blocks_after_cancel"] = server.leaks()["free_blocks"]
                        # the same prompts went to stock vLLM: greedy, so the same text
                        stock = next(r for r in rows if r["streams"] == streams)
                        row["same_text_as_stock"] = sum(
                            t is not None and t == s
                            for t, s in zip(row["texts"], stock["texts"], strict=True)
                        )
                    rows.append(row)
                    print(_line(row), flush=True)
            finally:
                server.stop()
    return {
        "blocks": args.blocks,
        "prompt": args.prompt,
        "output": args.output,
        "stream_timeout_s": args.stream_timeout,
        "rows": rows,
    }


def _line(row: dict[str, Any]) -> str:
    extra = ""
    if "retained_blocks_after_clients" in row:
        extra = (
            f", retained after the clients {row['retained_blocks_after_clients']} "
            f"(free {row['free_blocks_after_clients']}), free after cancel "
            f"{row['free_blocks_after_cancel']}"
        )
    if "same_text_as_stock" in row:
        extra += f", same text as stock {row['same_text_as_stock']} of {row['streams']}"
    pre = "-" if row["preemptions"] is None else f"{row['preemptions']:.0f}"
    return (
        f"  {row['server']:>6} {row['streams']} streams: {row['finished']} finished, "
        f"{row['timed_out']} timed out, {row['wall_s']:.1f} s, preemptions {pre}{extra}"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m retire_bench.pressure", description=__doc__)
    ap.add_argument("--blocks", type=int, default=24, help="the KV pool, block 0 included")
    ap.add_argument("--streams", type=int, nargs="+", default=[3, 5])
    ap.add_argument("--prompt", type=int, default=150)
    ap.add_argument("--output", type=int, default=100)
    ap.add_argument("--stream-timeout", type=float, default=30.0)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    doc = run(args)
    print(f"KV pool of {args.blocks} blocks, {args.prompt}-token prompts, {args.output} out")
    for row in doc["rows"]:
        print(_line(row))
    if args.json:
        args.json.write_text(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
