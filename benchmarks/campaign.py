"""``retire campaign``: fault campaigns against Retire inside real vLLM, one command.

Each fault is a small named policy -- where it is injected into a running
:class:`retire_vllm.facade.RetireEngine` (in-process vLLM on CPU, tiny default model) and what
Retire must do about it -- run for ``--trials`` trials, each a fresh facade on one shared engine
with its own seeded prompts. A trial records whether the fault was really *injected* (the
corrupted page was in the certificate, the dropped block was handed to someone else, the late
frame arrived after the revision ...), *detected* (Retire noticed: a page released with
``digest_mismatch`` or ``generation_changed``, a typed ``DuplicateReceiptError`` with the core's
state unchanged, a ``Drop`` of every obsolete frame), *repaired* (the run completed, the facade
closed without leaks, its core log validated against the spec, and the checker admits the
successor: its output equals the clean cold reference, the adopted pages are exactly the verified
prefix, receipts and publication are in order) and *wrong output* (tokens or adopted KV state
differing from the clean run, obsolete tokens reaching the consumer, or a refused event that
changed the core's state: must be 0). Faults that need a process to die run against their own
processes: ``engine_core_killed`` against ``retire serve`` (``campaign_serving``),
``tp_worker_killed`` -- a tensor-parallel worker process SIGKILLed mid-fence -- against a TP=2
engine in a process of its own per phase (``campaign_tp``). A fault the engine cannot produce is
listed as not covered, with the reason. The command exits 1 unless every fault was injected,
detected and repaired in every trial with no wrong output.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs

from retire_bench import campaign_serving, campaign_tp
from retire_checks.cli import command
from retire_core import ReleaseReason

#: KV pool of the engine under test (32-token blocks; the block-reuse flood fills it).
NUM_BLOCKS = 160
#: Flood co-tenants take this many blocks each.
FLOOD_BLOCKS = 48


@attrs.define
class Outcome:
    """One trial of one fault."""

    injected: bool = False
    detected: bool = False
    repaired: bool = False
    wrong_output: int = 0
    details: dict[str, Any] = attrs.field(factory=dict)
    error: str | None = None


Trial = Callable[[Any, Any, random.Random, Outcome], None]


@attrs.frozen
class Fault:
    name: str
    injection: str  # where and when the fault is injected
    must: str  # what Retire must do
    trial: Callable[..., Any]  # a ``Trial``; a serving fault: (victim, start, rng, out)
    # a fault of ``retire serve``'s processes: its trial gets a server and a way to start
    # another (``campaign_serving``), not an in-process facade
    serving: bool = False
    # a fault whose trial starts its own engine processes (``campaign_tp``): (rng, out, trial)
    isolated: bool = False


# --- shared pieces -------------------------------------------------------------------------------


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(1, 2048) for _ in range(n)]


def _drive(facade: Any, scope: str) -> None:
    """Step until idle, the consumer reading ``scope`` after every step."""
    for _ in range(100_000):
        if not facade.has_unfinished():
            break
        facade.step()
        facade.consume(scope)
    facade.consume(scope)


def _judge(facade: Any, checker: Any, scope: str, out: Outcome, adopted: int | None) -> None:
    """The checker's verdict on the scope's current version: ``repaired`` if it admits it, the
    consumer got all of its output and (``adopted`` given) exactly the verified prefix was
    adopted; ``wrong_output`` += 1 if its tokens, what the consumer got or its adopted KV state
    differ from the clean run, or an obsolete version published after its revision."""
    verdict = checker.verify(facade, scope)
    rec = facade.version_record(scope)
    complete = rec.delivered_token_ids == rec.output_token_ids and verdict.complete
    wrong = (
        not verdict.tokens_match
        or not verdict.delivered_prefix_ok
        or bool(verdict.publication_problems)
        or verdict.kv_matches_reference is False
        or any("content changed" in p or "generation" in p for p in verdict.page_problems)
    )
    out.wrong_output += int(wrong)
    out.repaired = verdict.ok and complete and (adopted is None or rec.adopted_blocks == adopted)
    out.details.update(
        checker_ok=verdict.ok,
        problems=list(verdict.problems),
        adopted_blocks=rec.adopted_blocks,
        expected_adopted_blocks=adopted,
        successor_tokens=len(rec.output_token_ids),
    )


PRED_LEN = 170  # 5 full blocks of 32 tokens
COMMON = 165  # the successor shares all 5 blocks: 5 certified pages
CERTIFIED = 5


def _page_scope(facade: Any, rng: random.Random, scope: str) -> list[int]:
    """Submit a predecessor with 5 writer-closed full blocks; return the successor's prompt."""
    pred = _tokens(rng, PRED_LEN)
    facade.submit(scope, pred, max_tokens=6)
    facade.step()
    facade.step()
    return pred[:COMMON] + _tokens(rng, 15)


