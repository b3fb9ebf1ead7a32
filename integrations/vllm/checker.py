"""The checker: is what a ``RetireEngine`` run produced right, judged against a clean reference?

:class:`Checker` runs a *clean reference* of a version -- the same prompt and token budget, cold
(fresh ``cache_salt``, nothing cached), the same contract (greedy float32) -- on a reference
engine that shares nothing with the engine under test (or, if none is given, on that engine under
an independent salt), and :meth:`Checker.verify` compares:

* **output**: the version's token ids equal the reference's exactly, and what the consumer got
  is a prefix of them (all of them once the scope's queue has been read);
* **pages**: every adopted page was certified at its position, was reported with its certified
  digest, is still retained for this version at the same vLLM generation, its bytes *now* (read
  independently of the facade's byte check) still have the certified digest, and they equal the
  bytes the clean reference computed for that block (for a block the previous version's decode
  wrote, a clean run of that version: a decode's KV is not a prefill's to the bit); vLLM's
  prefix hit is exactly the adopted block ids and ``num_cached_tokens`` is the adopted token
  count;
* **receipts**: every participant of every retired version delivered its receipt, and no page of
  a retired version is still retained unless it was adopted;
* **publication**: nothing of a retired version reached the consumer after the revision that
  retired it.

The answer is a :class:`Verdict` (attrs).  :class:`IsolationAudit` checks Rule 3 during a run
(retired work never writes into a page owned by someone else), physically and logically;
:class:`TenantAudit` checks it across tenants: no page one tenant wrote is ever read or written
by a request of another tenant, whether under Retire or not (vLLM's prefix cache is where a page
would cross).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from retire_core.handoff import required_slots

from . import identity, observe
from . import introspect as ix
from .errors import IntegrationError

if TYPE_CHECKING:
    from vllm.v1.engine.llm_engine import LLMEngine

    from .facade import RetireEngine
    from .facade_records import VersionRecord


@attrs.frozen
class Reference:
    prompt: tuple[int, ...]
    max_tokens: int
    token_ids: tuple[int, ...]
    # KV digests of the prompt's full blocks by (KV cache group, position); a sliding-window
    # group's blocks are read as each step computes them (its window then moves past them)
    block_digests: Mapping[tuple[int, int], str]
    num_cached_tokens: int


@attrs.frozen
class Verdict:
    scope: str
    version: int
    tokens_match: bool
    first_divergence: int | None
    reference_token_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    delivered_prefix_ok: bool
    adopted_blocks: int
    expected_adopted_blocks: int | None
    num_cached_tokens: int | None
    page_problems: tuple[str, ...]
    receipt_problems: tuple[str, ...]
    publication_problems: tuple[str, ...]
    kv_matches_reference: bool | None
    complete: bool  # the version ran to its token budget (else its output is compared as a prefix)

    @property
    def ok(self) -> bool:
        return (
            self.tokens_match
            and self.delivered_prefix_ok
            and not self.page_problems
            and not self.receipt_problems
            and not self.publication_problems
        )

    @property
    def problems(self) -> tuple[str, ...]:
        out = []
        if not self.tokens_match:
            out.append(
                f"{self.scope}@{self.version}: tokens differ from the clean reference at index "
                f"{self.first_divergence}"
            )
        if not self.delivered_prefix_ok:
            out.append(
                f"{self.scope}@{self.version}: the consumer got tokens that are not a prefix of "
                "the version's output"
            )
        return (*out, *self.page_problems, *self.receipt_problems, *self.publication_problems)


@attrs.frozen
class RunVerdict:
    """The checker's verdict on a whole run: one :class:`Verdict` per scope (its last admitted
    version).  ``ok`` only if every one is."""

    verdicts: tuple[Verdict, ...]

    @property
    def ok(self) -> bool:
        return all(v.ok for v in self.verdicts)

    @property
    def problems(self) -> tuple[str, ...]:
        return tuple(p for v in self.verdicts for p in v.problems)


class Checker:
    """Clean references and verdicts.  ``reference_engine``: an ``LLMEngine`` that shares nothing
    with the engine under test (recommended); ``None``: use the facade's own engine under a fresh
    salt (it is stepped until idle, so call :meth:`verify` when the run is over)."""

    def __init__(self, reference_engine: LLMEngine | None = None) -> None:
        self.reference_engine = reference_engine
        self._cache: dict[tuple[tuple[int, ...], int], Reference] = {}
        self._salts = 0

    # ---- references ---------------------------------------------------------------------------

    def references(
        self, jobs: Sequence[tuple[Sequence[int], int]], facade: RetireEngine | None = None
    ) -> list[Reference]:
        """Clean cold references for ``(prompt, max_tokens)`` jobs, run as one batch."""
        keys = [(tuple(int(t) for t in p), int(m)) for p, m in jobs]
        todo = list(dict.fromkeys(k for k in keys if k not in self._cache))
        if todo:
            if self.reference_engine is not None:
                self._run_on_engine(self.reference_engine, todo)
            elif facade is not None:
                self._run_on_facade(facade, todo)
            else:
                raise ValueError("no reference engine and no facade to run references on")
        return [self._cache[k] for k in keys]

    def reference(
        self, prompt: Sequence[int], max_tokens: int, facade: RetireEngine | None = None
    ) -> Reference:
        return self.references([(prompt, max_tokens)], facade)[0]

    def _salt(self) -> str:
        self._salts += 1
        return f"retire-reference:{id(self)}:{self._salts}"

    def _run_on_engine(self, engine: LLMEngine, todo: list[tuple[tuple[int, ...], int]]) -> None:
        from vllm.sampling_params import RequestOutputKind, SamplingParams

        ids: dict[str, tuple[tuple[int, ...], int]] = {}
        for prompt, max_tokens in todo:
            params = SamplingParams(
                temperature=0.0,
                max_tokens=max_tokens,
                ignore_eos=True,
                output_kind=RequestOutputKind.FINAL_ONLY,
            )
            external = f"reference-{self._salt()}"
            rid = engine.add_request(
                external,
                {"prompt_token_ids": list(prompt), "cache_salt": self._salt()},
                params,
            )
            ids[rid] = (prompt, max_tokens)
        by_external = {rid.rsplit("-", 1)[0]: rid for rid in ids}
        digests: dict[str, dict[tuple[int, int], str]] = {rid: {} for rid in ids}
        finals: dict[str, Any] = {}
        sched = ix.scheduler(engine)
        kvm = ix.kv_cache_manager(engine)
        null = ix.null_block_id(kvm)
        executor: Any = ix.engine_core(engine).model_executor
        bs = int(sched.block_size)
        for _ in range(100_000):
            if not engine.has_unfinished_requests():
                break
            outputs = engine.step()
            # A full block never changes once computed: digest each group's as the step that
            # filled it returns (a sliding window drops them at the next schedule). The blocks
            # the decode wrote too: a successor may inherit them from a version that ran.
            unread: dict[tuple[str, int, int], int] = {}
            for rid in ids:
                request = sched.requests.get(rid)
                if request is None:
                    continue
                full = int(request.num_computed_tokens) // bs
                for g, table in enumerate(ix.manager_block_tables(kvm, rid)):
                    for i in range(min(full, len(table))):
                        if table[i] != null and (g, i) not in digests[rid]:
                            unread[(rid, g, i)] = table[i]
            if unread:
                got = _digests(executor, list(unread.values()))
                for (rid, g, i), block in unread.items():
                    digests[rid][(g, i)] = got[block]
            for out in outputs:
                if out.finished:
                    finals[by_external.get(out.request_id, out.request_id)] = out
        for rid, (prompt, max_tokens) in ids.items():
            out = finals[rid]
            self._cache[(prompt, max_tokens)] = Reference(
                prompt,
                max_tokens,
                tuple(int(t) for t in out.outputs[0].token_ids),
                digests[rid],
                int(out.num_cached_tokens or 0),
            )

    def _run_on_facade(self, facade: RetireEngine, todo: list[tuple[tuple[int, ...], int]]) -> None:
        rids = {}
        for prompt, max_tokens in todo:
            rid = facade.add_external(f"reference-{self._salt()}", prompt, max_tokens, self._salt())
            rids[rid] = (prompt, max_tokens)
        facade.run_until_idle()
        for rid, (prompt, max_tokens) in rids.items():
            ext = facade.external.pop(rid)
            self._cache[(prompt, max_tokens)] = Reference(
                prompt, max_tokens, tuple(ext.token_ids), {}, int(ext.num_cached_tokens or 0)
            )

    # ---- verdicts -----------------------------------------------------------------------------

    def verify(self, facade: RetireEngine, scope: str, version: int | None = None) -> Verdict:
        log = facade.records[scope]
        rec = log.current if version is None else log.version(version)
        ref = self.reference(rec.prompt, rec.max_tokens, facade)
        out = tuple(rec.output_token_ids)
        complete = rec.finish_reason in ("length", "stop")
        # A version stopped early (fenced, cancelled) must still have produced a prefix of it.
        same_length = len(out) == len(ref.token_ids) or (
            not complete and len(out) <= len(ref.token_ids)
        )
        divergence = next(
            (i for i, (a, b) in enumerate(zip(out, ref.token_ids, strict=False)) if a != b),
            None if same_length else min(len(out), len(ref.token_ids)),
        )
        delivered = tuple(rec.delivered_token_ids)
        delivered_ok = out[: len(delivered)] == delivered
        previous = log.version(rec.version - 1) if rec.version > 0 else None
        expected: int | None = None
        if previous is not None:
            written = identity.written_tokens(previous.prompt, previous.output_token_ids)
            expected = (
                identity.expected_adopted_blocks(written, rec.prompt, facade.block_size)
                if rec.contract.allows_reuse
                else 0
            )
        page_problems, kv_ok = self._check_pages(facade, rec, ref, previous)
        return Verdict(
            scope=scope,
            version=rec.version,
            tokens_match=divergence is None,
            first_divergence=divergence,
            reference_token_ids=ref.token_ids,
            token_ids=out,
            delivered_prefix_ok=delivered_ok,
            adopted_blocks=rec.adopted_blocks,
            expected_adopted_blocks=expected,
            num_cached_tokens=rec.num_cached_tokens,
            page_problems=tuple(page_problems),
            receipt_problems=tuple(self._check_receipts(facade, scope, rec.version)),
            publication_problems=tuple(self._check_publication(facade, scope)),
            kv_matches_reference=kv_ok,
            complete=complete,
        )

    def verify_run(self, facade: RetireEngine) -> RunVerdict:
        """Verify every scope of a run (before ``close``): its last admitted version."""
        verdicts = []
        for scope, log in facade.records.items():
            admitted = [r for r in log.versions if r.admitted]
            if admitted:
                verdicts.append(self.verify(facade, scope, admitted[-1].version))
        return RunVerdict(tuple(verdicts))

    def _check_pages(
        self,
        facade: RetireEngine,
        rec: VersionRecord,
        ref: Reference,
        previous: VersionRecord | None = None,
    ) -> tuple[list[str], bool | None]:
        """``previous``: the version before ``rec``. A block past its prompt's full blocks was
        written by its decode, whose KV is not bit-identical to a prefill's of the same tokens
        (float rounding): such an adopted page is compared with a clean run of ``previous``
        (decode-written there too), not with ``rec``'s reference."""
        problems: list[str] = []
        bs = facade.block_size
        adopted = list(rec.adopted_pages)
        cut = rec.adopted_blocks
        windows = rec.contract.kv_windows
        slots = required_slots(windows, cut)
        if len(adopted) != len(slots):
            problems.append(
                f"{len(adopted)} pages handed over for {cut} blocks ({len(slots)} slots over "
                f"{len(windows)} KV cache group(s))"
            )
        if rec.num_cached_tokens is not None and rec.num_cached_tokens != cut * bs:
            problems.append(
                f"vLLM reports {rec.num_cached_tokens} cached tokens for {cut} adopted blocks"
            )
        certified = {
            e[0]: e for e in rec.certificate
        }  # page -> (page, position, gen, digest, group)
        never = [p for p in adopted if p not in certified]
        problems += [f"adopted page {p} was never certified" for p in never]
        if not never and rec.hit_block_ids is not None:
            # vLLM's prefix hit in every group: the adopted pages at their certified slots
            try:
                expected = observe.adoption_tables(
                    adopted,
                    {p: (certified[p][4], certified[p][1]) for p in adopted},
                    windows,
                    cut,
                    facade.null_block,
                )
            except IntegrationError as err:
                problems.append(f"adopted pages do not fill the cut's slots: {err}")
            else:
                if tuple(rec.hit_block_ids) != expected:
                    problems.append(f"prefix hit {rec.hit_block_ids} != adopted pages {expected}")
        core_pages = facade.retire.state.pages
        live = [p for p in adopted if facade.owner_of(p) == (rec.scope, rec.version)]
        now = _digests(facade.executor, live)
        kv_ok: bool | None = None
        if ref.block_digests and live:
            kv_ok = True
        for page in adopted:
            if page not in certified:
                continue
            _, pos, gen, digest, group = certified[page]
            if rec.adoption_report.get(page) != digest:
                problems.append(f"page {page} was adopted with a reported digest != certified")
            if page not in live:
                continue  # released since (the scope moved on): nothing left to read
            core = core_pages.get(page)
            if core is None or core.generation != gen:
                problems.append(f"page {page} changed generation since certification")
            if now[page] != digest:
                problems.append(f"page {page}: bytes now != certified digest (content changed)")
            source = ref
            if previous is not None and pos >= len(previous.prompt) // bs:
                source = self.reference(previous.prompt, previous.max_tokens, facade)
            reference = source.block_digests.get((group, pos))
            if reference is not None and now[page] != reference:
                kv_ok = False
                problems.append(
                    f"page {page}: KV bytes differ from the clean reference's block {pos} of "
                    f"KV cache group {group}"
                )
        return problems, kv_ok

    def _check_receipts(self, facade: RetireEngine, scope: str, upto: int) -> list[str]:
        problems = []
        log = facade.records[scope]
        for rec in log.versions[:upto]:
            if not rec.admitted:
                continue
            missing = [p for p in rec.participants if p not in rec.receipts]
            if missing:
                problems.append(f"{scope}@{rec.version}: no receipt from {missing}")
            kept = [p for p in rec.pages if facade.owner_of(p) == (scope, rec.version)]
            if kept:
                problems.append(f"{scope}@{rec.version} (retired) still retains pages {kept}")
        current = log.version(upto)
        if current.finish_reason not in (None, "abort") and not current.closed:
            problems.append(f"{scope}@{upto} finished without receipts from every participant")
        return problems

    def _check_publication(self, facade: RetireEngine, scope: str) -> list[str]:
        problems = []
        versions = facade.records[scope].versions
        for rec, nxt in itertools.pairwise(versions):
            if rec.last_delivery_at is not None and rec.last_delivery_at > nxt.submitted_at:
                problems.append(
                    f"{scope}@{rec.version} delivered tokens after the revision to {nxt.version}"
                )
        return problems


