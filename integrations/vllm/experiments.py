"""Small, reproducible experiments on the real CPU vLLM engine behind ``docs/vllm_research.md``.

Each experiment builds the tiny default model, drives vLLM 0.32 through the paths the Retire
integration will use, prints what it observed and returns it as a dict:

* ``smoke``     greedy determinism and prefix-cache hits for a repeated prompt;
* ``pinning``   a finished request's cached blocks pinned with ``BlockPool.touch`` survive
  co-tenant traffic that evicts everything else, and are found as a prefix hit later
  (``--no-pin`` shows the native behaviour: the prefix is lost);
* ``digest``    sha256 digests of KV blocks, in-place corruption of one cached block, detection
  by digest, and repair by dropping the block from the prefix cache and recomputing;
* ``sched-gate`` a ``Scheduler`` subclass that refuses to commit outputs of revoked request ids;
* ``stale``     ``AsyncLLM`` with a slow consumer: tokens delivered after ``abort`` (native) vs a
  version gate at the consumer;
* ``tp2``       tensor parallel 2 on CPU (``mp`` backend) and per-rank receipts via
  ``collective_rpc``.

Run: ``python -m retire_vllm.experiments NAME [...]`` (one engine per process; 2 cores suffice).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from collections.abc import Callable
from typing import Any

from .engine_config import apply_engine_env, build_engine, engine_kwargs, greedy, run_to_completion

Result = dict[str, Any]


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(1, 2048) for _ in range(n)]


def _single(engine: Any, rid: str, prompt: list[int], max_tokens: int) -> Any:
    out = run_to_completion(engine, [(rid, prompt)], greedy(max_tokens))
    return out[rid]


def exp_smoke() -> Result:
    """Greedy outputs repeat exactly; a repeated prompt reports cached tokens."""
    t0 = time.perf_counter()
    engine = build_engine(num_blocks=256)
    startup = time.perf_counter() - t0
    rng = random.Random(0)
    prompt = _tokens(rng, 300)
    first = _single(engine, "p1", prompt, 24)
    second = _single(engine, "p2", prompt, 24)
    batch = run_to_completion(engine, [("p3", prompt), ("q", _tokens(rng, 50))], greedy(24))
    res = {
        "startup_s": round(startup, 2),
        "tokens_first": list(first.outputs[0].token_ids),
        "same_on_repeat": first.outputs[0].token_ids == second.outputs[0].token_ids,
        "same_in_batch": first.outputs[0].token_ids == batch["p3"].outputs[0].token_ids,
        "cached_first": first.num_cached_tokens,
        "cached_repeat": second.num_cached_tokens,
    }
    return res


def exp_pinning(pin: bool = True) -> Result:
    """Pin A's four full cached blocks, flood the pool with co-tenants, then reuse A's prefix."""
    from . import introspect as ix

    engine = build_engine(num_blocks=24)  # 23 usable blocks of 32 tokens
    pool = ix.block_pool(engine)
    rng = random.Random(1)
    a_prompt = _tokens(rng, 4 * 32 + 10)  # 4 full blocks + a partial one
    b_prompt = a_prompt[:128] + _tokens(rng, 20)  # same 4-block prefix, other suffix

    # Clean cold reference for B, then forget it (reset needs an idle pool).
    ref_b = _single(engine, "ref", b_prompt, 8).outputs[0].token_ids
    assert ix.kv_cache_manager(engine).reset_prefix_cache()

    spy = ix.GenerationSpy(pool).install()
    rid = engine.add_request("A", {"prompt_token_ids": a_prompt}, greedy(8))
    engine.step()  # prefill A
    a_ids = ix.request_block_ids(engine, rid)
    a_hashes = ix.request_block_hashes(engine, rid)[:4]
    while engine.has_unfinished_requests():
        engine.step()
    blocks = ix.cached_blocks_for_hashes(pool, a_hashes)
    gen_before = {b.block_id: spy.gen(b.block_id) for b in blocks}
    dig_before = {b.block_id: ix.block_digest(engine, b.block_id) for b in blocks}
    if pin:
        ix.pin_blocks(pool, blocks)
    free_after_pin = pool.get_num_free_blocks()

    for i in range(3):  # each co-tenant needs 18 blocks: the LRU evicts every unpinned block
        _single(engine, f"T{i}", _tokens(rng, 18 * 32 - 12), 4)

    still_mapped = len(ix.cached_blocks_for_hashes(pool, a_hashes))
    gen_after = {bid: spy.gen(bid) for bid in gen_before}
    dig_after = {bid: ix.block_digest(engine, bid) for bid in dig_before}
    b = _single(engine, "B", b_prompt, 8)
    if pin:
        ix.unpin_blocks(pool, blocks)
    spy.uninstall()
    res = {
        "pin": pin,
        "a_block_ids": a_ids,
        "a_cached_block_ids": [blk.block_id for blk in blocks],
        "free_blocks_after_pin": free_after_pin,
        "blocks_still_mapped": still_mapped,
        "generation_changed": [bid for bid in gen_before if gen_before[bid] != gen_after[bid]],
        "digest_changed": [bid for bid in dig_before if dig_before[bid] != dig_after[bid]],
        "evicted_ids_seen": sorted(spy.evicted),
        "b_num_cached_tokens": b.num_cached_tokens,
        "b_equals_cold_reference": list(b.outputs[0].token_ids) == list(ref_b),
        "free_at_end": pool.get_num_free_blocks(),
        "reset_prefix_cache_ok_at_end": ix.kv_cache_manager(engine).reset_prefix_cache(),
    }
    return res


def exp_digest() -> Result:
    """Corrupt one cached block's bytes; the digest catches it; evicting it repairs the reuse."""
    from . import introspect as ix

    engine = build_engine(num_blocks=64)
    pool = ix.block_pool(engine)
    rng = random.Random(2)
    a_prompt = _tokens(rng, 4 * 32 + 5)
    b_prompt = a_prompt[:128] + _tokens(rng, 16)
    ref_b = list(_single(engine, "ref", b_prompt, 12).outputs[0].token_ids)
    assert ix.kv_cache_manager(engine).reset_prefix_cache()

    rid = engine.add_request("A", {"prompt_token_ids": a_prompt}, greedy(4))
    engine.step()
    hashes = ix.request_block_hashes(engine, rid)[:4]
    while engine.has_unfinished_requests():
        engine.step()
    blocks = ix.cached_blocks_for_hashes(pool, hashes)
    certified = {blk.block_id: ix.block_digest(engine, blk.block_id) for blk in blocks}
    again = {blk.block_id: ix.block_digest(engine, blk.block_id) for blk in blocks}

    victim = blocks[2].block_id
    ix.corrupt_block(engine, victim, layer=1, value=0.5)
    now = {blk.block_id: ix.block_digest(engine, blk.block_id) for blk in blocks}
    mismatched = [bid for bid in certified if certified[bid] != now[bid]]

    # Native: adopt whatever is cached -> the corrupted page is used silently.
    b_bad = _single(engine, "B-native", b_prompt, 12)
    # Retire-style repair: drop the mismatched block from the prefix cache; the successor
    # recomputes from there (the chain hit stops at the first missing hash).
    pool.evict_blocks(set(mismatched))
    b_fixed = _single(engine, "B-repaired", b_prompt, 12)
    return {
        "digest_stable_without_writes": certified == again,
        "victim_block_id": victim,
        "mismatched_block_ids": mismatched,
        "native_cached_tokens": b_bad.num_cached_tokens,
        "native_equals_reference": list(b_bad.outputs[0].token_ids) == ref_b,
        "repaired_cached_tokens": b_fixed.num_cached_tokens,
        "repaired_equals_reference": list(b_fixed.outputs[0].token_ids) == ref_b,
    }


