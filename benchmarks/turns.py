"""Conversations of many turns (an agent's loop): stock vLLM's OpenAI server against ``retire
serve``, one run, one machine, the same model and engine settings.

Each of ``--clients`` concurrent clients holds ``--conversations`` conversations of ``--turns``
turns one after the other. A conversation's first prompt is ``--prompt`` fresh tokens; every
later turn's prompt is the previous prompt, the previous turn's output (its token ids, as the
server returned them) and ``--message`` fresh tokens (the user's next message, a tool's result).
Against stock vLLM a conversation has a ``cache_salt`` of its own (as a Retire scope has: no
conversation finds another's blocks) and vLLM's prefix cache reuses whatever full blocks of the
conversation are still cached; against Retire a conversation is one scope, and each turn is a
revision of the finished previous version, which inherits the blocks the core certifies.
Reported per server and turn: the prompt's tokens, the tokens served from cache
(``usage.prompt_tokens_details.cached_tokens``) and what a prefix cache could have served (the
full blocks of the previous turn's prompt and output), time to first token (p50), and
Retire over stock as ratios. Rounds alternate which server goes first; every round sends
conversations no round sent before. The Retire server's core log is validated at the end and it
must hold nothing once its scopes are cancelled.
``python -m retire_bench.turns [--clients 4] [--conversations 3] [--turns 4] [--prompt 200]
[--message 40] [--output 64] [--rounds 2] [--model-size tiny|small] [--apart] [--json PATH]``
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

import openai

from retire_vllm.client import each_chunk, scoped
from retire_vllm.default_model import ensure_default_model
from retire_vllm.engine_config import BLOCK_SIZE

from .servers import CLIENT_TIMEOUT_S, HTTP, Server, StockServer, greedy_stream, ready_together
from .serving import client_cpus, place_apart, retire_server


def fresh_tokens(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(10, 2000) for _ in range(n)]


def reusable_tokens(previous_prompt: int, previous_output: int) -> int:
    """What a prefix cache could serve of the next turn's prompt: the full blocks of the
    previous turn's prompt and output (its last, partial block is written again)."""
    return (previous_prompt + previous_output) // BLOCK_SIZE * BLOCK_SIZE


async def _turn(
    c: openai.AsyncOpenAI, model: str, prompt: list[int], args: Any, body: dict[str, Any]
) -> dict[str, Any]:
    t0 = time.perf_counter()
    stream = await greedy_stream(c, model, prompt, args.output, {"return_token_ids": True, **body})
    first = float("nan")
    output: list[int] = []
    cached = None
    async for chunk in each_chunk(stream):
        if chunk.choices:
            ids = (chunk.choices[0].model_extra or {}).get("token_ids") or ()
            if ids and first != first:  # NaN: the first token
                first = time.perf_counter()
            output.extend(int(t) for t in ids)
        if chunk.usage is not None and chunk.usage.prompt_tokens_details is not None:
            cached = chunk.usage.prompt_tokens_details.cached_tokens
    if cached is None or len(output) != args.output:
        raise RuntimeError(f"turn incomplete: {len(output)} tokens, cached {cached}")
    return {"prompt": len(prompt), "cached": cached, "ttft": first - t0, "output": output}


async def _round(
    server: Server, retire: bool, args: Any, round_no: int
) -> list[list[dict[str, Any]]]:
    """Every conversation of one round against ``server``: per conversation, its turns."""
    c = openai.AsyncOpenAI(
        base_url=f"{server.base}/v1", api_key="none", max_retries=0, timeout=CLIENT_TIMEOUT_S
    )
    scopes: list[str] = []

    async def client(k: int) -> list[list[dict[str, Any]]]:
        done = []
        for i in range(args.conversations):
            name = f"turns-{round_no}-{k}-{i}-{'retire' if retire else 'stock'}"
            body = scoped(name) if retire else {"cache_salt": name}
            if retire:
                scopes.append(name)
            seed = 1_000_000 * (round_no + 1) + 1000 * k + 10 * i
            prompt = fresh_tokens(seed, args.prompt)
            turns = []
            reusable = 0
            for t in range(args.turns):
                turn = await _turn(c, server.model, prompt, args, body)
                turn["reusable"] = reusable
                reusable = reusable_tokens(len(prompt), args.output)
                prompt = prompt + turn.pop("output") + fresh_tokens(seed + t + 1, args.message)
                turns.append(turn)
            done.append(turns)
        return done

    try:
        results = await asyncio.gather(*(client(k) for k in range(args.clients)))
    finally:
        await c.close()
        for scope in scopes:
            HTTP.post(f"{server.base}/v1/scopes/{scope}/cancel").raise_for_status()
    return [conversation for per_client in results for conversation in per_client]