def _digests(executor: Any, block_ids: Sequence[int]) -> dict[int, str]:
    """Block digests read directly through the executor (independent of the facade's check)."""
    import hashlib

    ids = sorted(set(block_ids))
    if not ids:
        return {}
    per_rank = executor.collective_rpc(ix.worker_block_digests, args=(ids,))

    def one(r: dict[Any, str], p: int) -> str:
        return r[p] if p in r else r[str(p)]

    if len(per_rank) == 1:
        return {p: one(per_rank[0], p) for p in ids}
    return {
        p: hashlib.sha256("|".join(one(r, p) for r in per_rank).encode()).hexdigest() for p in ids
    }


# --- Rule 3 during a run -----------------------------------------------------------------------


@attrs.define
class IsolationAudit:
    """Watches every step of a facade (``facade.observers``).

    Logical check, before the model executes: every write the step will make goes into a block
    that the facade's ownership map gives to the writer's own (scope, version), at the vLLM
    generation at which that owner got it.  Physical check: the KV bytes of every writer-closed
    page that nobody writes in the step are digested before the step and again after it; any
    change is a write into someone else's (or a closed) page.  ``late_writes`` counts writes made
    by a version that was no longer current when the step ran (the late steps under test)."""

    violations: list[str] = attrs.field(factory=list)
    late_writes: int = 0
    writes: int = 0
    steps: int = 0
    pages_checked: int = 0
    _snapshot: dict[int, str] = attrs.field(factory=dict)

    def attach(self, facade: RetireEngine) -> IsolationAudit:
        facade.observers.append(self)
        return self

    def before_execute(self, facade: RetireEngine, writes: list[tuple[str, int, int]]) -> None:
        written = set()
        for rid, block, position in writes:
            req: Any = facade.reqs[rid]
            self.writes += 1
            written.add(block)
            if facade.retire.current_version(req.scope) != req.version:
                self.late_writes += 1
            owner = facade.owner_of(block)
            if owner != (req.scope, req.version):
                self.violations.append(
                    f"step {self.steps}: {rid} ({req.scope}@{req.version}) writes block {block} "
                    f"(position {position}) owned by {owner}"
                )
            page: Any = facade.pages.get(block)
            if page is not None and facade.page_generation(block) != page.retained_at:
                self.violations.append(f"step {self.steps}: block {block} changed generation")
        closed = [p for p, pg in facade.pages.items() if not pg.writer_open and p not in written]
        self._snapshot = _digests(facade.executor, closed)

    def after_step(self, facade: RetireEngine) -> None:
        self.steps += 1
        still = [p for p in self._snapshot if p in facade.pages]
        now = _digests(facade.executor, still)
        self.pages_checked += len(still)
        for p in still:
            if now[p] != self._snapshot[p]:
                owner = facade.owner_of(p)
                self.violations.append(
                    f"step {self.steps}: closed page {p} of {owner} changed during the step"
                )
        self._snapshot = {}