def exp_sched_gate() -> Result:
    """A Scheduler subclass finishes revoked ids before committing a step's model output."""
    from . import introspect as ix

    gate_cls = _make_gate_scheduler()
    # scheduler_cls takes a class or a qualname string ("pkg.module.Class").
    engine = build_engine(num_blocks=64, scheduler_cls=gate_cls)
    sched: Any = ix.scheduler(engine)
    assert isinstance(sched, gate_cls), type(sched)
    from vllm.sampling_params import RequestOutputKind

    rng = random.Random(3)
    sp = greedy(30, output_kind=RequestOutputKind.DELTA)
    rid_a = engine.add_request("A", {"prompt_token_ids": _tokens(rng, 40)}, sp)
    engine.add_request("B", {"prompt_token_ids": _tokens(rng, 40)}, sp)
    seen: dict[str, list[int]] = {"A": [], "B": []}
    finish: dict[str, str | None] = {}
    steps = 0
    revoked_at = -1
    while engine.has_unfinished_requests():
        steps += 1
        if steps > 500:
            raise RuntimeError("engine did not drain")
        if steps == 5:
            revoked_at = len(seen["A"])
            sched.revoke(rid_a)  # revoked while the next step may already be scheduled
        for out in engine.step():
            completion: Any = out.outputs[0]  # type: ignore[index]
            seen[out.request_id].extend(completion.token_ids)
            if out.finished:
                finish[out.request_id] = completion.finish_reason
    return {
        "tokens_A_before_revoke": revoked_at,
        "tokens_A": len(seen["A"]),
        "tokens_B": len(seen["B"]),
        "finish": finish,
        "dropped_commits": sched.dropped,
        "A_still_in_scheduler": rid_a in sched.requests,
        "free_blocks": ix.block_pool(engine).get_num_free_blocks(),
    }


