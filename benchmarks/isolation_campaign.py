"""``retire isolation``: the co-tenant isolation campaign (issue 17, item 4) on real vLLM, CPU.

Per seed, one in-process engine is shared by several tenants under one ``RetireEngine``: each
*victim* tenant runs ordinary scopes and unscoped requests (under its tenant's ``cache_salt``),
some sharing a prompt prefix with every other tenant (where vLLM's prefix cache would hand a page
across tenants if isolation broke) and some sharing one only within the tenant (allowed), while
the *bursty* tenant's scopes are revised in bursts (several revisions in quick succession, some
landing while a step is in flight, each keeping part of the context). Measured per seed: the
victims' tokens and text against their *clean run* (the same victim requests on the same engine
with no bursty tenant), pages crossing tenants (``TenantAudit``) and Rule 3 writes and bytes
(``IsolationAudit``) over the whole run, the checker's verdict on every scope's final version,
the core log validated against the spec and nothing left at close; beside it the bursty tenant
alone (the plain path) for supersede-to-last-receipt time and reuse. ``MUTANTS`` are seeded bugs
the campaign must fail on. What does not live here: the audits and the checker
(``retire_vllm.checker``), the fault hooks (``retire_vllm.faults``), and ``retire campaign``
(``campaign``): its unit is one fault on one scope, judged injected/detected/repaired, while this
one's unit is a whole multi-tenant run judged by equality with a clean run, so it is a command of
its own.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs

from retire_checks.cli import command

#: The engine's KV pool (32-token blocks): the whole workload fits without preemption.
NUM_BLOCKS = 256
VICTIMS = ("acme", "globex", "umbrella")
BURSTY = "initech"
SHARED_PREFIX = 96  # tokens every tenant's prompts start with: 3 full blocks
TENANT_PREFIX = 64  # tokens one victim tenant's second scope starts with: 2 full blocks

_RUNS = itertools.count()


# --- the workload ----------------------------------------------------------------------------


@attrs.frozen
class Request:
    """A scope's first version, or an unscoped request (``scoped`` False), sent before ``at``."""

    tenant: str
    name: str
    scoped: bool
    prompt: tuple[int, ...]
    max_tokens: int
    at: int


@attrs.frozen
class Revision:
    """A revision of the bursty tenant's ``scope`` before step ``at`` (``in_flight``: while that
    step is scheduled and its model run is still to come)."""

    scope: str
    prompt: tuple[int, ...]
    max_tokens: int
    at: int
    in_flight: bool


@attrs.frozen
class Workload:
    seed: int
    requests: tuple[Request, ...]
    revisions: tuple[Revision, ...]

    def victims_only(self) -> Workload:
        return attrs.evolve(
            self, requests=tuple(r for r in self.requests if r.tenant != BURSTY), revisions=()
        )

    def bursty_only(self) -> Workload:
        return attrs.evolve(self, requests=tuple(r for r in self.requests if r.tenant == BURSTY))

    @property
    def tenants(self) -> list[str]:
        return sorted({r.tenant for r in self.requests})


def _tokens(rng: random.Random, n: int) -> tuple[int, ...]:
    return tuple(rng.randrange(1, 2048) for _ in range(n))


