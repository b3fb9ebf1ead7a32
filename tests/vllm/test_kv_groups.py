"""Heterogeneous KV cache groups on real vLLM (issue 17, item 2).

The ``hybrid`` default model (a tiny Llama: one sliding-window layer of 64 tokens, one
full-attention layer) makes vLLM build two KV cache groups: group 0 sliding window (with blocks of
32 tokens it reads ``ceil(63 / 32) = 2`` blocks before a cut), group 1 full attention. A revision
adopts a cut of ``k`` blocks: every block before it in the full-attention group, the last two in
the sliding-window group (vLLM's prefix hit puts its null block before them). Each case is
checked against a clean reference run on a second hybrid engine: output, the pages' certified
slots and bytes in every group, vLLM's prefix hit in every group, receipts; the core's log is
validated against the spec when the facade closes. Engines with a group Retire cannot certify
are refused before attaching.
"""

from __future__ import annotations

import json
import random
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from retire_core import DEFAULT_CONTRACT, ContractError
from retire_core.handoff import required_slots
from retire_vllm import identity
from retire_vllm import introspect as ix
from retire_vllm.checker import Checker
from retire_vllm.default_model import ensure_default_model
from retire_vllm.engine_config import engine_contract
from retire_vllm.errors import IntegrationError
from retire_vllm.observe import kv_windows
from tests.vllm.support import attached, module_engine, shutdown, tokens

pytestmark = pytest.mark.vllm

BS = 32
WINDOWS = (2, 0)  # group 0: a 64-token sliding window, 2 blocks; group 1: full attention
PRED_LEN = 300  # 9 adoptable blocks
# (common prefix, successor length): nothing shared, less than the window, exactly the window,
# a cut well past the window, the whole predecessor prompt
CASES = [(0, 40), (40, 80), (64, 100), (200, 240), (300, 310)]


def _hybrid() -> str:
    return str(ensure_default_model(size="hybrid"))


@pytest.fixture(scope="module")
def engine() -> Iterator[Any]:
    yield from module_engine(num_blocks=512, model=_hybrid(), max_model_len=2048)


@pytest.fixture(scope="module")
def hybrid_checker() -> Iterator[Checker]:
    from retire_vllm.engine_config import build_engine

    ref = build_engine(num_blocks=256, model=_hybrid(), max_model_len=2048)
    yield Checker(ref)
    shutdown(ref)


def _plans() -> list[tuple[str, list[int], list[int]]]:
    rng = random.Random(17)
    plans = []
    for lcp, n in CASES:
        pred = tokens(rng, PRED_LEN)
        succ = pred[:lcp] + tokens(rng, n - lcp)
        if lcp < len(pred):
            succ[lcp] = (pred[lcp] % 2047) + 1  # the prefixes really diverge here
        plans.append((f"h-l{lcp}", pred, succ))
    return plans


def _run_revisions(facade: Any, plans: list[tuple[str, list[int], list[int]]]) -> None:
    for scope, pred, _ in plans:
        facade.submit(scope, pred, DEFAULT_CONTRACT, 40)
    revised: set[str] = set()
    for _ in range(300):
        for scope, _, succ in plans:
            if scope not in revised and len(facade.version_record(scope, 0).output_token_ids) >= 6:
                facade.supersede(scope, succ, DEFAULT_CONTRACT, 12)
                revised.add(scope)
        if len(revised) == len(plans) and not facade.has_unfinished():
            return
        facade.step()
    raise AssertionError("the revisions did not finish")


def test_the_engine_has_two_kv_cache_groups_and_their_windows(engine: Any) -> None:
    kvm = ix.kv_cache_manager(engine)
    kinds = [type(g.kv_cache_spec).__name__ for g in kvm.kv_cache_config.kv_cache_groups]
    assert kinds == ["SlidingWindowSpec", "FullAttentionSpec"]
    assert kv_windows(kvm, BS) == WINDOWS