def _make_gate_scheduler() -> type[Any]:
    from vllm.v1.core.sched.scheduler import Scheduler

    from .scheduler import commit_without

    class _GateScheduler(Scheduler):
        """Refuses to commit model output for revoked request ids (demo for research (f)).

        Revoked requests are finished *before* ``Scheduler.update_from_output`` runs, so their
        sampled tokens are never appended and produce no output; then one terminal
        ``finish_reason=abort`` output is emitted for each, so that the front end's request
        state (OutputProcessor) is closed too -- without it ``LLMEngine`` would wait forever.
        """

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.revoked: set[str] = set()
            self.dropped: list[tuple[str, int]] = []

        def revoke(self, request_id: str) -> None:
            self.revoked.add(request_id)

        def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
            for rid in sorted(self.revoked & set(scheduler_output.num_scheduled_tokens)):
                self.dropped.append((rid, scheduler_output.num_scheduled_tokens[rid]))
            return commit_without(
                self,
                self.revoked,
                lambda: super(_GateScheduler, self).update_from_output(
                    scheduler_output, model_runner_output
                ),
            )

    return _GateScheduler


def exp_stale(consumer_delay_s: float = 0.3, abort_after: int = 3) -> Result:
    """AsyncLLM + slow DELTA consumer: count predecessor tokens that reach the app after abort.

    The request asks for far more tokens than the engine makes during the consumer's delay, so
    it is still running at the abort (``running_at_abort``): one that already finished leaves
    its whole tail in its collector as the final output, which no purge of a running request's
    state reaches (at 200 tokens a fast day's engine finished within the delay)."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.sampling_params import RequestOutputKind, SamplingParams
    from vllm.v1.engine.async_llm import AsyncLLM

    from .default_model import ensure_default_model

    apply_engine_env()
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"  # AsyncLLM always runs the core apart
    model = ensure_default_model()
    args = AsyncEngineArgs(**engine_kwargs(model, num_blocks=128))

    async def main() -> Result:
        llm = AsyncLLM.from_engine_args(args)
        try:
            rng = random.Random(4)
            params = SamplingParams(
                temperature=0.0,
                max_tokens=2000,
                ignore_eos=True,
                output_kind=RequestOutputKind.DELTA,
            )
            results: Result = {}
            for mode in ("native", "purge", "gated"):
                current = {"version": 1}
                gen = llm.generate({"prompt_token_ids": _tokens(rng, 64)}, params, f"s-{mode}")
                before = after = frames_after = 0
                internal_id = None
                aborted = running_at_abort = False
                async for out in gen:
                    n = len(out.outputs[0].token_ids)
                    if mode == "gated" and current["version"] != 1:
                        continue  # gate at publication: the version is checked at yield time
                    if aborted:
                        after += n
                        frames_after += 1
                    else:
                        before += n
                    if not aborted and before >= abort_after:
                        internal_id = next(iter(llm.output_processor.external_req_ids[f"s-{mode}"]))
                        await asyncio.sleep(consumer_delay_s)  # slow consumer: engine runs on
                        current["version"] = 2  # ADVANCE happens before abort
                        running_at_abort = internal_id in llm.output_processor.request_states
                        if mode == "purge":
                            # Drop what the collector already merged (no await in between,
                            # so the output handler task cannot interleave).
                            state = llm.output_processor.request_states.get(internal_id)
                            if state is not None and state.queue is not None:
                                state.queue.output = None
                                state.queue.ready.clear()
                        await llm.abort(internal_id, internal=True)
                        aborted = True
                    else:
                        await asyncio.sleep(consumer_delay_s / 10)
                results[mode] = {
                    "tokens_before_abort": before,
                    "tokens_after_abort": after,
                    "frames_after_abort": frames_after,
                    "running_at_abort": running_at_abort,
                }
            return results
        finally:
            llm.shutdown()

    return asyncio.run(main())


def exp_tp2(tp: int = 2) -> Result:
    """TP=2 over the mp executor on 2 CPU cores and rank receipts (``tp=1``: the reference)."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.engine.llm_engine import LLMEngine

    from . import introspect as ix
    from .default_model import ensure_default_model

    model = ensure_default_model()
    rng = random.Random(5)
    prompt = _tokens(rng, 100)
    apply_engine_env(tp)
    t0 = time.perf_counter()
    engine = LLMEngine.from_engine_args(
        EngineArgs(**engine_kwargs(model, num_blocks=64, tensor_parallel_size=tp))
    )
    startup = time.perf_counter() - t0
    out = run_to_completion(engine, [("tp", prompt)], greedy(16))["tp"]
    executor: Any = engine.engine_core.engine_core.model_executor  # type: ignore[attr-defined]
    receipts = executor.collective_rpc(ix.worker_receipt, args=([1, 2, 3, 4],))
    ranks = executor.collective_rpc(lambda w: (w.rank, os.getpid()))
    token_ids = list(out.outputs[0].token_ids)
    del engine
    return {
        "tp": tp,
        "startup_s": round(startup, 2),
        "executor": type(executor).__name__,
        "tokens": token_ids,
        "ranks_and_pids": ranks,
        "receipts": receipts,
    }


EXPERIMENTS: dict[str, Callable[..., Result]] = {
    "smoke": exp_smoke,
    "pinning": exp_pinning,
    "digest": exp_digest,
    "sched-gate": exp_sched_gate,
    "stale": exp_stale,
    "tp2": exp_tp2,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m retire_vllm.experiments")
    parser.add_argument("name", choices=sorted(EXPERIMENTS))
    parser.add_argument("--no-pin", action="store_true", help="pinning: native behaviour")
    parser.add_argument("--tp", type=int, default=2, help="tp2: tensor parallel size")
    args = parser.parse_args(argv)
    kwargs: dict[str, Any] = {}
    if args.name == "pinning":
        kwargs["pin"] = not args.no_pin
    if args.name == "tp2":
        kwargs["tp"] = args.tp
    res = EXPERIMENTS[args.name](**kwargs)
    print("RESULT " + json.dumps(res, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