def workload(
    seed: int,
    *,
    victims: Sequence[str] = VICTIMS,
    bursty_scopes: int = 3,
    bursts: int = 3,
    burst_len: int = 3,
) -> Workload:
    """The seed's requests. Each victim tenant, sent over the first 12 steps: scope ``<t>/s0``
    on the prefix every tenant shares, scope ``<t>/s1`` on its own tenant's prefix, and two
    unscoped requests on the shared prefix, the second sent once the first is cached (a hit
    within the tenant); 24-48 tokens each, so they run through the bursts. The bursty tenant:
    ``bursty_scopes`` scopes on the shared prefix, each revised in ``bursts`` bursts (about 8
    steps apart) of ``burst_len`` revisions at most one step apart, each keeping from 33 tokens
    to all but one of the previous prompt and adding 8-39 new ones."""
    rng = random.Random(f"isolation:{seed}")
    shared = _tokens(rng, SHARED_PREFIX)
    requests: list[Request] = []
    for tenant in victims:
        own = _tokens(rng, TENANT_PREFIX)
        for i, prefix in enumerate((shared, own)):
            prompt = prefix + _tokens(rng, rng.randrange(20, 60))
            at = rng.randrange(0, 10)
            requests.append(
                Request(tenant, f"{tenant}/s{i}", True, prompt, rng.randrange(24, 49), at)
            )
        first = rng.randrange(0, 8)
        for i, at in enumerate((first, first + rng.randrange(2, 5))):
            prompt = shared + _tokens(rng, rng.randrange(20, 60))
            name = f"{tenant}/u{i}"
            requests.append(Request(tenant, name, False, prompt, rng.randrange(24, 49), at))
    revisions: list[Revision] = []
    for j in range(bursty_scopes):
        scope = f"{BURSTY}/b{j}"
        prompt = shared + _tokens(rng, 64)
        requests.append(Request(BURSTY, scope, True, prompt, 24, j))
        for b in range(bursts):
            at = 2 + 8 * b + rng.randrange(0, 4)
            for k in range(burst_len):
                at += rng.choice((0, 0, 1)) if k else 0
                if rng.random() < 0.5:
                    keep = len(prompt) - rng.randrange(1, 16)
                else:
                    keep = rng.randrange(33, len(prompt))
                prompt = prompt[:keep] + _tokens(rng, rng.randrange(8, 40))
                prompt = prompt[-300:] if len(prompt) > 300 else prompt
                last = b == bursts - 1 and k == burst_len - 1
                max_tokens = 16 if last else rng.randrange(8, 20)
                revisions.append(Revision(scope, prompt, max_tokens, at, rng.random() < 0.5))
    return Workload(seed, tuple(requests), tuple(revisions))


# --- mutants: seeded bugs the campaign must fail on ------------------------------------------


@attrs.frozen
class Mutant:
    name: str
    bug: str
    must: str  # what in the report must show it
    salt: Callable[[str], str | None] | None = None  # the unscoped requests' cache salt
    # on the facade before the run; may return a hook called before every step
    prepare: Callable[[Any], Callable[[Any, int], None] | None] | None = None


def _share_cold_salts(facade: Any) -> None:
    from retire_vllm import faults

    faults.shared_cold_salt(facade)


def _corrupt_victim_output(facade: Any) -> Callable[[Any, int], None]:
    """Once the first victim scope has delivered a few tokens: one extra token frame of its
    current version at the engine boundary (what a transport delivering a frame twice, or a
    corrupted one, would hand the core: it is current, so it publishes)."""
    from retire_vllm import faults

    scope = f"{VICTIMS[0]}/s0"
    done: list[bool] = []

    def at_step(facade: Any, step: int) -> None:
        if done or scope not in facade.records:
            return
        rec = facade.version_record(scope)
        if len(rec.delivered_token_ids) >= 4 and rec.finish_reason is None:
            faults.inject_frame(facade, scope, rec.version, [rec.delivered_token_ids[-1]])
            done.append(True)

    return at_step


MUTANTS: dict[str, Mutant] = {
    m.name: m
    for m in (
        Mutant(
            "unscoped_salt_dropped",
            "victims' unscoped requests are sent without their tenant's cache_salt",
            "cross-tenant pages > 0 (the outputs still match: a prefix hit computes the same KV)",
            salt=lambda tenant: None,
        ),
        Mutant(
            "shared_cold_salt",
            "every version that inherits nothing runs under one cache_salt, whatever its "
            "tenant and scope (faults.shared_cold_salt)",
            "the run fails: vLLM finds other scopes' blocks as prefix hits",
            prepare=_share_cold_salts,
        ),
        Mutant(
            "victim_output_corrupted",
            "one extra token frame of a victim scope's current version reaches its consumer "
            "(faults.inject_frame)",
            "mismatches > 0 and the checker refuses the scope",
            prepare=_corrupt_victim_output,
        ),
    )
}


def tenant_salt(tenant: str) -> str:
    """The cache salt of a tenant's unscoped requests (vLLM's own tenant isolation)."""
    return f"tenant:{tenant}"


# --- one run -----------------------------------------------------------------------------------


def _decode(engine: Any, token_ids: Sequence[int]) -> str:
    return str(engine.get_tokenizer().decode(list(token_ids)))