def test_revisions_adopt_each_groups_required_pages(
    engine: Any, hybrid_checker: Checker, tmp_path: Path
) -> None:
    plans = _plans()
    with attached(engine, log_path=tmp_path / "core.jsonl") as facade:  # close validates the log
        _run_revisions(facade, plans)
        hybrid_checker.references([(succ, 12) for *_, succ in plans])
        null = ix.null_block_id(facade.kvm)
        for scope, pred, succ in plans:
            verdict = hybrid_checker.verify(facade, scope)
            rec = facade.version_record(scope)
            cut = identity.expected_adopted_blocks(pred, succ, BS)
            assert verdict.ok, (scope, verdict.problems)
            assert rec.contract.kv_windows == WINDOWS
            assert verdict.adopted_blocks == cut == verdict.expected_adopted_blocks, scope
            assert rec.num_cached_tokens == cut * BS, scope
            slots = {(e[4], e[1]) for e in rec.certificate if e[0] in rec.adopted_pages}
            assert slots == set(required_slots(WINDOWS, cut)), scope
            # vLLM's own hit: the null block before the sliding window, every block in full
            sliding, full = rec.hit_block_ids
            assert list(sliding[: max(0, cut - 2)]) == [null] * max(0, cut - 2), scope
            assert null not in sliding[max(0, cut - 2) :] and null not in full, scope
            if cut:
                assert verdict.kv_matches_reference is True, scope  # both groups' bytes compared
        assert len(facade.retire.state.pages) > 0  # the last versions' pages, until close