def summary(conversations: list[list[dict[str, Any]]], turns_each: int) -> list[dict[str, Any]]:
    """Per turn over all conversations: prompt tokens, tokens served from cache, what a prefix
    cache could have served (``reusable_tokens``), the share of it served, TTFT p50 (ms)."""
    rows = []
    for t in range(turns_each):
        turns = [conversation[t] for conversation in conversations]
        prompt = statistics.mean(x["prompt"] for x in turns)
        reusable = statistics.mean(x["reusable"] for x in turns)
        cached = statistics.mean(x["cached"] for x in turns)
        rows.append(
            {
                "turn": t + 1,
                "prompt_tokens": prompt,
                "reusable_tokens": reusable,
                "cached_tokens": cached,
                "served_share": cached / reusable if reusable else None,
                "ttft_p50_ms": statistics.median(x["ttft"] for x in turns) * 1e3,
            }
        )
    return rows


def run(args: Any, command: str) -> dict[str, Any]:
    placement = place_apart() if args.apart else None
    tmp = Path(tempfile.mkdtemp(prefix="retire-turns-bench-"))
    retire = retire_server(tmp / "retire", args.model_size, wait=False)
    stock = StockServer(tmp / "stock", str(ensure_default_model(size=args.model_size)), wait=False)
    ready_together((retire, stock))
    client_cpus(placement)
    by: dict[str, list[list[dict[str, Any]]]] = {"stock": [], "retire": []}
    try:
        servers = [("stock", stock, False), ("retire", retire, True)]
        for r in range(args.rounds):
            for name, server, is_retire in servers[r % 2 :] + servers[: r % 2]:
                by[name].extend(asyncio.run(_round(server, is_retire, args, r)))
        retire.check_clean()
    finally:
        stock.stop()
        verdict = retire.close()
    report: dict[str, Any] = {
        "command": command,
        "settings": {k: v for k, v in vars(args).items() if k != "json"},
        "placement": placement or "shared: client and servers on every CPU",
        "core_log": verdict.strip(),
    }
    for name, conversations in by.items():
        report[name] = summary(conversations, args.turns)
    report["ratio_retire_over_stock"] = [
        {
            "turn": s["turn"],
            "cached_tokens": r["cached_tokens"] / s["cached_tokens"]
            if s["cached_tokens"]
            else None,
            "ttft_p50": r["ttft_p50_ms"] / s["ttft_p50_ms"],
        }
        for s, r in zip(report["stock"], report["retire"], strict=True)
    ]
    return report


def table(report: dict[str, Any]) -> str:
    lines = [
        "| turn | prompt | reusable | cached: stock | cached: retire | TTFT p50: stock "
        "| TTFT p50: retire | retire/stock TTFT |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s, r, q in zip(
        report["stock"], report["retire"], report["ratio_retire_over_stock"], strict=True
    ):
        lines.append(
            f"| {s['turn']} | {s['prompt_tokens']:.0f} | {s['reusable_tokens']:.0f} | "
            f"{s['cached_tokens']:.0f} | {r['cached_tokens']:.0f} | {s['ttft_p50_ms']:.1f} ms | "
            f"{r['ttft_p50_ms']:.1f} ms | {q['ttft_p50']:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m retire_bench.turns", description=__doc__)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--conversations", type=int, default=3, help="per client and round")
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--prompt", type=int, default=200, help="first prompt, tokens")
    parser.add_argument("--message", type=int, default=40, help="fresh tokens per later turn")
    parser.add_argument("--output", type=int, default=64, help="generated tokens per turn")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--model-size", choices=("tiny", "small"), default="tiny")
    parser.add_argument(
        "--apart",
        action="store_true",
        help="the client on a CPU of its own, the servers on the others (as retire_bench.serving)",
    )
    parser.add_argument("--json", type=Path)
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    for name in ("clients", "conversations", "turns", "prompt", "output", "rounds"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    if args.message < 0:
        parser.error("--message must not be negative")
    report = run(args, " ".join(["python -m retire_bench.turns", *argv]))
    print(table(report))
    print(report["core_log"])
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