def _drive(
    facade: Any,
    wl: Workload,
    salt: Callable[[str], str | None],
    at_step: Callable[[Any, int], None] | None,
    external_tenants: dict[str, str],
) -> dict[str, str]:
    """Send the workload at its steps, step the engine, and let every scope's consumer read
    after every step (the bursty tenant's every second step: chunks wait in its queue across
    revisions). Returns unscoped request name -> internal request id."""
    requests = sorted(wl.requests, key=lambda r: r.at)
    revisions = sorted(wl.revisions, key=lambda r: r.at)
    last = max([r.at for r in requests] + [r.at for r in revisions] + [0])
    unscoped: dict[str, str] = {}
    scopes = [r.name for r in requests if r.scoped]

    def consume(step: int) -> None:
        for scope in scopes:
            if scope in facade.records and (step % 2 == 0 or not scope.startswith(BURSTY)):
                facade.consume(scope)

    for step in itertools.count():
        for r in requests:
            if r.at != step:
                continue
            if r.scoped:
                facade.submit(r.name, r.prompt, max_tokens=r.max_tokens, tenant=r.tenant)
            else:
                rid = facade.add_external(r.name, r.prompt, r.max_tokens, salt(r.tenant))
                unscoped[r.name] = rid
                external_tenants[rid] = r.tenant
        for rev in revisions:
            if rev.at != step:
                continue
            if rev.in_flight and facade.has_unfinished():

                def revise(f: Any, rev: Revision = rev) -> None:
                    f.supersede(rev.scope, rev.prompt, max_tokens=rev.max_tokens)

                facade.during_next_step(revise)
            else:
                facade.supersede(rev.scope, rev.prompt, max_tokens=rev.max_tokens)
        if at_step is not None:
            at_step(facade, step)
        if step > last and not facade.has_unfinished():
            break
        if facade.has_unfinished():
            facade.step()
        consume(step)
    consume(0)
    return unscoped


@attrs.define
class RunResult:
    """What one run of a workload left: the victims' outputs, the audits, the verdicts."""

    outputs: dict[str, tuple[int, ...]] = attrs.field(factory=dict)  # victim name -> tokens
    engine_outputs: dict[str, tuple[int, ...]] = attrs.field(factory=dict)  # scoped: vLLM's
    texts: dict[str, str] = attrs.field(factory=dict)
    scopes: int = 0
    revisions: int = 0
    crossings: list[str] = attrs.field(factory=list)
    audit_problems: list[str] = attrs.field(factory=list)
    shared_within_tenant: int = 0
    late_writes: int = 0
    closed_pages_checked: int = 0
    verdicts: dict[str, bool] = attrs.field(factory=dict)  # scope -> checker admits it
    checker_problems: list[str] = attrs.field(factory=list)
    core_log_transitions: int | None = None
    leaks: list[str] = attrs.field(factory=list)
    error: str | None = None
    supersede_to_last_receipt_ms: list[float] = attrs.field(factory=list)
    adopted_blocks: int = 0
    reusable_blocks: int = 0
    steps: int = 0
    wall_s: float = 0.0


def _revision_metrics(facade: Any, out: RunResult) -> None:
    """Per revision of a scope: supersede (the successor's submission) to the last receipt of
    the version it fenced, and the blocks the successor adopted against those it could."""
    from retire_vllm import identity

    for log in facade.records.values():
        versions = log.versions
        out.revisions += len(versions) - 1
        for pred, succ in itertools.pairwise(versions):
            if pred.admitted and pred.fenced and pred.closed_at is not None:
                ms = (pred.closed_at - succ.submitted_at) * 1e3
                out.supersede_to_last_receipt_ms.append(round(ms, 3))
        for i, succ in enumerate(versions):
            before = [v for v in versions[:i] if v.admitted]
            if not succ.admitted or not before:
                continue
            out.adopted_blocks += succ.adopted_blocks
            out.reusable_blocks += identity.expected_adopted_blocks(
                before[-1].prompt, succ.prompt, facade.block_size
            )


