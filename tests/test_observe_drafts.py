"""Which draft writes ``observe.verify_drafts`` reports verified after a step's commit.

vLLM's engine core takes the aborts that arrived while the model ran just before it commits the
step (``EngineCore.step``: ``_process_aborts_queue`` before ``update_from_output``). A client that
left then has its request finished -- its writers closed over the drafts, its blocks possibly
freed -- between the step's schedule, which wrote the drafts, and the commit that verifies them.
Reporting those drafts verified named a freed page to the core (``DoubleFreeError``: the engine
core died, a 500 for every client; seen in ``test_serving_speculative``). These tests build the
draft writes and the ledger's references by hand, no engine needed."""

from __future__ import annotations

import types

from retire_core import DraftsVerified
from retire_vllm.observe import DraftWrite, verify_drafts
from retire_vllm.serving.ledger import BlockRef

BLOCK = 4


def _draft(rid: str, block: int, index: int, computed: int) -> DraftWrite:
    return DraftWrite(rid, types.SimpleNamespace(num_computed_tokens=computed), block, index)


def _ref(block: int, rid: str, *, writer_open: bool = True) -> BlockRef:
    ref = BlockRef(block, "s", 1, rid, 0, "salt", 1)
    ref.writer_open = writer_open
    return ref


def test_open_writers_are_verified_and_a_filled_block_completes() -> None:
    drafts = [_draft("a", 7, 1, 8), _draft("b", 9, 0, 2)]
    refs = {7: _ref(7, "a"), 9: _ref(9, "b")}
    events, completed = verify_drafts(drafts, set(), BLOCK, refs)
    assert events == [DraftsVerified(7, True), DraftsVerified(9, False)]
    assert completed == [7]


def test_a_request_finished_during_the_step_verifies_nothing() -> None:
    """Its writer closed (the abort's close rolled the drafts back), or its block was freed, or
    another request's reference holds the block now: no verification is reported for it."""
    drafts = [_draft("gone", 7, 1, 8), _draft("gone", 8, 2, 8), _draft("gone", 9, 0, 8)]
    refs = {7: _ref(7, "gone", writer_open=False), 9: _ref(9, "other")}
    assert verify_drafts(drafts, set(), BLOCK, refs) == ([], [])


def test_a_refused_commit_verifies_nothing() -> None:
    refs = {7: _ref(7, "a")}
    assert verify_drafts([_draft("a", 7, 1, 8)], {"a"}, BLOCK, refs) == ([], [])