def _released(facade: Any, scope: str, page: int, reason: ReleaseReason) -> bool:
    return (page, reason) in facade.version_record(scope).released


# --- page faults ---------------------------------------------------------------------------------


def _corrupt_before_certify(facade: Any, checker: Any, rng: random.Random, out: Outcome) -> None:
    from retire_vllm import faults

    scope = "corrupt-before"
    succ = _page_scope(facade, rng, scope)
    position = rng.randrange(CERTIFIED)
    victim = facade.version_record(scope, 0).pages[position]
    closed = not facade.retire.state.pages[victim].writer_open
    faults.corrupt_page(facade, victim, layer=rng.randrange(2))  # after its digest was taken
    facade.supersede(scope, succ, max_tokens=12)  # ALIGN certifies the closure digest
    cert = facade.version_record(scope).certificate
    out.injected = closed and any(page == victim for page, *_ in cert)
    _drive(facade, scope)
    out.detected = _released(facade, scope, victim, ReleaseReason.DIGEST_MISMATCH)
    out.details.update(victim=victim, position=position, certified=len(cert))
    _judge(facade, checker, scope, out, adopted=position)


def _corrupt_after_certify(facade: Any, checker: Any, rng: random.Random, out: Outcome) -> None:
    from retire_vllm import faults

    scope = "corrupt-after"
    succ = _page_scope(facade, rng, scope)
    facade.hold_admission(scope)  # certified and pinned; the byte check waits for the release
    facade.supersede(scope, succ, max_tokens=12)
    cert = facade.version_record(scope).certificate
    position = rng.randrange(len(cert))
    victim = cert[position][0]
    out.injected = victim in facade.pinned_blocks()
    faults.corrupt_page(facade, victim, layer=rng.randrange(2))
    facade.release_admission(scope)
    _drive(facade, scope)
    out.detected = _released(facade, scope, victim, ReleaseReason.DIGEST_MISMATCH)
    out.details.update(victim=victim, position=position, certified=len(cert))
    _judge(facade, checker, scope, out, adopted=position)