def run_workload(
    engine: Any,
    wl: Workload,
    *,
    checker: Any | None = None,
    mutant: Mutant | None = None,
    log_dir: Path | None = None,
    label: str = "run",
) -> RunResult:
    """One run of ``wl`` on ``engine`` (idle, its prefix cache reset first) under a fresh
    ``RetireEngine`` with both audits attached for the whole run; ``checker`` given: its
    verdict on every scope's final version. A run that raises is recorded (``error``)."""
    from retire_vllm import introspect as ix
    from retire_vllm.checker import IsolationAudit, TenantAudit
    from retire_vllm.facade import RetireEngine

    t0 = time.perf_counter()
    out = RunResult()
    if not engine.reset_prefix_cache():  # (a run that broke may have left it busy)
        out.error = "the engine's prefix cache cannot be reset: an earlier run left it busy"
        return out
    directory = log_dir or Path(
        os.environ.get("RETIRE_CORE_LOG_DIR") or tempfile.mkdtemp(prefix="retire-isolation-")
    )
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"isolation-s{wl.seed}-{label}-{os.getpid()}-{next(_RUNS)}.jsonl"
    facade = RetireEngine(engine=engine, log_path=path)
    isolation = IsolationAudit().attach(facade)
    tenants = TenantAudit().attach(facade)
    salt: Callable[[str], str | None] = tenant_salt
    try:
        at_step = None
        if mutant is not None and mutant.salt is not None:
            salt = mutant.salt
        if mutant is not None and mutant.prepare is not None:
            at_step = mutant.prepare(facade)
        unscoped = _drive(facade, wl, salt, at_step, tenants.external_tenants)
        out.steps = tenants.steps
        tenants.detach()  # the checker's references run on this engine: not the workload's
        facade.observers.remove(isolation)
        for r in wl.requests:
            if r.tenant == BURSTY:
                continue
            if r.scoped:
                rec = facade.version_record(r.name)
                out.outputs[r.name] = tuple(rec.delivered_token_ids)
                out.engine_outputs[r.name] = tuple(rec.output_token_ids)
            else:
                out.outputs[r.name] = tuple(facade.external[unscoped[r.name]].token_ids)
            out.texts[r.name] = _decode(engine, out.outputs[r.name])
        if checker is not None:
            for verdict in checker.verify_run(facade).verdicts:
                final = facade.version_record(verdict.scope).version
                out.verdicts[verdict.scope] = verdict.ok and verdict.version == final
                out.checker_problems.extend(verdict.problems)
                if verdict.version != final:
                    out.checker_problems.append(
                        f"{verdict.scope}: final version {final} was never admitted"
                    )
    except Exception as err:  # a run that breaks is a result (a mutant may well break it)
        out.error = f"{type(err).__name__}: {err}"
    finally:
        tenants.detach()
        try:
            facade.close()  # leak check; validates the core log against the spec
        except Exception as err:
            msg = f"at close: {type(err).__name__}: {err}"
            out.error = f"{out.error}; {msg}" if out.error else msg
        out.core_log_transitions = facade.core_log.validated if facade.core_log else None
        out.scopes = len(facade.records)
        _revision_metrics(facade, out)  # (records only: also of a run that broke)
    pool = ix.block_pool(engine)
    if ix.scheduler(engine).has_unfinished_requests():
        out.leaks.append("requests left in the scheduler")
    if pool.get_num_free_blocks() != pool.num_gpu_blocks - 1:
        out.leaks.append(f"{pool.num_gpu_blocks - 1 - pool.get_num_free_blocks()} blocks held")
    out.crossings = list(tenants.crossings)
    out.audit_problems = list(isolation.violations) + list(tenants.unattributed)
    out.shared_within_tenant = tenants.shared_within_tenant
    out.late_writes = isolation.late_writes
    out.closed_pages_checked = isolation.pages_checked
    out.wall_s = round(time.perf_counter() - t0, 2)
    return out


# --- one seed, and the campaign ------------------------------------------------------------------


def _summary(ms: list[float]) -> dict[str, float | None]:
    if not ms:
        return {"n": 0, "p50": None, "max": None}
    return {"n": len(ms), "p50": round(statistics.median(ms), 2), "max": round(max(ms), 2)}


