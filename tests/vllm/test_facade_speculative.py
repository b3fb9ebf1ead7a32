"""Revisions inside active speculative decoding, on real vLLM.

vLLM writes the KV of draft tokens in the step that verifies them; rejected drafts' slots are
rewritten by a later step. Two draft models keep drafts in flight deterministically: a tiny model
with other weights (almost every draft is rejected, so drafts often cross a block boundary and are
rolled back) and the target itself (every draft is accepted, so blocks are completed by verified
drafts). Each scope is revised at one of three moments: between steps, inside a step after its
drafts were proposed and before the model runs, and after the model verified them but before the
commit. Every successor must equal a cold run of its prompt, adopt exactly the common prefix's
blocks with the clean reference's bytes, and the core's log (validated against the spec at close)
must show the draft window really happened: blocks completed only tentatively, drafts rolled
back by rejection and by a writer closing over them, and (accepting) blocks completed by
verified drafts.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from retire_core import DEFAULT_CONTRACT
from retire_vllm import identity
from retire_vllm.checker import Checker
from tests.vllm.support import attached, build, shutdown, speculative_config, tokens

pytestmark = pytest.mark.vllm

BS = 32
NUM_BLOCKS = 256
DRAFT_MODEL_SEED = {"rejecting": 1, "accepting": 0}  # seed 0 is the target itself
MOMENTS = ("between_steps", "drafts_proposed", "drafts_verified")
PRED_LEN, PRED_MAX, SUCC_MAX = 150, 60, 24
# (common prefix with the predecessor's prompt, successor length, predecessor tokens before the
# revision): block boundaries, a mid-block cut, the whole prompt.
CASES = [(64, 90, 5), (100, 130, 17), (150, 160, 30)]


@pytest.fixture(scope="module", params=sorted(DRAFT_MODEL_SEED))
def engines(request: pytest.FixtureRequest) -> Iterator[tuple[str, Any, Checker]]:
    """The engine under test and its clean reference, both with the same draft model: its
    layers share the target's KV blocks, so the reference's bytes must include them too."""
    from retire_vllm.engine_config import build_engine

    mode = request.param
    spec = speculative_config(DRAFT_MODEL_SEED[mode])
    ref = build_engine(num_blocks=NUM_BLOCKS, speculative_config=spec)
    eng = build(num_blocks=NUM_BLOCKS, speculative_config=spec)
    yield mode, eng, Checker(ref)
    shutdown(eng)
    shutdown(ref)


def _plans(seed: int) -> list[tuple[str, str, list[int], list[int], int]]:
    rng = random.Random(seed)
    plans = []
    for moment in MOMENTS:
        for lcp, n, after in CASES:
            pred = tokens(rng, PRED_LEN)
            succ = pred[:lcp] + tokens(rng, n - lcp)
            if lcp < len(pred):
                succ[lcp] = (pred[lcp] % 2047) + 1  # the prompts really diverge here
            plans.append((f"{moment}-l{lcp}", moment, pred, succ, after))
    return plans


def _run(facade: Any, plans: list[tuple[str, str, list[int], list[int], int]]) -> None:
    at_commit: list[tuple[str, list[int]]] = []
    before_commit = facade.before_commit

    def revise_then_commit(scheduler: Any, scheduler_output: Any) -> set[str]:
        while at_commit:  # the model has run and verified the drafts; nothing is committed yet
            scope, succ = at_commit.pop()
            facade.supersede(scope, succ, DEFAULT_CONTRACT, SUCC_MAX)
        return before_commit(scheduler, scheduler_output)  # type: ignore[no-any-return]

    facade.before_commit = revise_then_commit
    for scope, _, pred, _, _ in plans:
        facade.submit(scope, pred, DEFAULT_CONTRACT, PRED_MAX)
    revised: set[str] = set()
    for _ in range(400):
        for scope, moment, _, succ, after in plans:
            if scope in revised or len(facade.version_record(scope, 0).output_token_ids) < after:
                continue
            revised.add(scope)
            if moment == "between_steps":
                facade.supersede(scope, succ, DEFAULT_CONTRACT, SUCC_MAX)
            elif moment == "drafts_proposed":
                facade.during_next_step(
                    lambda f, s=scope, c=succ: f.supersede(s, c, DEFAULT_CONTRACT, SUCC_MAX)
                )
            else:
                at_commit.append((scope, succ))
        if len(revised) == len(plans) and not facade.has_unfinished() and not at_commit:
            break
        facade.step()
    assert revised == {p[0] for p in plans}


def _log(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_revisions_inside_speculative_decoding(
    engines: tuple[str, Any, Checker], tmp_path: Path
) -> None:
    mode, engine, checker = engines
    plans = _plans(seed=len(mode))
    log_path = tmp_path / "core.jsonl"
    with attached(engine, log_path=log_path) as facade:  # close validates the log (the spec)
        _run(facade, plans)
        checker.references([(succ, SUCC_MAX) for *_, succ, _ in plans])
        for scope, _, pred, succ, _ in plans:
            verdict = checker.verify(facade, scope)
            assert verdict.ok, (mode, scope, verdict.problems)
            expected = identity.expected_adopted_blocks(pred, succ, BS)
            assert verdict.adopted_blocks == expected == verdict.expected_adopted_blocks, scope

    log = _log(log_path)
    tentative = {
        line["page"]
        for line in log
        if line["transition"] == "write_draft" and line["completes"] is True
    }
    verified = [line for line in log if line["transition"] == "verify_drafts"]
    rolled_back_by_close = [
        line
        for line in log
        if line["transition"] == "close_writer" and line["changed"].get("draft") is False
    ]
    assert tentative, "no draft write ever completed a block tentatively"
    assert rolled_back_by_close, "no writer closed over unverified drafts"
    if mode == "rejecting":
        assert any(v["page"] in tentative and v["completes"] is False for v in verified)
    else:
        completed = {v["page"] for v in verified if v["completes"] is True}
        closed_full = {
            line["page"]
            for line in log
            if line["transition"] == "close_writer" and line["full"] is True
        }
        assert completed & closed_full, "no block was completed by verified drafts"
