"""Tensor parallel 2 on CPU under RetireEngine: run as a script in its own process (the mp
executor spawns one worker process per rank), prints ``RESULT <json>``. With the argument
``hybrid``: a revision on the ``hybrid`` model (two KV cache groups) instead."""

from __future__ import annotations

import json
import os
import random
import sys
from typing import Any


def main() -> int:
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0|1")
    from retire_core import DEFAULT_CONTRACT
    from retire_vllm import faults
    from retire_vllm.checker import Checker
    from retire_vllm.facade import RetireEngine

    facade = RetireEngine(num_blocks=64, tensor_parallel_size=2)
    rng = random.Random(51)
    p0 = [rng.randrange(1, 2048) for _ in range(140)]
    p1 = p0[:100] + [rng.randrange(1, 2048) for _ in range(20)]
    p2 = p0[:100] + [rng.randrange(1, 2048) for _ in range(12)]
    facade.submit("tp", p0, DEFAULT_CONTRACT, 30)
    for _ in range(5):
        facade.step()
    facade.supersede("tp", p1, DEFAULT_CONTRACT, 12)
    facade.run_until_idle()
    # A second revision whose certified page is corrupted on every rank before adoption.
    facade.hold_admission("tp")
    facade.supersede("tp", p2, DEFAULT_CONTRACT, 12)
    victim = facade.version_record("tp").certificate[1][0]
    faults.corrupt_page(facade, victim)
    facade.release_admission("tp")
    facade.run_until_idle()
    checker = Checker(None)  # references on this engine, under a fresh salt
    v1 = checker.verify(facade, "tp", 1)
    v2 = checker.verify(facade, "tp", 2)
    log = facade.records["tp"]
    result = {
        "executor": type(facade.executor).__name__,
        "tp": facade.tp,
        "participants": [list(r.participants) for r in log.versions],
        "receipts": [sorted(r.receipts) for r in log.versions],
        "rank_receipts": [sorted(int(a["rank"]) for a in r.rank_receipts) for r in log.versions],
        "rank_digest_blocks": [
            sorted(int(b) for b in a["digests"]) for a in log.version(0).rank_receipts
        ],
        "adopted": [r.adopted_blocks for r in log.versions],
        "num_cached": [r.num_cached_tokens for r in log.versions],
        "released": [[p, why] for p, why in log.version(2).released],
        "victim": victim,
        "v1_ok": v1.ok,
        "v1_problems": v1.problems,
        "v2_ok": v2.ok,
        "v2_problems": v2.problems,
    }
    facade.cancel("tp")
    result.update(preempted(facade, checker, rng))
    facade.shutdown()  # close(): raises LeakError if anything is left behind
    result["closed_clean"] = True
    # the core log (RETIRE_CORE_LOG_DIR, inherited from the test) was validated by close()
    result["core_log_validated"] = facade.core_log.validated if facade.core_log else None
    print("RESULT " + json.dumps(result), flush=True)
    return 0


def preempted(facade: Any, checker: Any, rng: random.Random) -> dict[str, Any]:
    """Eight scopes that outgrow the 64-block pool together (10 blocks of 32 tokens each at the
    end, 80 against 63 usable): vLLM preempts some; a preempted version's request and both ranks
    deliver receipts before its pages go, and it runs again as ``<request>#<n>`` with its ranks
    ``<request>#<n>/rank<r>``."""
    scopes = [f"p{i}" for i in range(8)]
    for scope in scopes:
        facade.submit(scope, [rng.randrange(1, 2048) for _ in range(200)], max_tokens=120)
    ended: set[str] = set()
    while facade.has_unfinished():
        facade.step()
        for scope in scopes:  # a finished version keeps its pages until cancelled
            if scope not in ended and facade.version_record(scope).finished_at is not None:
                facade.cancel(scope)
                ended.add(scope)
    records = [facade.version_record(scope) for scope in scopes]
    again = [r for r in records if "#" in r.participants[0]]
    verdicts = [checker.verify(facade, scope, 0) for scope in scopes]
    return {
        "preemptions": facade.stats.preemptions,
        "preempted_participants": [list(r.participants) for r in again],
        "preempted_receipts": [sorted(r.receipts) for r in again],
        "preempted_rank_receipts": [sorted(int(a["rank"]) for a in r.rank_receipts) for r in again],
        "preempted_ok": all(v.ok for v in verdicts),
        "preempted_problems": [p for v in verdicts for p in v.problems],
    }


def hybrid() -> int:
    """A revision on the hybrid model after its sliding window has passed the predecessor's first
    blocks: each rank's receipt digests every page the version holds, in both groups."""
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0|1")
    from retire_core import DEFAULT_CONTRACT
    from retire_vllm.checker import Checker
    from retire_vllm.default_model import ensure_default_model
    from retire_vllm.facade import RetireEngine

    model = ensure_default_model(size="hybrid")
    facade = RetireEngine(model, num_blocks=256, tensor_parallel_size=2, max_model_len=2048)
    rng = random.Random(52)
    p0 = [rng.randrange(1, 2048) for _ in range(300)]
    p1 = p0[:200] + [rng.randrange(1, 2048) for _ in range(20)]
    facade.submit("tp", p0, DEFAULT_CONTRACT, 40)
    for _ in range(12):
        facade.step()
    facade.supersede("tp", p1, DEFAULT_CONTRACT, 12)
    facade.run_until_idle()
    verdict = Checker(None).verify(facade, "tp", 1)
    log = facade.records["tp"]
    result = {
        "windows": list(facade.kv_windows),
        "rank_receipts": [sorted(int(a["rank"]) for a in r.rank_receipts) for r in log.versions],
        "v0_pages": sorted(log.version(0).pages),
        "v0_rank_digest_blocks": [
            sorted(int(b) for b in a["digests"]) for a in log.version(0).rank_receipts
        ],
        "adopted": log.version(1).adopted_blocks,
        "slots": sorted((e[4], e[1]) for e in log.version(1).certificate),
        "v1_ok": verdict.ok,
        "v1_problems": verdict.problems,
    }
    facade.shutdown()
    result["core_log_validated"] = facade.core_log.validated if facade.core_log else None
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(hybrid() if sys.argv[1:] == ["hybrid"] else main())