def compare(clean: RunResult, shared: RunResult) -> tuple[int, int, list[str]]:
    """(tokens compared, mismatching victim requests, what differs): each victim request's
    tokens (what its consumer got; for a scope also what vLLM generated) and its text, against
    the clean run, byte for byte."""
    compared, mismatched, notes = 0, 0, []
    for name, want in clean.outputs.items():
        got = shared.outputs.get(name)
        compared += len(want)
        diffs = []
        if got != want:
            at = next(
                (i for i, (a, b) in enumerate(zip(got or (), want, strict=False)) if a != b),
                min(len(got or ()), len(want)),
            )
            diffs.append(f"tokens differ at {at} ({len(got or ())} vs {len(want)})")
        engine = clean.engine_outputs.get(name)
        if engine is not None and shared.engine_outputs.get(name) != engine:
            diffs.append("vLLM's tokens differ")
        if shared.texts.get(name, "").encode() != clean.texts[name].encode():
            diffs.append("text differs")
        if diffs:
            mismatched += 1
            notes.append(f"{name}: " + "; ".join(diffs))
    return compared, mismatched, notes


def run_seed(
    engine: Any,
    checker: Any,
    seed: int,
    *,
    mutant: Mutant | None = None,
    log_dir: Path | None = None,
    clean: RunResult | None = None,
    plain: RunResult | None = None,
) -> dict[str, Any]:
    """The seed's three runs on ``engine``: the victims alone (clean), the bursty tenant alone
    (plain), and all tenants together with ``mutant`` if any; ``clean``/``plain`` given: reused."""
    wl = workload(seed)
    if clean is None:
        clean = run_workload(engine, wl.victims_only(), log_dir=log_dir, label="clean")
    if plain is None:
        plain = run_workload(engine, wl.bursty_only(), log_dir=log_dir, label="plain")
    shared = run_workload(
        engine, wl, checker=checker, mutant=mutant, log_dir=log_dir, label="shared"
    )
    compared, mismatches, notes = compare(clean, shared)
    admitted = sum(shared.verdicts.values())
    errors = [f"{k}: {r.error}" for k, r in (("clean", clean), ("plain", plain)) if r.error]
    if shared.error:
        errors.append(f"shared: {shared.error}")
    row = {
        "seed": seed,
        "mutant": mutant.name if mutant else None,
        "tenants": len(wl.tenants),
        "scopes": shared.scopes,
        "unscoped_requests": sum(not r.scoped for r in wl.requests),
        "revisions": shared.revisions,
        "steps": shared.steps,
        "tokens_compared": compared,
        "mismatches": mismatches,
        "mismatch_details": notes,
        "cross_tenant_pages": len(shared.crossings),
        "crossings": shared.crossings[:20],
        "audit_problems": len(shared.audit_problems),
        "audit_problem_details": shared.audit_problems[:20],
        "pages_shared_within_tenant": shared.shared_within_tenant,
        "late_writes": shared.late_writes,
        "closed_page_checks": shared.closed_pages_checked,
        "checker_admitted": admitted,
        "checker_verdicts": len(shared.verdicts),
        "checker_problems": shared.checker_problems[:20],
        "core_log_transitions": shared.core_log_transitions,
        "core_log_transitions_clean_plain": [
            clean.core_log_transitions,
            plain.core_log_transitions,
        ],
        "leaks": clean.leaks + plain.leaks + shared.leaks,
        "errors": errors,
        "supersede_to_last_receipt_ms": {
            "shared": _summary(shared.supersede_to_last_receipt_ms),
            "plain": _summary(plain.supersede_to_last_receipt_ms),
        },
        "reuse": {
            "shared": {"adopted": shared.adopted_blocks, "reusable": shared.reusable_blocks},
            "plain": {"adopted": plain.adopted_blocks, "reusable": plain.reusable_blocks},
        },
        "wall_s": {"clean": clean.wall_s, "plain": plain.wall_s, "shared": shared.wall_s},
    }
    row["passed"] = passed(row)
    return row


def passed(row: dict[str, Any]) -> bool:
    """Victims equal their clean run, no page crossed a tenant, no audit problem, the checker
    admits every scope's final version, the core log validated, nothing left, nothing broke."""
    return (
        row["mismatches"] == 0
        and row["tokens_compared"] > 0
        and row["cross_tenant_pages"] == 0
        and row["audit_problems"] == 0
        and row["checker_verdicts"] == row["scopes"] > 0
        and row["checker_admitted"] == row["checker_verdicts"]
        and bool(row["core_log_transitions"])
        and not row["leaks"]
        and not row["errors"]
    )


