"""Rule 2 on real vLLM: certified KV handoff, its failure modes, and cache pressure.

One engine for the module (320 blocks of 32 tokens) plus a reference engine that shares nothing
with it.  Inheritance runs many seeds x common-prefix lengths at once; the fault tests corrupt a
certified page's bytes, or let vLLM recycle one, between certification and adoption (the
successor's admission is held meanwhile); the pressure test runs co-tenant traffic between the
revision and the successor's admission, natively and under Retire.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest

from retire_core import COLD_CONTRACT, DEFAULT_CONTRACT, ScopeState
from retire_vllm import faults, identity, observe
from retire_vllm import introspect as ix
from retire_vllm.checker import Checker
from retire_vllm.engine_config import greedy
from tests.vllm.support import attached, flood, module_engine, tokens

pytestmark = pytest.mark.vllm

BS = 32
NUM_BLOCKS = 320


@pytest.fixture(scope="module")
def engine() -> Iterator[Any]:
    yield from module_engine(num_blocks=NUM_BLOCKS)


# --- inheritance --------------------------------------------------------------------------------

PRED_LEN = 150  # 4 adoptable blocks ((150 - 1) // 32)
# (common prefix length, successor length): block boundaries, mid-block cuts, the whole
# predecessor prompt, and a successor of exactly 4 blocks (last-token rule: only 3 adoptable).
CASES = [(0, 30), (20, 50), (32, 62), (64, 94), (100, 130), (128, 128), (150, 160)]
SEEDS = [0, 1, 2]
REVISE_AFTER = {0: 2, 1: 9, 2: 40}  # predecessor tokens generated before the revision


def test_inheritance_matches_clean_reference(engine: Any, checker: Checker) -> None:
    plans = []
    for seed in SEEDS:
        rng = random.Random(seed)
        pred = tokens(rng, PRED_LEN)
        for lcp, n in CASES:
            succ = pred[:lcp] + tokens(rng, n - lcp)
            if lcp < len(pred) and n > lcp:
                succ[lcp] = (pred[lcp] % 2047) + 1  # make sure the prefixes really diverge here
            plans.append((f"s{seed}-l{lcp}-n{n}", seed, pred, succ))
    with attached(engine) as facade:
        for scope, _, pred, _ in plans:
            facade.submit(scope, pred, DEFAULT_CONTRACT, 48)
        revised: set[str] = set()
        for _ in range(200):
            for scope, seed, _, succ in plans:
                rec = facade.version_record(scope, 0)
                if scope not in revised and len(rec.output_token_ids) >= REVISE_AFTER[seed]:
                    facade.supersede(scope, succ, DEFAULT_CONTRACT, 12)
                    revised.add(scope)
            if len(revised) == len(plans) and not facade.has_unfinished():
                break
            facade.step()
        checker.references([(succ, 12) for *_, succ in plans])
        rows = []
        for scope, _, pred, succ in plans:
            verdict = checker.verify(facade, scope)
            rec = facade.version_record(scope)
            expected = identity.expected_adopted_blocks(pred, succ, BS)
            rows.append((scope, verdict.adopted_blocks, expected, rec.num_cached_tokens))
            assert verdict.ok, (scope, verdict.problems)
            assert verdict.adopted_blocks == expected == verdict.expected_adopted_blocks, scope
            assert rec.num_cached_tokens == expected * BS, scope
            assert rec.cold == (expected == 0), scope
            if expected:
                assert verdict.kv_matches_reference, scope
    print("\n[inheritance] scope, adopted blocks, expected, vLLM cached tokens:")
    for row in rows:
        print("   ", row)
    assert {r[1] for r in rows} == {0, 1, 2, 3, 4}  # every prefix length class was exercised


def test_cold_contract_starts_under_an_independent_salt(engine: Any, checker: Checker) -> None:
    rng = random.Random(11)
    pred = tokens(rng, 140)
    with attached(engine) as facade:
        facade.submit("cold", pred, DEFAULT_CONTRACT, 8)
        facade.step()
        facade.supersede("cold", pred[:130] + tokens(rng, 10), COLD_CONTRACT, 8)
        assert facade.retire.pinned_pages() == ()  # nothing is pinned for a cold successor
        facade.run_until_idle()
        v0, v1 = facade.records["cold"].versions
        assert v1.cold and v1.adopted_blocks == 0 and v1.num_cached_tokens == 0
        assert v1.salt != v0.salt
        assert checker.verify(facade, "cold").ok


def test_chain_of_revisions_collapses_without_leaks(engine: Any, checker: Checker) -> None:
    rng = random.Random(12)
    v0 = tokens(rng, 170)
    v1 = v0[:150] + tokens(rng, 20)
    v2 = v0[:100] + tokens(rng, 30)
    with attached(engine) as facade:
        facade.submit("chain", v0, DEFAULT_CONTRACT, 8)
        facade.step()
        facade.hold_admission("chain")
        facade.supersede("chain", v1, DEFAULT_CONTRACT, 8)
        pinned_for_v1 = facade.pinned_blocks()
        assert len(pinned_for_v1) == 4
        facade.supersede("chain", v2, DEFAULT_CONTRACT, 8)  # before v1 was ever admitted
        assert len(facade.pinned_blocks()) == 3
        facade.release_admission("chain")
        facade.run_until_idle()
        log = facade.records["chain"]
        assert not log.version(1).admitted and log.version(1).request_id is None
        released = sorted(log.version(1).released)
        assert released == [(p, "superseded_before_adoption") for p in pinned_for_v1]
        verdict = checker.verify(facade, "chain")
        assert verdict.ok and verdict.adopted_blocks == 3, verdict.problems


def test_the_next_turn_inherits_the_previous_turns_output(engine: Any, checker: Checker) -> None:
    """A conversation's next turn revises the finished previous version with its prompt, its
    output and a new message. The previous version named the blocks past its context when their
    writers closed -- its last prompt block, which the last-token rule keeps out of a context of
    exactly 4 full blocks, and the blocks its decode wrote -- so the revision adopts every full
    block whose KV it wrote, and its tokens equal the clean reference's. The KV a decode wrote
    differs from the KV a prefill writes for the same tokens by float rounding (about 3e-6 on
    the tiny model's second layer), so the checker compares the adopted decode-written blocks
    with a clean run of the previous version, where a decode wrote them too: equal."""
    rng = random.Random(31)
    first = tokens(rng, 4 * BS)
    with attached(engine) as facade:
        facade.submit("turns", first, DEFAULT_CONTRACT, 2 * BS + 8)
        facade.run_until_idle()
        history = [*first, *facade.version_record("turns", 0).output_token_ids]
        written = (len(history) - 1) // BS  # the last sampled token's KV is never written: 6
        succ = [*history, *tokens(rng, 5)]
        assert (
            written
            == 6
            == identity.expected_adopted_blocks(
                identity.written_tokens(first, history[len(first) :]), succ, BS
            )
        )
        assert identity.expected_adopted_blocks(first, succ, BS) == 4  # the prompt's blocks
        facade.supersede("turns", succ, DEFAULT_CONTRACT, 8)
        facade.run_until_idle()
        checker.references([(succ, 8)])
        verdict = checker.verify(facade, "turns")
        rec = facade.version_record("turns")
        assert rec.adopted_blocks == written and rec.num_cached_tokens == written * BS
        assert verdict.ok and verdict.complete, verdict.problems
        assert verdict.kv_matches_reference and verdict.expected_adopted_blocks == written
        # what the checker now avoids: a clean prefill's bytes of the decode-written blocks
        # (positions 4 and 5) differ from the adopted ones
        prefill = checker.reference(succ, 8).block_digests
        pages = dict(zip(range(written), rec.adopted_pages, strict=True))
        now = observe.read_digests(facade.executor, list(pages.values()))
        assert [pos for pos in range(written) if now[pages[pos]] != prefill[(0, pos)]] == [4, 5]


# --- page faults --------------------------------------------------------------------------------


def _held_revision(facade: Any, rng: random.Random, scope: str) -> tuple[list[int], list[int]]:
    """A scope whose successor is certified (5 blocks) and held before admission."""
    pred = tokens(rng, 170)
    succ = pred[:165] + tokens(rng, 15)
    facade.submit(scope, pred, DEFAULT_CONTRACT, 6)
    facade.step()
    facade.step()
    facade.hold_admission(scope)
    facade.supersede(scope, succ, DEFAULT_CONTRACT, 16)
    assert len(facade.version_record(scope).certificate) == 5
    return pred, succ


def test_corrupted_certified_page_is_caught_and_recomputed(engine: Any, checker: Checker) -> None:
    with attached(engine) as facade:
        _held_revision(facade, random.Random(21), "fault")
        cert = facade.version_record("fault").certificate
        victim = cert[2][0]
        faults.corrupt_page(facade, victim, layer=1)  # same block id, same counts, other bytes
        facade.release_admission("fault")
        facade.run_until_idle()
        rec = facade.version_record("fault")
        assert rec.adopted_blocks == 2 and rec.num_cached_tokens == 64
        assert rec.released == [(e[0], "digest_mismatch") for e in cert[2:]]
        assert rec.hit_block_ids == (tuple(e[0] for e in cert[:2]),)  # (one KV cache group)
        verdict = checker.verify(facade, "fault")
        assert verdict.ok, verdict.problems
        print(
            f"\n[page fault] corrupted certified block {victim} (position 2): adopted "
            f"{rec.adopted_blocks} blocks, released {len(rec.released)} with digest_mismatch, "
            f"successor equals the clean reference: {verdict.tokens_match}"
        )


def test_mutant_without_digest_check_is_caught_by_the_checker(
    engine: Any, checker: Checker, monkeypatch: pytest.MonkeyPatch
) -> None:
    with attached(engine) as facade:
        _held_revision(facade, random.Random(21), "mutant")
        cert = facade.version_record("mutant").certificate
        certified = {page: digest for page, _, _, digest, _ in cert}
        # Mutant: the byte check reports what was certified instead of reading the bytes.
        monkeypatch.setattr(
            facade, "digest_for_adoption", lambda pages: {p: certified[p] for p in pages}
        )
        faults.corrupt_page(facade, cert[2][0], layer=1)
        facade.release_admission("mutant")
        facade.run_until_idle()
        rec = facade.version_record("mutant")
        assert rec.adopted_blocks == 5  # the corrupted page was adopted
        verdict = checker.verify(facade, "mutant")
        print(
            f"\n[fault mutant] tokens match reference: {verdict.tokens_match} "
            f"(first divergence {verdict.first_divergence}); problems: {verdict.problems}"
        )
        assert not verdict.ok
        assert any("content changed" in p for p in verdict.page_problems)
        assert verdict.kv_matches_reference is False


def test_recycled_page_is_caught_by_generation(engine: Any, checker: Checker) -> None:
    """A certified page whose references are lost gets recycled by vLLM under co-tenant traffic;
    the generation check refuses it and everything from there on is recomputed."""
    rng = random.Random(22)
    with attached(engine) as facade:
        _held_revision(facade, rng, "recycle")
        cert = facade.version_record("recycle").certificate
        victim = cert[1][0]
        assert faults.drop_references(facade, victim) == 2  # pin + retention, behind the core
        flood(facade, rng)
        assert facade.stats.pages_reused == 1
        assert facade.retire.state.pages[victim].generation == cert[1][2] + 1
        facade.release_admission("recycle")
        facade.run_until_idle()
        rec = facade.version_record("recycle")
        assert rec.adopted_blocks == 1 and rec.num_cached_tokens == 32
        assert rec.released[0] == (victim, "generation_changed")
        assert checker.verify(facade, "recycle").ok


# --- cache pressure -----------------------------------------------------------------------------


def test_cache_pressure_native_loses_prefix_retire_keeps_it(engine: Any, checker: Checker) -> None:
    rng = random.Random(31)
    pred = tokens(rng, 330)  # 10 adoptable blocks
    succ = pred[:320] + tokens(rng, 24)
    expected = identity.expected_adopted_blocks(pred, succ, BS)
    assert expected == 10

    # Native: abort, other traffic, resubmit under the same salt (opportunistic reuse).
    native_cached = _native_pressure_run(engine, rng, pred, succ)

    with attached(engine) as facade:
        facade.submit("press", pred, DEFAULT_CONTRACT, 8)
        for _ in range(3):
            facade.step()
        facade.hold_admission("press")  # the successor waits behind the co-tenants
        facade.supersede("press", succ, DEFAULT_CONTRACT, 8)
        evicted_before = facade.spy.evictions
        flood(facade, rng)
        evictions = facade.spy.evictions - evicted_before
        facade.release_admission("press")
        facade.run_until_idle()
        rec = facade.version_record("press")
        verdict = checker.verify(facade, "press")
    print(
        f"\n[cache pressure] common prefix {len(pred[:320])} tokens = {expected} blocks; "
        f"native successor reused {native_cached} tokens, Retire adopted "
        f"{rec.adopted_blocks} blocks ({rec.num_cached_tokens} tokens); the co-tenants evicted "
        f"{evictions} cached blocks"
    )
    assert verdict.ok, verdict.problems
    assert rec.adopted_blocks == expected and rec.num_cached_tokens == expected * BS
    assert evictions > 0
    assert native_cached < expected * BS


def _native_pressure_run(engine: Any, rng: random.Random, pred: list[int], succ: list[int]) -> int:
    sched = ix.scheduler(engine)
    assert sched.retire_hooks is None
    salt = "native:press"
    rid = engine.add_request(
        "native-press@0", {"prompt_token_ids": pred, "cache_salt": salt}, greedy(8)
    )
    for _ in range(3):
        engine.step()
    engine.abort_request([rid], internal=True)
    free = ix.block_pool(engine).get_num_free_blocks()
    for i in range(free // 100 + 1):
        engine.add_request(
            f"native-cotenant-{i}", {"prompt_token_ids": tokens(rng, 100 * BS - 40)}, greedy(2)
        )
    while engine.has_unfinished_requests():
        engine.step()
    engine.add_request("native-press@1", {"prompt_token_ids": succ, "cache_salt": salt}, greedy(8))
    cached = None
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.request_id == "native-press@1" and out.num_cached_tokens is not None:
                cached = int(out.num_cached_tokens) if cached is None else cached
    assert cached is not None
    return cached


# --- a version that ran to its end ---------------------------------------------------------------


def _finished(facade: Any, rng: random.Random, scope: str) -> tuple[list[int], list[int]]:
    """A scope whose version ran to its end and was read to its last chunk (5 complete prompt
    blocks), and a revision of it keeping 165 of its 170 prompt tokens."""
    pred = tokens(rng, 170)
    facade.submit(scope, pred, DEFAULT_CONTRACT, 6)
    facade.run_until_idle()
    assert facade.retire.scope(scope).state is ScopeState.ACTIVE  # until the consumer reads
    assert facade.consume(scope)[-1].finished
    return pred, pred[:165] + tokens(rng, 15)


def _revised(facade: Any, checker: Checker, scope: str, succ: list[int]) -> Any:
    """Revise ``scope`` to ``succ`` and run it to its end; its output and pages must pass the
    checker against a clean run. Returns the successor's record."""
    facade.supersede(scope, succ, DEFAULT_CONTRACT, 8)
    facade.run_until_idle()
    checker.references([(succ, 8)])
    verdict = checker.verify(facade, scope)
    assert verdict.ok and verdict.complete, verdict.problems
    return facade.version_record(scope)


def test_a_finished_version_goes_back_to_the_prefix_cache_and_is_still_inherited(
    engine: Any, checker: Checker
) -> None:
    """The facade reports a version's end (``VersionFinished``) once its consumer has read the
    last chunk, as ``retire serve`` does once the last output leaves the engine: its completed
    blocks go back to vLLM's prefix cache (no reference of Retire's left, evictable),
    still tracked, and a revision that finds them cached inherits them."""
    with attached(engine) as facade:
        pred, succ = _finished(facade, random.Random(41), "done")
        assert facade.retire.scope("done").state is ScopeState.FINISHED
        tracked = facade.retire.state.pages
        assert len(tracked) == 5 and not any(page.held for page in tracked.values())
        assert not facade.pages  # no retention reference left
        assert facade.pool.get_num_free_blocks() == facade.initial_free_blocks
        rec = _revised(facade, checker, "done", succ)
        assert rec.adopted_blocks == identity.expected_adopted_blocks(pred, succ, BS) == 5
        assert rec.num_cached_tokens == 5 * BS


def test_an_evicted_block_of_a_finished_version_is_reported_and_recomputed(
    engine: Any, checker: Checker
) -> None:
    """Co-tenants evict the finished version's cached blocks: each eviction reaches the core
    (``PageEvicted``) before the block's new owner writes it, the core stops tracking it, and a
    revision inherits only what is still cached."""
    rng = random.Random(42)
    with attached(engine) as facade:
        _, succ = _finished(facade, rng, "gone")
        cached = set(facade.retire.state.pages)
        flood(facade, rng)
        left = set(facade.retire.state.pages)
        assert facade.stats.cached_pages_evicted == len(cached - left) > 0
        assert left <= cached
        rec = _revised(facade, checker, "gone", succ)
        assert set(rec.adopted_pages) <= left and rec.adopted_blocks < 5
