"""The vLLM side's per-step observation cost against context length: what
``retire_vllm.observe.schedule_events`` (the facade's and the engine side's reading of a step's
schedule) costs per decoding request as the blocks each request holds grow.

``python -m retire_bench.observe_cost [--json PATH]`` holds ``--requests`` requests of 12 to
8,192 blocks each in one full-attention group (vLLM's own ``KVCacheBlock`` objects in a manager's
``req_to_blocks`` lists, with a stand-in scheduler: no model runs), decodes one token per request
per step for ``--steps`` steps, appending a block to a request's list each time it fills one as
vLLM's manager does, and times the call. Each step's events are checked against what the step
did (one write per request, one allocation per block appended) before a time counts. It prints
microseconds per request per step and the ratio of the longest context to the shortest; a cost
that does not grow with the context has a ratio near 1. Not here: the core's own cost
(``overhead``) and whole engine steps (``step_time``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import types
from pathlib import Path
from typing import Any

import attrs

BLOCKS = (12, 128, 512, 2048, 8192)
BLOCK_SIZE = 16


class FullAttentionManager:
    """Named as vLLM's manager, whose lists ``schedule_events`` may read incrementally."""

    def __init__(self, req_to_blocks: dict[str, list[Any]]) -> None:
        self.req_to_blocks = req_to_blocks


@attrs.define
class _Request:
    rid: str
    scope: str
    version: int
    tables: Any
    pages: list[int]
    adopted: tuple[tuple[int, ...], ...] = ()
    scheduled: bool = True


def measure(blocks: int, requests: int = 8, steps: int = 200) -> dict[str, Any]:
    from vllm.v1.core.kv_cache_utils import KVCacheBlock

    from retire_core import PageAllocated, WriteAttempted
    from retire_vllm.observe import BlockTables, schedule_events

    next_id = iter(range(1, 1 << 30))
    lists: dict[str, list[Any]] = {}
    reqs: dict[str, Any] = {}
    vllm_reqs: dict[str, Any] = {}
    for r in range(requests):
        rid = f"r{r}"
        held = [KVCacheBlock(next(next_id)) for _ in range(blocks)]
        lists[rid] = held
        reqs[rid] = _Request(
            rid, f"s{r}", 1, BlockTables([held], [blocks]), [b.block_id for b in held]
        )
        # the last block half full: the decode fills it and then needs new ones
        vllm_reqs[rid] = types.SimpleNamespace(num_computed_tokens=(blocks - 1) * BLOCK_SIZE + 8)
    kvm = types.SimpleNamespace(
        coordinator=types.SimpleNamespace(single_type_managers=[FullAttentionManager(lists)]),
        block_pool=types.SimpleNamespace(null_block=KVCacheBlock(0)),
    )
    scheduler = types.SimpleNamespace(kv_cache_manager=kvm, requests=vllm_reqs)
    output = types.SimpleNamespace(
        num_scheduled_tokens=dict.fromkeys(lists, 1), scheduled_spec_decode_tokens={}
    )
    times = []
    for _ in range(steps):
        appended = 0
        for rid, request in vllm_reqs.items():
            request.num_computed_tokens += 1
            if request.num_computed_tokens > len(lists[rid]) * BLOCK_SIZE:
                lists[rid].append(KVCacheBlock(next(next_id)))  # vLLM allocates the next block
                appended += 1
        start = time.perf_counter()
        events, allocations, *_ = schedule_events(reqs, scheduler, output, {}, BLOCK_SIZE)
        times.append(time.perf_counter() - start)
        writes = sum(isinstance(e, WriteAttempted) for e in events)
        allocated = sum(isinstance(e, PageAllocated) for e in events)
        if (writes, allocated, len(allocations)) != (requests, appended, appended):
            raise AssertionError(f"{blocks} blocks: {writes} writes, {allocated} allocations")
        for req, bid, *_ in allocations:
            req.pages.append(bid)
    return {
        "blocks": blocks,
        "requests": requests,
        "steps": steps,
        "us_per_request_step": statistics.median(times) * 1e6 / requests,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m retire_bench.observe_cost", description=__doc__)
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = ap.parse_args(argv)
    rows = [measure(n, args.requests, args.steps) for n in BLOCKS]
    ratio = rows[-1]["us_per_request_step"] / rows[0]["us_per_request_step"]
    print("schedule_events per decoding request per step (median)")
    for row in rows:
        print(f"  {row['blocks']:>5} blocks held: {row['us_per_request_step']:6.1f} us")
    print(f"  {BLOCKS[-1]:,} blocks over {BLOCKS[0]}: {ratio:.2f}x")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "ratio_longest_over_shortest": ratio}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