@attrs.define
class TenantAudit:
    """Pages crossing tenants, over a whole run (``attach``; ``detach`` before the checker runs
    its references on the same engine).

    It looks at every scheduled step *before* the facade's own checks (it wraps
    ``facade.after_schedule``, so that a crossing is counted even when the facade then refuses
    the step), at every scheduled request, under Retire or not (``external_tenants`` names the
    tenant of each request outside Retire, by internal request id; one it does not know is a
    tenant of its own).  The blocks a request's step writes belong to the request's tenant
    until vLLM hands the block out again (a new generation, ``facade.page_generation``); every
    other block in its block table is a page it reads (vLLM's prefix hit, or its own earlier
    writes).  Each (reader, block, generation) is judged once:

    * written by another tenant: a **crossing** (and so is a write into a page another tenant
      wrote at the same generation);
    * written by another request of the same tenant (a certified handoff between versions of a
      scope, a prefix shared by one tenant's requests): ``shared_within_tenant``, allowed;
    * written by nobody this audit saw: **unattributed** (it cannot vouch for the page).

    ``pages_read`` counts the pages judged that the reader did not write itself.
    """

    external_tenants: dict[str, str] = attrs.field(factory=dict)
    crossings: list[str] = attrs.field(factory=list)
    unattributed: list[str] = attrs.field(factory=list)
    shared_within_tenant: int = 0
    pages_read: int = 0
    pages_written: int = 0
    steps: int = 0
    # block -> (generation, tenant, writer) of its last write
    _writer: dict[int, tuple[int, str, str]] = attrs.field(factory=dict)
    _judged: set[tuple[str, int, int]] = attrs.field(factory=set)
    _facade: Any = None

    @property
    def problems(self) -> tuple[str, ...]:
        return (*self.crossings, *self.unattributed)

    def attach(self, facade: RetireEngine) -> TenantAudit:
        inner = facade.after_schedule

        def after_schedule(scheduler: Any, scheduler_output: Any) -> None:
            self.observe(facade, scheduler, scheduler_output)
            inner(scheduler, scheduler_output)

        facade.after_schedule = after_schedule  # type: ignore[method-assign]
        self._facade = facade
        return self

    def detach(self) -> None:
        if self._facade is not None:
            del self._facade.after_schedule  # the class's method shows again
            self._facade = None

    def tenant_of(self, facade: RetireEngine, rid: str) -> tuple[str, str]:
        """(tenant, writer) of a scheduled request: a version of a scope, or a request outside."""
        req = facade.reqs.get(rid)
        if req is not None:
            return facade.records[req.scope].tenant, f"{req.scope}@{req.version}"
        return self.external_tenants.get(rid, f"unnamed:{rid}"), rid

    def observe(self, facade: RetireEngine, scheduler: Any, scheduler_output: Any) -> None:
        self.steps += 1
        kvm = scheduler.kv_cache_manager
        null = ix.null_block_id(kvm)
        requests = scheduler.requests
        bs = facade.block_size
        gen = facade.page_generation
        writer = self._writer
        reads: list[tuple[str, str, str, list[int]]] = []
        # Every write of the step first (a prefix hit may be on a block filled in this step).
        for rid, n in scheduler_output.num_scheduled_tokens.items():
            tenant, who = self.tenant_of(facade, rid)
            end = int(requests[rid].num_computed_tokens)
            first = (end - int(n)) // bs
            for ids in ix.manager_block_tables(kvm, rid):  # every KV cache group
                for idx in range(first, min(len(ids), (end - 1) // bs + 1)):
                    block, g = ids[idx], gen(ids[idx])
                    before = writer.get(block)
                    if before is not None and before[0] == g and before[1] != tenant:
                        self.crossings.append(
                            f"step {self.steps}: {who} (tenant {tenant}) writes block {block}, "
                            f"written by {before[2]} of tenant {before[1]}"
                        )
                    writer[block] = (g, tenant, who)
                    self.pages_written += 1
                reads.append((rid, tenant, who, ids[:first]))
        for rid, tenant, who, blocks in reads:
            for block in blocks:
                g = gen(block)
                key = (rid, block, g)
                if block == null or key in self._judged:
                    continue
                self._judged.add(key)
                by = writer.get(block)
                if by is not None and by[0] == g and by[2] == who:
                    continue  # its own earlier write
                self.pages_read += 1
                if by is None or by[0] != g:
                    self.unattributed.append(
                        f"step {self.steps}: {who} (tenant {tenant}) reads block {block} "
                        "that no request of this run wrote"
                    )
                elif by[1] != tenant:
                    self.crossings.append(
                        f"step {self.steps}: {who} (tenant {tenant}) reads block {block}, "
                        f"written by {by[2]} of tenant {by[1]}"
                    )
                elif by[2] != who:
                    self.shared_within_tenant += 1


def check_run(facade: RetireEngine, checker: Checker | None = None) -> RunVerdict:
    """The verdict on a whole run of ``facade`` (references on its own engine unless a checker
    with a reference engine is given).  Call it before ``facade.close()``."""
    return (checker or Checker(None)).verify_run(facade)