def test_the_blocks_a_sliding_window_passed_go_back_to_vllm(
    engine: Any, hybrid_checker: Checker, tmp_path: Path
) -> None:
    """A long generation of the hybrid model under Retire: each block of the sliding-window
    group that the window passed is reported (``PageUnreferenced``) and given back to vLLM's
    pool (cached, not retained), as stock vLLM frees it, so the group holds about its window,
    not the whole context; the output still equals the clean reference and the core's log
    validates (at close). Before, every passed block stayed retained until the version ended."""
    prompt = tokens(random.Random(23), 300)
    with attached(engine, log_path=tmp_path / "core.jsonl") as facade:
        facade.submit("w", prompt, DEFAULT_CONTRACT, 150)
        retained: list[int] = []
        while facade.has_unfinished():
            facade.step()
            refs = facade.pages.values()
            retained.append(sum(1 for r in refs if r.scope == "w" and r.group == 0))
        full = [r for r in facade.pages.values() if r.scope == "w" and r.group == 1]
        hybrid_checker.references([(prompt, 150)])
        verdict = hybrid_checker.verify(facade, "w")
        assert verdict.ok, verdict.problems
    lines = [json.loads(line) for line in (tmp_path / "core.jsonl").read_text().splitlines()]
    passed = {d["page"] for d in lines if d.get("transition") == "unreference"}
    blocks = -(-(300 + 150) // BS)  # 15 positions in each group
    assert max(retained[1:]) <= WINDOWS[0] + 1, retained  # the window, and the block it fills
    assert len(passed) >= blocks - WINDOWS[0] - 1, sorted(passed)
    # the full-attention group keeps every block (retained: nothing read the last chunk, so
    # the facade has not reported the version's end)
    assert len(full) == blocks


class TablesAudit:
    """A facade observer: after each step's schedule, every request Retire manages holds vLLM's
    own block list in every group (read by reference, so the next step reads only what vLLM
    appends), and every block in it is one of the request's pages or the pages it adopted."""

    def __init__(self) -> None:
        self.same_list = 0
        self.other_list = 0
        self.problems: list[str] = []

    def before_execute(self, facade: Any, writes: Any) -> None:
        null = ix.null_block_id(facade.kvm)
        managers = facade.kvm.coordinator.single_type_managers
        for rid in {w[0] for w in writes}:  # the requests this step schedules
            req = facade.reqs.get(rid)
            if req is None:
                continue
            adopted = {b for table in req.adopted for b in table}
            for group, manager in enumerate(managers):
                blocks = manager.req_to_blocks.get(rid, [])
                if req.tables.lists[group] is blocks:
                    self.same_list += 1
                else:
                    self.other_list += 1
                if req.tables.seen[group] != len(blocks):
                    self.problems.append(f"{rid} group {group}: read {req.tables.seen[group]}")
                stray = {b.block_id for b in blocks} - {null} - set(req.pages) - adopted
                if stray:
                    self.problems.append(f"{rid} group {group}: blocks {sorted(stray)} unseen")

    def after_step(self, facade: Any) -> None:
        return None


def test_each_step_reads_only_the_blocks_vllm_appended(engine: Any, tmp_path: Path) -> None:
    """Both group kinds of the hybrid engine are append-only managers; the facade holds their
    lists by reference, so each step reads past what it read before (O(new blocks), not
    O(context): results 4.6)."""
    managers = ix.kv_cache_manager(engine).coordinator.single_type_managers
    assert [type(m).__name__ for m in managers] == ["SlidingWindowManager", "FullAttentionManager"]
    assert ix.append_only_groups(ix.kv_cache_manager(engine)) == (True, True)
    audit = TablesAudit()
    with attached(engine, log_path=tmp_path / "core.jsonl") as facade:
        facade.observers.append(audit)
        _run_revisions(facade, _plans())
    assert audit.problems == []
    assert audit.same_list > 100 and audit.other_list == 0


def test_lists_read_whole_each_step_give_the_same_pages(
    engine: Any, hybrid_checker: Checker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fallback path (a list that is not the one read before is read whole, skipping the
    request's known blocks) is the same protocol: forced on every step by handing the facade
    copies, the audit sees no shared list, and the revisions still match the clean reference."""
    real = ix.manager_block_lists
    monkeypatch.setattr(
        ix, "manager_block_lists", lambda kvm, rid: [list(b) for b in real(kvm, rid)]
    )
    plans = [p for p in _plans() if p[0] in ("h-l64", "h-l200")]
    audit = TablesAudit()
    with attached(engine) as facade:
        facade.observers.append(audit)
        _run_revisions(facade, plans)
        hybrid_checker.references([(succ, 12) for *_, succ in plans])
        for scope, *_ in plans:
            verdict = hybrid_checker.verify(facade, scope)
            assert verdict.ok, (scope, verdict.problems)
    assert audit.problems == [] and audit.same_list == 0 and audit.other_list > 0


def test_the_checker_catches_a_page_adopted_in_the_wrong_slot(
    engine: Any, hybrid_checker: Checker
) -> None:
    """The verdict must be able to fail: a certificate that names a sliding-window page's slot
    wrongly, or a handover missing the sliding-window pages, is reported."""
    plans = [p for p in _plans() if p[0] == "h-l200"]
    with attached(engine) as facade:
        _run_revisions(facade, plans)
        (scope, _, succ) = plans[0]
        hybrid_checker.references([(succ, 12)])
        rec = facade.version_record(scope)
        assert hybrid_checker.verify(facade, scope).ok
        original = (rec.certificate, rec.adopted_pages)
        try:
            # a sliding-window page claimed for the full-attention group at the same position
            rec.certificate = tuple(
                (p, pos, gen, digest, 1 if group == 0 else group)
                for p, pos, gen, digest, group in rec.certificate
            )
            problems = hybrid_checker.verify(facade, scope).page_problems
            assert any("do not fill the cut's slots" in p for p in problems), problems
            rec.certificate = original[0]
            sliding = {e[0] for e in rec.certificate if e[4] == 0}
            rec.adopted_pages = tuple(p for p in rec.adopted_pages if p not in sliding)
            problems = hybrid_checker.verify(facade, scope).page_problems
            assert any("pages handed over for" in p for p in problems), problems
        finally:
            rec.certificate, rec.adopted_pages = original


def test_a_contract_naming_other_windows_is_refused(engine: Any) -> None:
    with attached(engine) as facade:
        with pytest.raises(ValueError, match="KV cache groups have windows"):
            facade.submit("w", [1, 2, 3], attrs.evolve(DEFAULT_CONTRACT, kv_windows=(0, 0)), 4)
        assert "w" not in facade.records and not facade.retire.state.scopes


@pytest.mark.parametrize(
    "change, message",
    [
        ({"kv_windows": (0, 0)}, "KV cache groups have windows"),
        ({"kv_windows": (3,)}, "KV cache groups have windows"),
        ({"numerical_mode": "bf16-greedy"}, "runs 'fp32-greedy'"),
        ({"equivalence": "semantic"}, "only exact output equivalence"),
    ],
)
def test_engine_contract_refuses_what_the_engine_cannot_honour(
    change: dict[str, Any], message: str
) -> None:
    """The one contract check the facade and the serving engine side share."""
    with pytest.raises(ContractError, match=message):
        engine_contract(attrs.evolve(DEFAULT_CONTRACT, **change), (0, 2))


def test_engine_contract_carries_the_engines_windows() -> None:
    assert engine_contract(DEFAULT_CONTRACT, (0, 2)).kv_windows == (0, 2)
    assert engine_contract(attrs.evolve(DEFAULT_CONTRACT, kv_windows=(0, 2)), (0, 2)) == (
        attrs.evolve(DEFAULT_CONTRACT, kv_windows=(0, 2))
    )
    assert engine_contract(DEFAULT_CONTRACT, (0,)) == DEFAULT_CONTRACT


def _config_of(*specs: Any, retention: int | None = None) -> Any:
    groups = [types.SimpleNamespace(kv_cache_spec=s) for s in specs]
    config = types.SimpleNamespace(
        kv_cache_groups=groups, prefix_cache_retention_interval=retention
    )
    return types.SimpleNamespace(kv_cache_config=config)


def test_groups_retire_cannot_certify_are_refused() -> None:
    """vLLM's own spec objects: a Mamba state group, a window that retains tokens past its edge
    and a group of another block size have no rule for which blocks a successor reads; a sliding
    window whose prefix-cache entries vLLM keeps sparsely (its default) cannot be hit at every
    cut."""
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec, SlidingWindowSpec

    attention = {"num_kv_heads": 1, "head_size": 8, "dtype": torch.float32}
    full = FullAttentionSpec(block_size=BS, **attention)
    window = SlidingWindowSpec(block_size=BS, sliding_window=100, **attention)
    assert kv_windows(_config_of(window, full), BS) == (4, 0)  # ceil(99 / 32)
    mamba = MambaSpec(block_size=BS, shapes=((1,),), dtypes=(torch.float32,))
    refused = {
        "MambaSpec": _config_of(full, mamba),
        "past its sliding window": _config_of(
            SlidingWindowSpec(
                block_size=BS, sliding_window=64, extra_retained_tokens=3, **attention
            )
        ),
        "blocks of 16 tokens": _config_of(FullAttentionSpec(block_size=16, **attention)),
        "prefix_cache_retention_interval=None": _config_of(window, full, retention=0),
    }
    for message, config in refused.items():
        with pytest.raises(IntegrationError, match=message):
            kv_windows(config, BS)


@pytest.fixture(scope="module")
def small_engine() -> Iterator[Any]:
    yield from module_engine(num_blocks=40, model=_hybrid(), max_model_len=512)


def test_preempted_hybrid_scopes_run_again_with_their_passed_blocks_freed(
    small_engine: Any, hybrid_checker: Checker, tmp_path: Path
) -> None:
    """Five scopes of the hybrid model through a 40-block pool (150 prompt tokens and 120 out:
    9 positions each, so 45 full-attention blocks and a few sliding-window ones at the end):
    sliding windows pass blocks back to the cache, vLLM preempts some requests, each preemption
    frees the version's pages with those the cache kept (its next run evicts the prefix hashes of
    the run before), so after every step each page the core keeps in the cache is still a block
    vLLM's prefix cache holds; every scope ends with the text its prompt gives alone, the core log
    validates at close and nothing leaks."""
    rng = random.Random(29)
    prompts = [tokens(rng, 150) for _ in range(5)]
    with attached(small_engine, log_path=tmp_path / "core.jsonl") as facade:
        for i, prompt in enumerate(prompts):
            facade.submit(f"p{i}", prompt, DEFAULT_CONTRACT, 120)
        ended: set[str] = set()
        for _ in range(2_000):
            if not facade.has_unfinished():
                break
            facade.step()
            pool = facade.pool.blocks
            for page, rec in facade.retire.state.pages.items():
                if not rec.held and not rec.pinned:  # in the engine's cache, for the core
                    assert pool[page].block_hash is not None, f"page {page} is not cached"
            for i in range(5):
                if f"p{i}" not in ended and facade.version_record(f"p{i}").finished_at is not None:
                    facade.cancel(f"p{i}")
                    ended.add(f"p{i}")
        assert not facade.has_unfinished(), "stalled"
        assert facade.stats.preemptions > 0 and facade.stats.window_pages_passed > 0
        hybrid_checker.references([(p, 120) for p in prompts])
        for i in range(5):
            verdict = hybrid_checker.verify(facade, f"p{i}", 0)
            assert verdict.ok, (i, verdict.problems)
