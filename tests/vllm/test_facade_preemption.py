"""The in-process facade under a KV pool too small for its scopes at once: vLLM preempts some of
their requests (``Scheduler._preempt_request``), the facade frees each preempted version's pages
through the core (``VersionPreempted``) inside the schedule and manages the request again under
new participants, and every scope still ends with the text its prompt gives alone. Without the
hook the facade stalls: the preempted version's pages keep their retention reference, so the
allocation that preempted it finds nothing free."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest

from retire_vllm.checker import Checker
from tests.vllm.support import attached, module_engine, tokens

pytestmark = pytest.mark.vllm

SCOPES = 5
PROMPT = 150  # tokens: 4 full blocks of 32 each
OUTPUT = 120  # tokens: 9 blocks each at the end, 45 for the five against 31 usable
POOL = 32


@pytest.fixture(scope="module")
def engine() -> Iterator[Any]:
    yield from module_engine(num_blocks=POOL)


def _run(facade: Any, prompts: list[list[int]], max_steps: int) -> int:
    """Every scope's version 0 to its end; a finished scope is cancelled at once (the facade keeps
    a finished version's pages for a revision until then, as the benchmarks do)."""
    for i, prompt in enumerate(prompts):
        facade.submit(f"s{i}", prompt, max_tokens=OUTPUT)
    ended: set[str] = set()
    for n in range(max_steps):
        if not facade.has_unfinished():
            return n
        facade.step()
        for i in range(len(prompts)):
            scope = f"s{i}"
            if scope not in ended and facade.version_record(scope).finished_at is not None:
                facade.cancel(scope)
                ended.add(scope)
    raise TimeoutError(f"stalled: still busy after {max_steps} steps")


def test_preempted_scopes_run_again_and_finish_with_the_greedy_text(
    engine: Any, checker: Checker
) -> None:
    rng = random.Random(11)
    prompts = [tokens(rng, PROMPT) for _ in range(SCOPES)]
    with attached(engine) as facade:  # closing it validates the core log and checks for leaks
        _run(facade, prompts, max_steps=2_000)
        assert facade.stats.preemptions > 0, "the pool never ran out"
        again = [i for i in range(SCOPES) if "#" in facade.version_record(f"s{i}").participants[0]]
        assert again, "no version ran again under new participants"
        for i in range(SCOPES):
            rec = facade.version_record(f"s{i}")
            assert len(rec.output_token_ids) == OUTPUT, f"s{i}"
            assert rec.closed, f"s{i}: a participant's receipt is missing"
        verdict = checker.verify_run(facade)  # each scope's tokens = its prompt run alone
        assert verdict.ok, verdict.problems


def test_without_the_preemption_hook_the_facade_stalls(
    engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The test above can fail: with the hook doing nothing, a preempted version's pages keep
    their retention reference and the allocation that preempted it finds no block."""
    from retire_vllm.facade import RetireEngine

    monkeypatch.setattr(RetireEngine, "on_preempted", lambda self, request: None)
    rng = random.Random(11)
    prompts = [tokens(rng, PROMPT) for _ in range(SCOPES)]
    facade = RetireEngine(engine=engine)
    try:
        with pytest.raises(TimeoutError, match="stalled"):
            _run(facade, prompts, max_steps=400)
    finally:
        for i in range(SCOPES):
            facade.cancel(f"s{i}")
        facade.run_until_idle(max_steps=400)
        facade.close()


def test_a_preempted_version_superseded_before_it_runs_again(engine: Any, checker: Checker) -> None:
    """A revision of a scope whose request vLLM preempted, taken before the request runs again:
    the restarted participants are fenced, and the successor, which inherits nothing (the
    preemption freed every page of version 0 and its request had not run again), gives the
    tokens its prompt gives alone."""
    rng = random.Random(12)
    prompts = [tokens(rng, PROMPT) for _ in range(SCOPES)]
    with attached(engine) as facade:
        for i, prompt in enumerate(prompts):
            facade.submit(f"s{i}", prompt, max_tokens=OUTPUT)
        victim = None
        for _ in range(2_000):
            facade.step()
            victim = next(
                (
                    f"s{i}"
                    for i in range(SCOPES)
                    if "#" in facade.version_record(f"s{i}").participants[0]
                ),
                None,
            )
            if victim is not None:
                break
        assert victim is not None, "the pool never ran out"
        revised = prompts[int(victim[1:])][:100] + tokens(rng, 20)
        assert facade.supersede(victim, revised, max_tokens=8) == 1
        ended: set[str] = set()
        for _ in range(2_000):
            if not facade.has_unfinished():
                break
            facade.step()
            for i in range(SCOPES):
                scope = f"s{i}"
                if scope not in ended and facade.version_record(scope).finished_at is not None:
                    facade.cancel(scope)
                    ended.add(scope)
        assert not facade.has_unfinished(), "stalled"
        old = facade.version_record(victim, 0)
        assert old.closed and old.finish_reason in (None, "abort")
        new = facade.version_record(victim)
        assert len(new.output_token_ids) == 8
        assert new.adopted_blocks == 0  # the preemption freed every page of version 0
        verdict = checker.verify_run(facade)
        assert verdict.ok, verdict.problems