def _flood(facade: Any, rng: random.Random) -> None:
    """Co-tenants outside Retire that together allocate more blocks than are free: every free
    block, cached or not, is handed to a new owner."""
    free = facade.pool.get_num_free_blocks()
    for i in range(free // FLOOD_BLOCKS + 1):
        prompt = _tokens(rng, FLOOD_BLOCKS * 32 - 40)
        facade.add_external(f"campaign-flood-{facade.uid}-{i}", prompt, 2)
    facade.run_until_idle()
    for rid in list(facade.external):
        facade.external.pop(rid)


def _block_reused(facade: Any, checker: Any, rng: random.Random, out: Outcome) -> None:
    from retire_vllm import faults

    scope = "reused"
    succ = _page_scope(facade, rng, scope)
    facade.hold_admission(scope)
    facade.supersede(scope, succ, max_tokens=12)
    cert = facade.version_record(scope).certificate
    position = rng.randrange(len(cert))
    victim, _, generation, *_ = cert[position]
    reused_before = facade.stats.pages_reused
    faults.drop_references(facade, victim)  # behind the core's back
    _flood(facade, rng)
    page = facade.retire.state.pages.get(victim)
    out.injected = facade.stats.pages_reused > reused_before  # vLLM handed the block out
    facade.release_admission(scope)
    _drive(facade, scope)
    out.detected = (
        page is not None
        and page.generation > generation
        and _released(facade, scope, victim, ReleaseReason.GENERATION_CHANGED)
    )
    out.details.update(victim=victim, position=position, certified=len(cert))
    _judge(facade, checker, scope, out, adopted=position)


# --- receipts and frames at the core boundary ----------------------------------------------------


def _revised(facade: Any, rng: random.Random, scope: str) -> list[int]:
    """A predecessor that has produced a few tokens; returns the successor's prompt."""
    pred = _tokens(rng, 100)
    facade.submit(scope, pred, max_tokens=32)
    for _ in range(3):
        facade.step()
    return pred[:70] + _tokens(rng, 20)


def _duplicate_receipt(facade: Any, checker: Any, rng: random.Random, out: Outcome) -> None:
    from retire_core import DuplicateReceiptError
    from retire_vllm import faults

    scope = "receipt"
    succ = _revised(facade, rng, scope)
    facade.supersede(scope, succ, max_tokens=8)  # the fence closes v0: its receipts are in
    participant = facade.version_record(scope, 0).participants[0]

    def redeliver(version: int, who: str) -> tuple[bool, bool]:
        """(refused with the typed error, core state unchanged)"""
        before = facade.retire.state
        try:
            faults.redeliver_receipt(facade, scope, version, who)
        except DuplicateReceiptError:
            return True, facade.retire.state == before
        return False, facade.retire.state == before

    results = [redeliver(0, participant)]  # the retired version's, while its successor runs
    _drive(facade, scope)
    results.append(redeliver(1, facade.version_record(scope).participants[0]))  # finished v1
    results.append(redeliver(0, participant))  # the retired version's, once it drained
    out.injected = True
    out.detected = all(typed for typed, _ in results)
    out.wrong_output += sum(not unchanged for _, unchanged in results)
    out.details.update(redeliveries=len(results), refused=sum(t for t, _ in results))
    _judge(facade, checker, scope, out, adopted=None)


def _lost_receipt(facade: Any, checker: Any, rng: random.Random, out: Outcome) -> None:
    """The fenced request's receipt is lost on its way to the core. The successor runs on the
    certified, writer-closed prefix (admission does not wait for receipts), but RECLAIM must
    not give back a page the silent participant may still write: until the receipt arrives the
    version stays undrained and its unshared pages stay held. The receipt delivered late then
    frees them."""
    from retire_vllm import faults

    scope = "lost"
    succ = _revised(facade, rng, scope)
    participant = facade.version_record(scope, 0).participants[0]
    lost = faults.lose_receipt(facade, participant)
    facade.supersede(scope, succ, max_tokens=8)  # the fence: its receipt never reaches the core
    out.injected = lost.receipt is not None
    _drive(facade, scope)
    core = facade.retire
    adopted = set(facade.version_record(scope).adopted_pages)
    kept = [p for p in facade.version_record(scope, 0).pages if p not in adopted]
    held = [p for p in kept if p in core.state.pages and core.state.pages[p].held]
    silent = participant in core.scope(scope).running(0)
    out.detected = bool(kept) and silent and held == kept  # fail closed: nothing reclaimed
    if lost.receipt is not None:
        faults.redeliver_receipt(facade, scope, 0, participant)  # the worker's report, late
    freed = not any(p in core.state.pages for p in kept)
    out.details.update(
        unshared_pages=len(kept), held_while_silent=len(held), freed_after_redelivery=freed
    )
    _judge(facade, checker, scope, out, adopted=None)
    out.repaired = out.repaired and freed


def _late_frame(facade: Any, checker: Any, rng: random.Random, out: Outcome) -> None:
    scope = "late"
    succ = _revised(facade, rng, scope)
    facade.consume(scope)
    for _ in range(2):
        facade.step()  # v0's chunks of these steps wait, unread, in the consumer queue
    v0 = facade.version_record(scope, 0)
    unread = len(v0.output_token_ids) - len(v0.delivered_token_ids)
    delivered = len(v0.delivered_token_ids)
    commits = v0.commits
    # The revision lands while v0's next step is in flight: that step's COMMIT frame reaches the
    # core after it (the commit gate), and the queued chunks are read after it (consumer gate).
    facade.during_next_step(lambda f: f.supersede(scope, succ, max_tokens=8))
    facade.step()
    _drive(facade, scope)
    late_commits = v0.commits - commits
    out.injected = unread > 0 and late_commits > 0
    out.detected = (
        v0.commits_dropped == late_commits and v0.dropped_consumer_tokens == unread
    )  # the in-flight step's commit refused, every queued chunk dropped
    out.wrong_output += len(v0.delivered_token_ids) - delivered  # obsolete tokens published
    out.details.update(
        unread_before_revision=unread,
        late_commits=late_commits,
        commits_dropped=v0.commits_dropped,
        dropped_engine_tokens=v0.dropped_engine_tokens,
        dropped_consumer_tokens=v0.dropped_consumer_tokens,
    )
    _judge(facade, checker, scope, out, adopted=None)


def _replayed_frames(
    facade: Any, checker: Any, rng: random.Random, out: Outcome, dup: bool
) -> None:
    """v0's frames handed to the core again after the revision: copies of chunks already
    published (``dup``), or frames v0 produced that arrive after v1's own frames published."""
    from retire_vllm import faults

    scope = "duplicate" if dup else "reordered"
    succ = _revised(facade, rng, scope)
    deliveries = facade.consume(scope)
    v0 = facade.version_record(scope, 0)
    delivered = len(v0.delivered_token_ids)
    facade.supersede(scope, succ, max_tokens=8)
    if not dup:
        for _ in range(3):
            facade.step()
            facade.consume(scope)  # v1 publishes first
    v1 = facade.version_record(scope)
    chunks = (
        [d.token_ids for d in deliveries if d.token_ids]
        if dup
        else [tuple(_tokens(rng, 1)) for _ in range(3)]
    )
    outcomes = [faults.inject_frame(facade, scope, 0, chunk) for chunk in chunks]
    out.injected = bool(chunks) and (dup or bool(v1.delivered_token_ids))
    out.detected = all(o != "publish" for o in outcomes)
    _drive(facade, scope)
    out.wrong_output += len(v0.delivered_token_ids) - delivered
    out.details.update(frames=len(chunks), decisions=sorted(set(outcomes)))
    _judge(facade, checker, scope, out, adopted=None)


def _duplicate_frame(facade: Any, checker: Any, rng: random.Random, out: Outcome) -> None:
    _replayed_frames(facade, checker, rng, out, dup=True)


def _reordered_frames(facade: Any, checker: Any, rng: random.Random, out: Outcome) -> None:
    _replayed_frames(facade, checker, rng, out, dup=False)


FAULTS: dict[str, Fault] = {
    f.name: f
    for f in (
        Fault(
            "corrupt_before_certify",
            "KV bytes of a writer-closed block of v0 changed before the revision certifies it",
            "byte check at adoption releases it (digest_mismatch); successor recomputes from it",
            _corrupt_before_certify,
        ),
        Fault(
            "corrupt_after_certify",
            "KV bytes of a certified, pinned block changed before the byte check",
            "byte check at adoption releases it (digest_mismatch); successor recomputes from it",
            _corrupt_after_certify,
        ),
        Fault(
            "block_reused",
            "references of a certified block dropped behind the core; co-tenants get the block",
            "PageReused moves its generation on; never adopted (generation_changed); recompute",
            _block_reused,
        ),
        Fault(
            "duplicate_receipt",
            "a closed participant's Receipt handed to the core again (3 moments)",
            "refuse with DuplicateReceiptError, state unchanged; run unaffected",
            _duplicate_receipt,
        ),
        Fault(
            "late_frame",
            "revision lands during v0's step; v0 chunks unread in the consumer queue",
            "refuse the in-flight step's commit, Drop queued v0 chunks; nothing obsolete published",
            _late_frame,
        ),
        Fault(
            "lost_receipt",
            "the fenced v0 request's receipt swallowed on its way to the core; delivered later",
            "v1 runs on the certified prefix; v0 stays undrained, none of its pages reclaimed "
            "until the late receipt frees them",
            _lost_receipt,
        ),
        Fault(
            "duplicate_frame",
            "copies of v0 frames already published, re-delivered after the revision",
            "Drop them; nothing obsolete published",
            _duplicate_frame,
        ),
        Fault(
            "engine_core_killed",
            "retire serve's engine-core process SIGKILLed 0-60 ms after a revision was sent "
            "while the first version streams",
            "no old token after acceptance; the server stops serving; a new server serves the "
            "scope cold (nothing inherited unverified), output as a cold run, nothing left",
            campaign_serving.engine_core_killed,
            serving=True,
        ),
        Fault(
            "tp_worker_killed",
            "TP=2: the rank-1 worker process SIGKILLed mid-fence (v0 fenced, its request aborted "
            "and writers closed), just before or on receiving the fence's receipt request",
            "fail closed: a typed EngineDeadError, no hang; v0 stays undrained with every page "
            "kept, nothing adopted; no v0 token published; its core log validates; a new engine "
            "serves the revision cold, output as the clean run, nothing left",
            campaign_tp.tp_worker_killed,
            isolated=True,
        ),
        Fault(
            "reordered_frames",
            "v0 frames arriving after v1's frames were published",
            "Drop them; v1's output unaffected",
            _reordered_frames,
        ),
    )
}

#: Faults of issue 18 item 3 that this campaign does not inject yet, and why.
NOT_YET: dict[str, str] = {
    "duplicate_current_frame": "in-process and over one ZMQ socket vLLM emits each output once; "
    "the core decides frames by version, not id, so it is the transport's to deliver once",
}


# --- the campaign --------------------------------------------------------------------------------


def _trial(engine: Any, checker: Any, fault: Fault, seed: int, trial: int) -> Outcome:
    from retire_vllm.facade import RetireEngine

    out = Outcome()
    rng = random.Random(f"{seed}:{fault.name}:{trial}")
    facade = RetireEngine(engine=engine)
    try:
        fault.trial(facade, checker, rng, out)
    except Exception as err:  # a trial that crashes is recorded, not fatal to the campaign
        out.error = f"{type(err).__name__}: {err}"
    finally:
        try:
            facade.close()  # leak check; validates the core log if one is kept
        except Exception as err:
            out.error = (out.error + "; " if out.error else "") + f"{type(err).__name__}: {err}"
    if out.error:
        out.repaired = False
    return out


def _isolated_trial(fault: Fault, seed: int, trial: int) -> Outcome:
    out = Outcome()
    rng = random.Random(f"{seed}:{fault.name}:{trial}")
    try:
        fault.trial(rng, out, trial)
    except Exception as err:
        out.error = f"{type(err).__name__}: {err}"
    if out.error:
        out.repaired = False
    return out


class _Servers:
    """``retire serve`` processes for the serving faults: each trial's replacement server is
    the next trial's victim; the last one is closed (its core log validated) at the end."""

    def __init__(self) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="retire-campaign-"))
        self.started = 0
        self.server: Any = None

    def start(self) -> Any:
        from retire_bench.servers import RetireServer

        self.started += 1
        return RetireServer(self.tmp / f"server-{self.started}")

    def trial(self, fault: Fault, seed: int, trial: int) -> Outcome:
        out = Outcome()
        rng = random.Random(f"{seed}:{fault.name}:{trial}")
        try:
            if self.server is None:
                self.server = self.start()
            victim, self.server = self.server, None
            self.server = fault.trial(victim, self.start, rng, out)
        except Exception as err:
            out.error = f"{type(err).__name__}: {err}"
            out.repaired = False
        return out

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None


