"""``retire campaign``'s tensor-parallel fault: a TP worker process killed in the middle of a fence.

``tp_worker_killed`` runs ``RetireEngine(num_blocks=64, tensor_parallel_size=2)``: the facade and
the scheduler in one process, one worker process per rank (vLLM's ``MultiprocExecutor``), every
version's participants the request and ``<request>/rank0``, ``<request>/rank1``. A scope's first
version runs a few steps (with chunks left unread in its consumer queue), its revision is issued
-- between two steps, or while a step is in flight (the fence then waits for the step boundary)
-- and the core fences the first version. The facade aborts its request and closes its writers;
then the rank-1 worker process is SIGKILLed (``faults.kill_rank_in_fence``), just before the
fence's receipt request is sent to the ranks, or on receiving it, before answering.

What Retire must do (fail closed): the facade surfaces the death as ``EngineDeadError`` (a typed
error, not a hang: every wait on the workers is bounded); at the moment the receipt request
fails, when the error reaches the caller, and after the probes below, the fenced version is
still undrained in the core (rank 1's receipt never came), every one of its pages is still
tracked, held and referenced in vLLM (none freed, none reusable), and nothing was adopted by the
successor (no page of the scope moved to version 1, the successor not admitted); nothing of the
first version is published after the revision (the chunks left in the consumer queue and a late
frame are dropped); ``close`` raises the death at once; the core log the process wrote (as JSON
lines, line by line) validates against the spec up to its last complete line. Repaired: a new
engine, in a fresh process, serves the revision cold (version 0, nothing adopted or cached) with
the output of the clean reference (``Checker``) and closes without leaks, its core log validated.

Each phase runs in its own process (``python -m retire_bench.campaign_tp kill|repair``, printing
``RESULT <json>``) under a time limit, since the trial kills processes; the campaign's process
reads the JSON into the ``Outcome``. ``SEEDED_BUG`` (tests only) runs the killed phase with a
broken facade, to show that the trial can fail.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from retire_bench.campaign_serving import _validate_prefix

if TYPE_CHECKING:
    from retire_bench.campaign import Outcome

SCOPE = "tp-killed"
PHASE_TIMEOUT_S = 420.0  # one phase's process: a TP=2 engine start takes tens of seconds on CPU
RANK = 1  # the rank whose worker process is killed
MOMENTS = ("before_request", "answering")  # when the rank dies, relative to the receipt request
TIMINGS = ("between_steps", "during_step")  # when the revision lands
PROMPT, COMMON, TAIL = 140, 100, 20  # v0's prompt; the revision shares 3 full blocks of it
V0_TOKENS, V1_TOKENS = 30, 12

#: Broken facades the killed phase can run with (``SEEDED_BUG``), to show the trial can fail.
SEEDED_BUGS = {
    "receipt_for_dead_rank": "a rank that does not answer the fence's receipt request is "
    "counted as closed anyway (its receipt delivered to the core)",
}
#: Set by a test to run the killed phase with one of ``SEEDED_BUGS``.
SEEDED_BUG: str | None = None


def prompts(seed: int) -> tuple[list[int], list[int]]:
    """v0's prompt and its revision (sharing ``COMMON`` tokens: 3 full blocks)."""
    rng = random.Random(seed)
    p0 = [rng.randrange(1, 2048) for _ in range(PROMPT)]
    return p0, p0[:COMMON] + [rng.randrange(1, 2048) for _ in range(TAIL)]


# --- the campaign's side -------------------------------------------------------------------------


def tp2_env(tmp: Path | str) -> dict[str, str]:
    """The environment of a process that builds an in-process TP=2 engine on CPU: one OpenMP
    core per rank, no hub, and vLLM's IPC sockets under ``tmp`` (keep it short: a socket path
    must stay under 107 bytes)."""
    return dict(
        os.environ,
        VLLM_ENABLE_V1_MULTIPROCESSING="0",
        VLLM_CPU_OMP_THREADS_BIND="0|1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_RPC_BASE_PATH=str(tmp),
        TMPDIR=str(tmp),
    )


