"""KV-pool pressure over HTTP: concurrent streams through a pool too small for all of them at
once, stock vLLM's OpenAI server against ``retire serve``, same model and engine options.

``python -m retire_bench.pressure [--blocks 24] [--streams 3 5] [--reps 15] [--json PATH]`` starts
both servers (each idle but for the round under way) on the tiny default model with a KV pool of
``--blocks`` blocks, and for each stream count runs ``--reps`` rounds on each, alternating which
server goes first, the same prompts to both in a rep. A round opens that many greedy completion
streams at once (``--prompt`` tokens each, new random prompts, ``--output`` tokens out, EOS ignored;
Retire's on scopes of their own), each bounded by ``--stream-timeout`` seconds. When their blocks
outgrow the pool vLLM preempts a request: it frees the request's blocks and computes them again
later. Reported per round: the streams that ended with every token, the tokens received, the wall
time, vLLM's preemption count (stock: its metric; Retire: ``retire_preemptions_total``) and, for
``retire serve``, how many finished texts equal stock vLLM's (greedy, the same prompts), what its
ledger still retains once the clients are done and how many blocks are free after the scopes are
cancelled; the CPU seconds each of the server's processes spent in the round (the engine core,
its workers, the API process) and, for ``retire serve``, its time in its in-step hooks; per
stream count, each server's medians and Retire's wall time against stock's (one stream: no
preemption, Retire's cost on the plain path of this tiny model's short steps). The CPU tells a
round's wall time apart from the engine core's busy wait for its workers, which took 0.04-0.10 s
of some rounds and 0.23-0.27 s of others on either server (results 4.8). Measured
here because it is where Retire's retention of a running version's pages meets vLLM's preemption
(docs/design-preemption.md); a table and the JSON. Not here: revisions (``serving``).
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
from pathlib import Path
from typing import Any

from retire_bench.accounts import CPU_ROLES, engine_time, spent_since, tree_cpu_seconds
from retire_bench.servers import (
    HTTP,
    RetireServer,
    Server,
    StockServer,
    greedy_stream,
    model_options,
    ready_together,
)
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
                stream = await greedy_stream(client, server.model, tokens, args.output, body)
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
    """Both servers up at once, idle but for the round under way; for each stream count,
    ``--reps`` rounds on each, alternating which goes first, the same prompts to both in a rep."""
    model = str(ensure_default_model())
    options = model_options(model, args.blocks)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="retire-pressure-") as tmp:
        print(
            f"starting stock and retire, each with a pool of {args.blocks} blocks ...", flush=True
        )
        stock = StockServer(Path(tmp) / "stock", model, ["--model", model, *options], wait=False)
        try:
            retire = RetireServer(Path(tmp) / "retire", options=options, log=False, wait=False)
            try:
                ready_together((stock, retire))
                for streams in args.streams:
                    for rep in range(args.reps):
                        seed = streams * 1000 + rep
                        pair = [("stock", stock), ("retire", retire)]
                        this_rep: dict[str, dict[str, Any]] = {}
                        for name, server in pair if rep % 2 == 0 else pair[::-1]:
                            row = _measured_round(server, name, streams, args, seed)
                            row["rep"] = rep
                            rows.append(row)
                            this_rep[name] = row
                        # the same prompts went to stock vLLM: greedy, so the same text
                        this_rep["retire"]["same_text_as_stock"] = sum(
                            t is not None and t == s
                            for t, s in zip(
                                this_rep["retire"]["texts"], this_rep["stock"]["texts"], strict=True
                            )
                        )
                        for row in rows[-2:]:
                            print(_line(row), flush=True)
            finally:
                retire.stop()
        finally:
            stock.stop()
    return {
        "blocks": args.blocks,
        "prompt": args.prompt,
        "output": args.output,
        "reps": args.reps,
        "stream_timeout_s": args.stream_timeout,
        "summary": _summary(rows, args.streams),
        "rows": rows,
    }


def _measured_round(
    server: Server, name: str, streams: int, args: argparse.Namespace, seed: int
) -> dict[str, Any]:
    retire = isinstance(server, RetireServer)
    before = _preemptions(server)
    engine = asyncio.run(engine_time(server)) if retire else None
    cpu = tree_cpu_seconds(server.proc.pid)
    row = asyncio.run(_round(server, streams, args, seed, retire))
    # read at once: the workers go on spinning for a while after their last step
    row["cpu_s"] = spent_since(tree_cpu_seconds(server.proc.pid), cpu)
    time.sleep(2.0)  # vLLM's metrics lag its steps: let the last ones land
    after = _preemptions(server)
    row["server"] = name
    row["preemptions"] = None if before is None or after is None else after - before
    if engine is not None:
        spent = spent_since(asyncio.run(engine_time(server)), engine)
        row["hooks_in_step_s"] = spent["schedule"] + spent["commit"]
        row["steps"] = spent["steps"]
    if isinstance(server, RetireServer):
        leaks = server.leaks()
        row["retained_blocks_after_clients"] = len(leaks["ledger_blocks"])
        row["free_blocks_after_clients"] = leaks["free_blocks"]
        server.release_all()  # cancel: what the scopes hold is given back
        server.check_clean()
        row["free_blocks_after_cancel"] = server.leaks()["free_blocks"]
    return row


def _summary(rows: list[dict[str, Any]], counts: list[int]) -> list[dict[str, Any]]:
    """Per stream count: each server's median wall time, finished streams and preemptions over
    its rounds, and Retire's median against stock's; each server's median CPU seconds a round by
    process (``CPU_ROLES``), and Retire's median time in its in-step hooks (schedule, commit)
    and steps a round."""
    out = []
    for streams in counts:
        entry: dict[str, Any] = {"streams": streams}
        for name in ("stock", "retire"):
            mine = [r for r in rows if r["server"] == name and r["streams"] == streams]
            entry[name] = {
                "wall_s_median": statistics.median(r["wall_s"] for r in mine),
                "wall_s": [r["wall_s"] for r in mine],
                "finished": sum(r["finished"] for r in mine),
                "of": streams * len(mine),
                "preemptions": sum(r["preemptions"] or 0 for r in mine),
                "cpu_s_median": {
                    role: statistics.median(r["cpu_s"][role] for r in mine) for role in CPU_ROLES
                },
            }
        mine = [r for r in rows if r["server"] == "retire" and r["streams"] == streams]
        entry["retire"]["same_text_as_stock"] = sum(r["same_text_as_stock"] for r in mine)
        entry["retire"]["hooks_in_step_s_median"] = statistics.median(
            r["hooks_in_step_s"] for r in mine
        )
        entry["retire"]["steps_median"] = statistics.median(r["steps"] for r in mine)
        entry["wall_ratio"] = entry["retire"]["wall_s_median"] / entry["stock"]["wall_s_median"]
        out.append(entry)
    return out


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
    if "hooks_in_step_s" in row:
        extra += f", hooks {1000 * row['hooks_in_step_s']:.1f} ms in {row['steps']:.0f} steps"
    pre = "-" if row["preemptions"] is None else f"{row['preemptions']:.0f}"
    cpu = row["cpu_s"]
    return (
        f"  {row['server']:>6} {row['streams']} streams (rep {row['rep']}): "
        f"{row['finished']} finished, {row['timed_out']} timed out, {row['wall_s']:.2f} s, "
        f"CPU s: engine core {cpu['engine_core']:.2f}, workers {cpu['workers']:.2f}, "
        f"api {cpu['api']:.2f}; preemptions {pre}{extra}"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m retire_bench.pressure", description=__doc__)
    ap.add_argument("--blocks", type=int, default=24, help="the KV pool, block 0 included")
    ap.add_argument("--streams", type=int, nargs="+", default=[3, 5])
    ap.add_argument("--prompt", type=int, default=150)
    ap.add_argument("--output", type=int, default=100)
    ap.add_argument("--stream-timeout", type=float, default=30.0)
    ap.add_argument(
        "--reps",
        type=int,
        default=15,
        help="rounds per server and stream count (five did not resolve sub-second rounds)",
    )
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    doc = run(args)
    print(
        f"KV pool of {args.blocks} blocks, {args.prompt}-token prompts, {args.output} out, "
        f"{args.reps} rounds each (median wall; preemptions and finished streams summed)"
    )
    print(
        "| streams | stock wall | retire wall | retire/stock | finished (stock, retire) "
        "| preemptions (stock, retire) | retire's text = stock's |"
    )
    print("|---:|---:|---:|---:|---|---|---:|")
    for e in doc["summary"]:
        st, rt = e["stock"], e["retire"]
        print(
            f"| {e['streams']} | {st['wall_s_median']:.2f} s | {rt['wall_s_median']:.2f} s "
            f"| {e['wall_ratio']:.2f}x | {st['finished']}/{st['of']}, {rt['finished']}/{rt['of']} "
            f"| {st['preemptions']:.0f}, {rt['preemptions']:.0f} "
            f"| {rt['same_text_as_stock']}/{rt['of']} |"
        )
    print(
        "\nCPU seconds a round (median; the engine core's includes its busy wait for the "
        "workers), and Retire's in-step hooks"
    )
    print("| streams | server | engine core | workers | api | hooks in the steps |")
    print("|---:|---|---:|---:|---:|---:|")
    for e in doc["summary"]:
        for name in ("stock", "retire"):
            cpu = e[name]["cpu_s_median"]
            hooks = (
                f"{1000 * e[name]['hooks_in_step_s_median']:.1f} ms "
                f"in {e[name]['steps_median']:.0f} steps"
                if name == "retire"
                else "-"
            )
            print(
                f"| {e['streams']} | {name} | {cpu['engine_core']:.3f} s | {cpu['workers']:.3f} s "
                f"| {cpu['api']:.3f} s | {hooks} |"
            )
    if args.json:
        args.json.write_text(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