def run(
    names: Sequence[str],
    trials: int,
    seed: int,
    *,
    engine: Any | None = None,
    checker: Any | None = None,
) -> dict[str, Any]:
    """Run ``trials`` trials of each named fault; returns the JSON document. ``engine`` (an
    in-process ``LLMEngine`` with ``RetireScheduler``) and ``checker`` are built when not given."""
    from retire_vllm.checker import Checker
    from retire_vllm.engine_config import build_engine
    from retire_vllm.scheduler import RetireScheduler

    built = []
    in_process = any(not (FAULTS[n].serving or FAULTS[n].isolated) for n in names)
    if engine is None and in_process:
        engine = build_engine(num_blocks=NUM_BLOCKS, scheduler_cls=RetireScheduler)
        built.append(engine)
    if checker is None and in_process:
        reference = build_engine(num_blocks=64)
        built.append(reference)
        checker = Checker(reference)
    t0 = time.perf_counter()
    per_trial: list[dict[str, Any]] = []
    summary: dict[str, dict[str, int]] = {}
    servers = _Servers()
    try:
        for name in names:
            fault = FAULTS[name]
            totals = {"injected": 0, "detected": 0, "repaired": 0, "wrong_output": 0}
            for trial in range(trials):
                if fault.serving:
                    out = servers.trial(fault, seed, trial)
                elif fault.isolated:
                    out = _isolated_trial(fault, seed, trial)
                else:
                    out = _trial(engine, checker, fault, seed, trial)
                totals["injected"] += out.injected
                totals["detected"] += out.detected
                totals["repaired"] += out.repaired
                totals["wrong_output"] += out.wrong_output
                per_trial.append({"fault": name, "trial": trial, **attrs.asdict(out)})
            summary[name] = totals
    finally:
        for eng in built:
            eng.engine_core.shutdown()
        servers.close()
    return {
        "seed": seed,
        "trials": trials,
        "faults": summary,
        "must": {name: FAULTS[name].must for name in names},
        "injection": {name: FAULTS[name].injection for name in names},
        "not_yet": dict(NOT_YET),
        "trial_details": per_trial,
        "wall_s": round(time.perf_counter() - t0, 2),
        "passed": passed(summary, trials),
    }