def run(
    seeds: Sequence[int],
    *,
    mutant: str | None = None,
    engine: Any | None = None,
    checker: Any | None = None,
    log_dir: Path | None = None,
) -> dict[str, Any]:
    """Every seed; returns the JSON document. ``engine`` (in-process, ``RetireScheduler``) and
    ``checker`` are built when not given."""
    from retire_vllm.checker import Checker
    from retire_vllm.engine_config import build_engine
    from retire_vllm.scheduler import RetireScheduler

    built = []
    if engine is None:
        engine = build_engine(num_blocks=NUM_BLOCKS, scheduler_cls=RetireScheduler)
        built.append(engine)
    if checker is None:
        reference = build_engine(num_blocks=NUM_BLOCKS)
        built.append(reference)
        checker = Checker(reference)
    t0 = time.perf_counter()
    try:
        rows = [
            run_seed(
                engine,
                checker,
                seed,
                mutant=MUTANTS[mutant] if mutant else None,
                log_dir=log_dir,
            )
            for seed in seeds
        ]
    finally:
        for eng in built:
            eng.engine_core.shutdown()
    return {
        "seeds": list(seeds),
        "mutant": mutant,
        "mutant_bug": MUTANTS[mutant].bug if mutant else None,
        "tenants": {"victims": list(VICTIMS), "bursty": BURSTY},
        "rows": rows,
        "wall_s": round(time.perf_counter() - t0, 2),
        "passed": all(r["passed"] for r in rows),
    }


COLUMNS = (
    ("seed", "seed"),
    ("tenants", "tenants"),
    ("scopes", "scopes"),
    ("revisions", "revisions"),
    ("tokens_compared", "tokens compared"),
    ("mismatches", "mismatches"),
    ("cross_tenant_pages", "cross-tenant pages"),
    ("audit_problems", "audit problems"),
    ("checker_admitted", "checker admitted"),
)


def table(doc: dict[str, Any]) -> str:
    head = [title for _, title in COLUMNS] + ["shared in tenant", "core log", "passed"]
    rows = []
    for r in doc["rows"]:
        cells = [str(r[key]) for key, _ in COLUMNS]
        cells[-1] = f"{r['checker_admitted']}/{r['scopes']}"
        cells += [
            str(r["pages_shared_within_tenant"]),
            "valid" if r["core_log_transitions"] else "-",
            "yes" if r["passed"] else "NO",
        ]
        rows.append(cells)
    widths = [max(len(x[i]) for x in [head, *rows]) for i in range(len(head))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(x, widths, strict=True)) for x in [head, *rows]
    )


def _configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--json", type=Path, default=None, help="write the report JSON here")
    p.add_argument(
        "--mutant",
        choices=sorted(MUTANTS),
        default=None,
        help="run with a seeded bug the campaign must fail on (then it exits 1)",
    )
    p.add_argument(
        "--core-logs",
        type=Path,
        default=None,
        help="each run's facade writes the core's transition log here and validates it against "
        "the spec when it closes (default: a new temporary directory)",
    )


@command(
    "isolation",
    "co-tenant isolation campaign on real vLLM: one tenant revised in bursts, the others "
    "equal to their clean runs, no page across tenants",
    _configure,
)
def _isolation(args: argparse.Namespace) -> int:
    from retire_bench.cli import _core_logs
    from retire_bench.systems import prepare_env

    prepare_env()
    logs = _core_logs(args)
    doc = run(args.seeds, mutant=args.mutant, log_dir=logs)
    print(table(doc))
    for r in doc["rows"]:
        for what in ("errors", "mismatch_details", "crossings", "audit_problem_details"):
            for line in r[what][:5]:
                print(f"seed {r['seed']}: {what}: {line}", file=sys.stderr)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, indent=2, default=str) + "\n")
        print(f"results: {args.json}")
    print(f"core logs: {logs} (validated against the spec when each run's facade closed)")
    print(f"isolation: {'PASSED' if doc['passed'] else 'FAILED'} in {doc['wall_s']:.0f} s")
    return 0 if doc["passed"] else 1