def _phase(name: str, tmp: Path, *args: object) -> tuple[dict[str, Any] | None, str]:
    """Run one phase in its own process (its own session, killed whole on timeout); returns its
    ``RESULT`` (None if it printed none) and the tail of its output."""
    env = tp2_env(tmp)
    argv = [sys.executable, "-m", "retire_bench.campaign_tp", name, *map(str, args)]
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        process_group=0,  # not a session of its own (``servers.Server`` says why)
    )
    try:
        output, _ = proc.communicate(timeout=PHASE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        output += f"\n[{name}: no result within {PHASE_TIMEOUT_S:.0f} s, killed]"
    lines = [ln for ln in output.splitlines() if ln.startswith("RESULT ")]
    result = json.loads(lines[-1][len("RESULT ") :]) if lines else None
    return result, output[-4000:]


def _fail_closed(state: dict[str, Any] | None) -> bool:
    """At that moment the fenced version still waited for rank 1's receipt, kept every page
    (tracked, held, referenced in vLLM) and handed nothing to the successor."""
    if not state:
        return False
    pages = state["v0_pages"]
    return (
        bool(pages)
        and state["rank_receipt_missing"]
        and state["v0_pages_tracked_held"] == pages
        and state["v0_pages_referenced"] == pages
        and not state["successor_pages"]
        and not state["v1_adopted"]
        and not state["v1_admitted"]
    )


def tp_worker_killed(rng: random.Random, out: Outcome, trial: int) -> None:
    """One trial: the killed phase, the core log check, then (if it failed closed) the repair.
    Trial ``i`` runs the ``i % 4``-th (moment, timing) pair, on prompts of its own. The core
    logs go to ``$RETIRE_CORE_LOG_DIR`` (``--core-logs``) when it is set."""
    from retire_vllm.corelog import LOG_DIR_ENV

    tmp = Path(tempfile.mkdtemp(prefix="retire-tp-killed-"))  # the phases' sockets
    logs = Path(os.environ[LOG_DIR_ENV]) if os.environ.get(LOG_DIR_ENV) else None
    try:
        _tp_worker_killed(rng, out, trial, tmp, logs or tmp)
    finally:
        if logs is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def _tp_worker_killed(rng: random.Random, out: Outcome, trial: int, tmp: Path, logs: Path) -> None:
    seed = rng.randrange(1 << 30)
    pairs = [(m, t) for m in MOMENTS for t in TIMINGS]
    moment, timing = pairs[trial % len(pairs)]
    log = logs / f"tp-killed-{seed}-killed.jsonl"
    bug = ["--bug", SEEDED_BUG] if SEEDED_BUG else []
    t0 = time.monotonic()
    k, tail = _phase(
        "kill", tmp, "--seed", seed, "--moment", moment, "--timing", timing, "--log", log, *bug
    )
    out.details.update(seed=seed, moment=moment, timing=timing, seeded_bug=SEEDED_BUG)
    out.details["seconds"] = {"killed_phase": round(time.monotonic() - t0, 1)}
    if k is None:
        out.error = f"the killed phase gave no result: {tail[-1500:]}"
        return
    out.injected = bool(k["mid_fence"]) and k["exitcode"] == -signal.SIGKILL
    out.detected = k["error_type"] == "EngineDeadError"
    checkpoints = ("at_death", "at_error", "after_probes")
    closed = {c: _fail_closed(k["state"].get(c)) for c in checkpoints}
    out.wrong_output += k["obsolete_tokens_published"] + int(k["late_frame"] == "publish")
    out.wrong_output += int(any(k["state"][c] and k["state"][c]["v1_adopted"] for c in checkpoints))
    rejected = _validate_prefix(log)
    out.details.update(
        rank_pid=k["pid"],
        rank_exitcode=k["exitcode"],
        error=k["error"],
        fail_closed=closed,
        unread_v0_tokens=k["unread_v0_tokens"],
        dropped_consumer_tokens=k["dropped_consumer_tokens"],
        late_frame=k["late_frame"],
        close=k["close"],
        core_log_lines=k["core_log_lines"],
        core_log_rejected=rejected,
        state_at_death=k["state"]["at_death"],
    )
    out.details["seconds"].update(k["seconds"])
    killed_ok = (
        out.detected
        and all(closed.values())
        and k["close"] == "EngineDeadError"
        and k["obsolete_tokens_published"] == 0
        and k["late_frame"] != "publish"
        and rejected is None
    )
    if not killed_ok:
        out.details["repair"] = "skipped: the killed phase did not fail closed"
        return
    t1 = time.monotonic()
    r, tail = _phase(
        "repair", tmp, "--seed", seed, "--log", logs / f"tp-killed-{seed}-repair.jsonl"
    )
    out.details["seconds"]["repair_phase"] = round(time.monotonic() - t1, 1)
    if r is None:
        out.error = f"the repair phase gave no result: {tail[-1500:]}"
        return
    out.wrong_output += int(not r["tokens_match"])
    out.details["repair"] = r
    out.repaired = (
        r["cold"] and r["checker_ok"] and r["closed_clean"] and bool(r["core_log_validated"])
    )


# --- the phases (each in its own process) --------------------------------------------------------


def _state(facade: Any) -> dict[str, Any]:
    """What the core and the facade hold for the fenced v0 and its successor, right now."""
    core = facade.retire
    scope = core.scope(SCOPE)
    versions = facade.records[SCOPE].versions
    v0 = versions[0]
    v1 = versions[1] if len(versions) > 1 else None
    pages = core.state.pages
    blocks = facade.pool.blocks
    held = [p for p in v0.pages if p in pages and pages[p].held]
    return {
        "epoch": scope.epoch,
        "v0_running": sorted(scope.running(0)),
        "rank_receipt_missing": f"{v0.request_id}/rank{RANK}" in scope.running(0),
        "v0_receipts": sorted(v0.receipts),
        "v0_rank_receipts": sorted(int(a["rank"]) for a in v0.rank_receipts),
        "v0_pages": list(v0.pages),
        "v0_pages_tracked_held": held,
        "v0_pages_referenced": [p for p in v0.pages if blocks[p].ref_cnt > 0 and p in facade.pages],
        "successor_pages": sorted(
            p for p, pg in pages.items() if pg.owner == SCOPE and pg.version >= 1
        ),
        "v1_adopted": list(v1.adopted_pages) if v1 is not None else [],
        "v1_admitted": bool(v1 is not None and v1.admitted),
    }


def _receipt_for_dead_rank() -> None:
    """``SEEDED_BUGS["receipt_for_dead_rank"]``: the facade swallows the death at the fence's
    receipt request and reports every rank's receipt."""
    from retire_vllm import observe
    from retire_vllm.errors import EngineDeadError

    real = observe.rank_receipts

    def assumed(executor: Any, rid: str, ranks: Any, block_ids: Any) -> list[dict[str, Any]]:
        try:
            return real(executor, rid, ranks, block_ids)
        except EngineDeadError:
            return [{"rank": int(r.rsplit("rank", 1)[1]), "digests": {}} for r in ranks]

    observe.rank_receipts = assumed


def _kill_phase(args: argparse.Namespace) -> dict[str, Any]:
    from retire_vllm import faults
    from retire_vllm.corelog import json_lines_logger
    from retire_vllm.facade import RetireEngine

    seconds: dict[str, float] = {}
    t0 = time.monotonic()
    log = open(args.log, "w", buffering=1, encoding="utf-8")  # noqa: SIM115 (open to the end)
    facade = RetireEngine(
        num_blocks=64, tensor_parallel_size=2, logger=json_lines_logger(log)
    )  # the core log written line by line, as the process goes
    seconds["engine_start"] = round(time.monotonic() - t0, 1)
    if args.bug == "receipt_for_dead_rank":
        _receipt_for_dead_rank()
    p0, revision = prompts(args.seed)
    facade.submit(SCOPE, p0, max_tokens=V0_TOKENS)
    for _ in range(3):
        facade.step()
    facade.consume(SCOPE)
    for _ in range(2):
        facade.step()  # v0's chunks of these steps wait, unread, in the consumer queue
    v0 = facade.version_record(SCOPE, 0)
    delivered = len(v0.delivered_token_ids)
    unread = len(v0.output_token_ids) - delivered
    kill = faults.kill_rank_in_fence(
        facade, RANK, answering=args.moment == "answering", on_death=_state
    )
    error, error_type, states = None, None, {}

    def revise(f: Any) -> None:
        f.supersede(SCOPE, revision, max_tokens=V1_TOKENS)

    try:
        if args.timing == "during_step":
            facade.during_next_step(revise)
            facade.step()  # the fence waits for the step boundary, then meets the dead rank
        else:
            revise(facade)
        for _ in range(200):  # the run goes on until the death surfaces (or nothing is left)
            if not facade.has_unfinished():
                break
            facade.step()
            facade.consume(SCOPE)
    except Exception as err:  # the typed error is what is asked for; anything else is recorded
        error, error_type = f"{type(err).__name__}: {err}", type(err).__name__
    surfaced = time.monotonic()
    if kill.sent_at is not None:
        seconds["kill_to_error"] = round(surfaced - kill.sent_at, 3)
    states["at_death"] = kill.at_death
    states["at_error"] = _state(facade)
    # Nothing of v0 is published after the revision: its queued chunks, and a late frame.
    facade.consume(SCOPE)
    late = faults.inject_frame(facade, SCOPE, 0, [7])
    facade.consume(SCOPE)
    states["after_probes"] = _state(facade)
    t1 = time.monotonic()
    try:
        facade.close()
        close = "closed"
    except Exception as err:
        close = type(err).__name__
    seconds["close"] = round(time.monotonic() - t1, 3)
    log.flush()
    return {
        "pid": kill.pid,
        "mid_fence": kill.sent_at is not None and not kill.answered and v0.fenced,
        "exitcode": faults.worker_exitcode(facade, RANK),
        "error": error,
        "error_type": error_type,
        "state": states,
        "unread_v0_tokens": unread,
        "obsolete_tokens_published": len(v0.delivered_token_ids) - delivered,
        "dropped_consumer_tokens": v0.dropped_consumer_tokens,
        "late_frame": late,
        "close": close,
        "core_log_lines": sum(1 for _ in open(args.log, encoding="utf-8")),
        "seconds": seconds,
    }


def _repair_phase(args: argparse.Namespace) -> dict[str, Any]:
    from retire_vllm.checker import Checker
    from retire_vllm.errors import IntegrationError
    from retire_vllm.facade import RetireEngine

    t0 = time.monotonic()
    facade = RetireEngine(num_blocks=64, tensor_parallel_size=2, log_path=args.log)
    started = round(time.monotonic() - t0, 1)
    _, revision = prompts(args.seed)
    facade.submit(SCOPE, revision, max_tokens=V1_TOKENS)  # the scope starts over: version 0
    for _ in range(1000):
        if not facade.has_unfinished():
            break
        facade.step()
        facade.consume(SCOPE)
    facade.consume(SCOPE)
    rec = facade.version_record(SCOPE)
    verdict = Checker(None).verify(facade, SCOPE)  # the clean reference under a fresh salt
    result: dict[str, Any] = {
        "version": rec.version,
        "adopted_blocks": rec.adopted_blocks,
        "num_cached_tokens": rec.num_cached_tokens,
        "cold": rec.version == 0 and rec.adopted_blocks == 0 and rec.num_cached_tokens == 0,
        "tokens": len(rec.output_token_ids),
        "delivered": len(rec.delivered_token_ids),
        "tokens_match": verdict.tokens_match,
        "checker_ok": verdict.ok and rec.delivered_token_ids == rec.output_token_ids,
        "problems": list(verdict.problems),
        "engine_start_s": started,
    }
    try:
        facade.shutdown()  # close(): LeakError if anything is left behind; validates the log
        result["closed_clean"] = True
    except IntegrationError as err:
        result.update(closed_clean=False, close_error=f"{type(err).__name__}: {err}")
    result["core_log_validated"] = facade.core_log.validated if facade.core_log else None
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m retire_bench.campaign_tp")
    parser.add_argument("phase", choices=("kill", "repair"))
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--log", type=Path, required=True)
    parser.add_argument("--moment", choices=MOMENTS, default=MOMENTS[0])
    parser.add_argument("--timing", choices=TIMINGS, default=TIMINGS[0])
    parser.add_argument("--bug", choices=sorted(SEEDED_BUGS), default=None)
    args = parser.parse_args(argv)
    from retire_bench.systems import prepare_env

    prepare_env()
    result = _kill_phase(args) if args.phase == "kill" else _repair_phase(args)
    print("RESULT " + json.dumps(result, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