def passed(summary: dict[str, dict[str, int]], trials: int) -> bool:
    """Every fault injected, detected and repaired in every trial, and no wrong output."""
    return all(
        t["injected"] == t["detected"] == t["repaired"] == trials and t["wrong_output"] == 0
        for t in summary.values()
    )


def table(doc: dict[str, Any]) -> str:
    n = doc["trials"]
    head = ("fault", "injected", "detected", "repaired", "wrong_output", "what Retire must do")
    rows = [
        (
            name,
            f"{t['injected']}/{n}",
            f"{t['detected']}/{n}",
            f"{t['repaired']}/{n}",
            str(t["wrong_output"]),
            doc["must"][name],
        )
        for name, t in doc["faults"].items()
    ]
    rows += [(name, "-", "-", "-", "-", why) for name, why in doc["not_yet"].items()]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(5)]

    def line(r: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)) + "  " + r[5]

    return "\n".join([line(head), *(line(r) for r in rows)])


def _configure(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--faults",
        default=",".join(FAULTS),
        help=f"comma-separated faults (default: all): {', '.join(FAULTS)}",
    )
    p.add_argument("--trials", type=int, default=3, help="trials per fault (default 3)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, default=None, help="write the report JSON here")
    p.add_argument(
        "--core-logs",
        type=Path,
        default=None,
        help="every trial's facade writes the core's transition log here and validates it "
        "against the spec when it closes; a rejected log fails the trial (default: a new "
        "temporary directory)",
    )


@command("campaign", "inject faults into Retire on real vLLM and report per fault", _configure)
def _campaign(args: argparse.Namespace) -> int:
    from retire_bench.cli import _core_logs
    from retire_bench.systems import prepare_env

    names = [f.strip() for f in args.faults.split(",") if f.strip()]
    unknown = [f for f in names if f not in FAULTS]
    if unknown or not names or args.trials < 1:
        print(
            f"error: unknown faults {unknown} (known: {', '.join(FAULTS)})"
            if unknown
            else "error: give at least one fault and --trials >= 1",
            file=sys.stderr,
        )
        return 2
    prepare_env()
    logs = _core_logs(args)
    doc = run(names, args.trials, args.seed)
    print(table(doc))
    for t in doc["trial_details"]:
        if t["error"]:
            print(f"{t['fault']} trial {t['trial']}: {t['error']}", file=sys.stderr)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, indent=2, default=str) + "\n")
        print(f"results: {args.json}")
    print(f"core logs: {logs} (validated against the spec when each trial's facade closed)")
    print(f"campaign: {'PASSED' if doc['passed'] else 'FAILED'} in {doc['wall_s']:.0f} s")
    return 0 if doc["passed"] else 1
