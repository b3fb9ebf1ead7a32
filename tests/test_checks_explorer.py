"""The explorer's own machinery: canonical forms, symmetry, incremental invariant checks,
quiescence, vacuity, counterexamples written as pytest files."""

from __future__ import annotations

import contextlib
import itertools
import random
from pathlib import Path
from typing import Any

import attrs
import pytest

import retire_core as rc
from retire_checks import mutant_kind, mutants
from retire_checks import shard as shard_module
from retire_checks.abstraction import Universe, fast_canonical
from retire_checks.environment import Budget, Offers, apply_move, env_moves
from retire_checks.explorer import (
    COMPLETION,
    QUICK,
    Config,
    ExploreResult,
    Profile,
    Progress,
    explore,
    run_profile,
)
from retire_checks.lockstep import Lockstep, RefinementError
from retire_checks.shard import Shard, dump_batch
from retire_checks.step_memo import StepMemo
from retire_checks.symmetry import Symmetry, check_encoder_covers_core, core_class
from retire_core import reclaim
from retire_spec.actions import ACTION_BY_NAME, ActionInstance
from retire_spec.expr import Concrete
from retire_spec.invariants import INVARIANTS
from retire_spec.schema import Bounds, canonical
from tests.helpers import arbitrary_spec_state

WALK = Bounds(2, 3, 2, 3, 2, 3, ((1, 2), (1, 3), (4, 5)), (0, 1))
A = ActionInstance


def _walk_states(seeds: int = 60, steps: int = 50) -> list[Lockstep]:
    out = []
    uni = Universe.of(WALK)
    for seed in range(seeds):
        rng = random.Random(seed)
        ls = Lockstep(uni, ledger_size=rng.choice((1, 8)))
        for _ in range(steps):
            moves = env_moves(ls, Budget(faults=2, partial_writes=True))
            if not moves:
                break
            apply_move(ls, rng.choice(moves))
            out.append(ls)
            snap = ls.snapshot()
            ls = Lockstep(uni)
            ls.restore(snap)
    return out


def test_fast_canonical_is_the_specs_canonical_form() -> None:
    for ls in _walk_states():
        assert fast_canonical(ls.spec, WALK) == canonical(ls.spec, WALK)


def test_fast_canonical_agrees_on_arbitrary_states() -> None:
    """The generated canonical form against the spec's, on states no run need reach (integer
    cells include the mode, frame-state and sentinel values the canonical form tests for)."""
    rng = random.Random(11)
    for b in (WALK, *(c.bounds for c in QUICK.configs)):
        for _ in range(1000):
            st = arbitrary_spec_state(rng, b, range(-2, 4))
            assert fast_canonical(st, b) == canonical(st, b)


def test_canonical_form_never_hides_an_invariant_violation() -> None:
    """Explorers deduplicate on the canonical form, so every invariant must have the same value
    on a state and on its canonical form — for arbitrary states, not only reachable ones (a
    mutant reaches states the real protocol does not)."""
    rng = random.Random(7)
    I = Concrete(WALK.sizes())
    for _ in range(3000):
        st = arbitrary_spec_state(rng, WALK, range(-2, 4))
        canon = canonical(st, WALK)
        for inv in INVARIANTS:
            assert inv.holds(I, st) == inv.holds(I, canon), inv.name


def test_symmetric_states_share_a_fingerprint() -> None:
    b = Bounds(2, 2, 1, 2, 1, 1, ((1,), (2,)), (0, 1))
    uni = Universe.of(b)
    sym = Symmetry(uni)

    def fp(moves: list[ActionInstance]) -> int:
        ls = Lockstep(uni)
        for m in moves:
            apply_move(ls, m)
        # the parallel search's owner of a state is a function of its orbit too
        classes[core_class(ls.core)] = classes.get(core_class(ls.core), 0) + 1
        return sym.fingerprint(ls.core, fast_canonical(ls.spec, b), ls.pending_reports, ls.faults)

    classes: dict[int, int] = {}

    # the same story told with the scopes (and their tenants) swapped ...
    left = fp([A("open", (0, (1,), True)), A("launch", (0, 0, 0)), A("allocate", (0, 0, 0))])
    right = fp([A("open", (1, (1,), True)), A("launch", (0, 1, 0)), A("allocate", (0, 0, 0))])
    assert left == right
    # ... with the participants swapped ...
    two = [A("open", (0, (1,), True)), A("open", (1, (2,), True))]
    a = fp([*two, A("launch", (0, 0, 0)), A("launch", (1, 1, 0)), A("receipt", (0,))])
    c = fp([*two, A("launch", (0, 1, 0)), A("launch", (1, 0, 0)), A("receipt", (1,))])
    assert a == c
    assert sorted(classes.values()) == [2, 2]
    # ... but not a different story
    assert left != fp([A("open", (0, (2,), True)), A("launch", (0, 0, 0))])
    assert left != fp(
        [A("open", (0, (1,), True)), A("launch", (0, 0, 0)), A("allocate", (1, 0, 0))]
    )


def test_symmetry_reduces_without_losing_violations() -> None:
    config = attrs.evolve(mutant_kind.CONFIGS["tenants"])
    plain = explore(attrs.evolve(config, symmetry=False))
    reduced = explore(config)
    assert plain.violation is None and reduced.violation is None
    assert reduced.states < plain.states
    mutant = mutants.MUTANTS["cross_tenant_write"]
    with mutant.active():
        a = explore(attrs.evolve(config, symmetry=False)).violation
        b = explore(config).violation
    assert a is not None and b is not None and len(a.moves) == len(b.moves)


def test_the_encoder_knows_every_core_field() -> None:
    check_encoder_covers_core()


def _leaky_reclaim(txn: Any, scope: str) -> None:
    """Releases references but never frees a page (and the spec below agrees): what it would
    free it gives back to the engine's cache instead, so the engine's books agree too."""
    before = dict(txn.pages)
    reclaim._orig(txn, scope)  # type: ignore[attr-defined]
    for p, page in before.items():
        if p not in txn.pages:
            txn.pages[p] = page._replace(held=False)
    txn.commands[:] = [
        rc.ReleaseToCache(c.pages) if isinstance(c, rc.Free) else c for c in txn.commands
    ]
    txn.transitions[:] = [t for t in txn.transitions if t.action != "free"]


def test_quiescence_catches_a_leak_that_refinement_cannot() -> None:
    """A core that never frees, checked against a spec that never frees either: refinement and
    every invariant hold, only the quiescence check (no leak once revisions stop) fails."""
    no_free = dict(ACTION_BY_NAME)
    no_free["free"] = attrs.evolve(no_free["free"], guard=lambda I, st, p: I.lit(False))
    reclaim._orig = reclaim.reclaim  # type: ignore[attr-defined]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(reclaim, "reclaim", _leaky_reclaim)
        result = explore(mutant_kind.CONFIGS["chain"], actions=no_free)
    cex = result.violation
    assert cex is not None and cex.quiescence and "no_leak" in cex.violated


def test_a_profile_that_misses_a_probe_is_vacuous() -> None:
    config = Config("no-faults", Bounds(1, 1, 0, 1, 1, 1, ((1,),), (0,)), Budget(faults=0))
    profile = Profile("tiny", (config,), ("transition:open", "release:digest_mismatch"))
    result = run_profile(profile, progress=False)
    assert result.violation is None and result.exhaustive
    assert result.missing_probes == ("release:digest_mismatch",)
    assert not result.ok
    assert "NEVER HIT" in result.summary()


def test_counterexample_is_numbered_and_written_as_a_replayable_pytest_case(
    tmp_path: Path,
) -> None:
    mutant = mutants.MUTANTS["closed_on_partial_receipts"]
    with mutant.active():
        cex = explore(mutant_kind.CONFIGS["chain"]).violation
        assert cex is not None
        steps = cex.steps()
    assert steps.splitlines()[0].startswith("  1. ")
    assert "=>" in steps.splitlines()[-1]
    for name, expect_failure in ((mutant.name, True), (None, False)):
        path = tmp_path / f"test_cex_{name}.py"
        path.write_text(cex.to_pytest(name), encoding="utf-8")
        namespace: dict[str, Any] = {}
        exec(compile(path.read_text(encoding="utf-8"), str(path), "exec"), namespace)
        test = namespace["test_counterexample_replays_cleanly"]
        ctx = pytest.raises(RefinementError) if expect_failure else contextlib.nullcontext()
        with ctx:
            test()


def test_progress_line_is_plain_text() -> None:
    import io

    stream = io.StringIO()
    bar = Progress("x", stream)
    bar.period = 0.0
    bar.update(10, 20, 3, 4)
    assert "10 states" in stream.getvalue() and "\r" not in stream.getvalue()


def test_quick_profile_configs_are_small_and_distinct() -> None:
    names = [c.name for c in QUICK.configs]
    assert len(set(names)) == len(names)
    for a, b in itertools.combinations(QUICK.configs, 2):
        assert a.bounds != b.bounds or a.budget != b.budget


def test_memoized_moves_agree_with_the_recording_harness() -> None:
    """``Lockstep.move`` with a step memo (the explorer's harness: memo hits by identity,
    legality judged only for refused events, dicts copied on write) leaves the same joint state
    and returns the same outcome as ``apply_move`` on a recording harness without a memo that
    checks every step. Walks restart from one snapshot, so they revisit core steps and the memo
    hits are compared too."""
    uni = Universe.of(WALK)
    budget = Budget(faults=2, partial_writes=True)
    for ledger in (1, 8):
        memo = StepMemo()
        fast = Lockstep(uni, ledger_size=ledger, record=False, check_each_step=False, memo=memo)
        start = fast.snapshot()
        hits = 0
        for seed in range(40):
            rng = random.Random(seed)
            ref = Lockstep(uni, ledger_size=ledger)
            fast.restore(start)
            for _ in range(40):
                moves = env_moves(ref, budget)
                assert moves == env_moves(fast, budget)
                if not moves:
                    break
                move = rng.choice(moves)
                size = memo.size
                want = apply_move(ref, move)
                got = fast.move(move)
                hits += move.name not in ("emit", "corrupt") and memo.size == size
                assert (got.commands, got.transitions, got.spec_steps) == (
                    want.commands,
                    want.transitions,
                    want.spec_steps,
                ), move
                assert fast.snapshot() == ref.snapshot(), move
        assert hits > 50


def _offers_disagree(offers: Offers, budget: Budget) -> int:
    """How many walk states ``offers`` answers differently from ``env_moves`` (one memo for all
    of them, so it is mostly answered from the memo)."""
    wrong = 0
    for ls in _walk_states(seeds=30):
        moves, completes = offers(ls)
        want = env_moves(ls, budget)
        wrong += moves != want or completes != any(m.name in COMPLETION for m in want)
    return wrong


def test_the_offers_memo_is_env_moves() -> None:
    """``Offers`` (the explorer's ``env_moves``, memoized on what it reads) answers exactly as
    ``env_moves`` on walk states; a memo whose key forgets one column it reads does not, so the
    comparison would catch an incomplete key."""
    budget = Budget(faults=2, partial_writes=True)
    assert _offers_disagree(Offers(budget, COMPLETION), budget) == 0

    class Forgetful(Offers):
        def projection(self, ls: Lockstep) -> tuple[Any, ...]:
            key = super().projection(ls)
            return key[:5] + key[6:]  # without the frame states

    assert _offers_disagree(Forgetful(budget, COMPLETION), budget) > 0


def test_raw_fingerprints_are_fingerprints_of_the_canonical_form() -> None:
    """``Symmetry.fingerprint_raw`` (memoized by the identity of the raw spec state) is
    ``fingerprint`` of the canonical form, on walk states met twice."""
    sym = Symmetry(Universe.of(WALK))
    states = _walk_states(seeds=20)
    for ls in states + states:
        canon = fast_canonical(ls.spec, WALK)
        want = sym.fingerprint(ls.core, canon, ls.pending_reports, ls.faults)
        got = sym.fingerprint_raw(
            ls.core, ls.spec, ls.pending_reports, ls.faults, lambda st: fast_canonical(st, WALK)
        )
        assert got == (want, canon)


def test_trimmed_memos_change_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """With memo tables so small that they are emptied many times during the search (the step
    memo's core-step tables, fingerprints of raw states, interned states), the search finds the
    same states, transitions and probe counts."""
    import retire_checks.shard as shard_module

    config = QUICK.configs[-1]  # tenants: every probe counter matters
    want = explore(config)
    monkeypatch.setattr(shard_module, "StepMemo", lambda: StepMemo(limit=300))
    got = explore(config)
    assert (got.states, got.transitions, got.quiescent) == (
        want.states,
        want.transitions,
        want.quiescent,
    )
    assert got.probes == want.probes


def test_the_engine_launches_only_admitted_unfenced_versions() -> None:
    """The environment obeys the core: a version is launched only after its ``Admit`` and not
    after a ``Fence`` of it; a version retired with nothing running (no ``Fence``) may still
    see a launch racing the revision, which the core then fences."""
    b = Bounds(1, 3, 0, 1, 1, 2, ((1,), (2,)), (0,))

    def launches(ls: Lockstep) -> set[int]:
        return {m.args[2] for m in env_moves(ls, Budget()) if m.name == "launch"}

    ls = Lockstep(Universe.of(b))
    assert launches(ls) == set()
    apply_move(ls, A("open", (0, (1,), False)))  # Admit(s0, 0)
    assert launches(ls) == {0}
    apply_move(ls, A("launch", (0, 0, 0)))
    apply_move(ls, A("supersede", (0, (2,), False)))  # Fence(s0, 0, q0), cold Admit(s0, 1)
    assert launches(ls) == {1}
    racing = Lockstep(Universe.of(b))
    apply_move(racing, A("open", (0, (1,), False)))
    apply_move(racing, A("supersede", (0, (2,), False)))  # nothing ran: no Fence
    assert launches(racing) == {0, 1}
    out = apply_move(racing, A("launch", (0, 0, 0)))
    assert [type(c).__name__ for c in out.commands] == ["Fence"]
    assert launches(racing) == {1}


def _outcome(r: ExploreResult) -> tuple[Any, ...]:
    return (r.states, r.transitions, r.max_depth, r.quiescent, r.exhaustive, r.probes)


@pytest.mark.parametrize(("jobs", "stream"), [(2, False), (3, False), (2, True)])
def test_workers_split_a_search_without_changing_it(
    jobs: int, stream: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Split across worker processes (each owning the states of some core states), a search
    finds the same states, transitions, depth, quiescent states and probe hits as in one
    process. ``twins`` has two scope renamings (owners must agree on whole orbits). With
    ``stream``, workers hand over batches of ten successors every four states, so batches
    arrive while the receiver still expands its frontier (which ``control``, whose
    representatives of a fingerprint differ in what they do next, would show)."""
    configs = [mutant_kind.CONFIGS["handoff"], mutant_kind.CONFIGS["twins"]]
    if stream:
        monkeypatch.setattr(shard_module, "POLL", 4)
        monkeypatch.setattr(shard_module, "FLUSH", 10)
        configs.append(mutant_kind.CONFIGS["control"])
    for config in configs:
        one = explore(config)
        many = explore(config, jobs=jobs)
        assert (one.workers, many.workers) == (1, jobs)
        assert one.violation is None and many.violation is None and one.exhaustive
        assert _outcome(many) == _outcome(one), config.name


@pytest.mark.parametrize(
    "name", ["digest_ignored", "cross_tenant_write", "align_takes_same_tenant_page"]
)
def test_workers_find_the_same_shortest_counterexample(name: str) -> None:
    """A seeded core bug is found by the split search too, with the very counterexample (and
    the same counts up to the level it was found in) as in one process."""
    mutant = mutants.MUTANTS[name]
    with mutant.active():
        one = explore(mutant.configs[0])
        two = explore(mutant.configs[0], jobs=2)
    assert one.violation is not None
    assert two.violation == one.violation
    assert _outcome(two) == _outcome(one)


def test_workers_find_a_quiescence_violation() -> None:
    """The leaky core of ``test_quiescence_catches_a_leak_that_refinement_cannot``, with a
    spec action table of its own: both reach the worker processes."""
    no_free = dict(ACTION_BY_NAME)
    no_free["free"] = attrs.evolve(no_free["free"], guard=lambda I, st, p: I.lit(False))
    reclaim._orig = reclaim.reclaim  # type: ignore[attr-defined]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(reclaim, "reclaim", _leaky_reclaim)
        one = explore(mutant_kind.CONFIGS["chain"], actions=no_free)
        two = explore(mutant_kind.CONFIGS["chain"], actions=no_free, jobs=2)
    assert one.violation is not None and one.violation.quiescence
    assert two.violation == one.violation
    assert _outcome(two) == _outcome(one)


def test_a_capped_search_stops_alike_with_any_number_of_workers() -> None:
    config = attrs.evolve(mutant_kind.CONFIGS["chain"], max_states=2_000)
    one = explore(config)
    two = explore(config, jobs=2)
    assert not one.exhaustive and one.states >= 2_000
    assert _outcome(two) == _outcome(one)


def test_core_states_travel_between_workers_intact() -> None:
    """Workers hand each other core states pickled as their records' field values
    (``shard.dump_batch``): what arrives equals what was sent, hash included, for every core
    state of the quick profile's ``handoff`` (certificates, participants, pinned pages)."""
    import pickle

    shard = Shard(mutant_kind.CONFIGS["handoff"], rc.step, None, INVARIANTS)
    shard.start()
    while shard.frontier:
        shard.expand()
        shard.admit()
    cores = list(shard.memo.cores)
    (back,) = pickle.loads(dump_batch((cores,)))
    assert back == cores
    assert [hash(c) for c in back] == [hash(c) for c in cores]
    assert any(c.scopes[s].certificate for c in cores for s in c.scopes)
    assert any(p.pinned for c in cores for p in c.pages.values())


def test_configurations_side_by_side_give_what_one_after_another_gives() -> None:
    """With at least as many configurations as jobs, each configuration runs in a process of
    its own; the results are those of a run in one process, and the wall time is the run's."""
    profile = Profile(
        "three", tuple(mutant_kind.CONFIGS[n] for n in ("tenants", "twins", "drafts")), ()
    )
    one = run_profile(profile, progress=False)
    two = run_profile(profile, progress=False, jobs=2)
    assert (one.wall, one.workers) == (None, 1)
    assert two.wall is not None and two.workers == 2 and two.seconds == two.wall
    assert [r.config.name for r in two.results] == ["tenants", "twins", "drafts"]
    assert [_outcome(r) for r in two.results] == [_outcome(r) for r in one.results]


def test_configurations_side_by_side_stop_where_one_after_another_stops() -> None:
    """A seeded core bug (patched before the processes fork) is found with the same
    counterexample, and the configurations after the one that found it are not reported."""
    mutant = mutants.MUTANTS["digest_ignored"]
    found_in = mutant.configs[0]
    others = [c for c in mutant_kind.CONFIGS.values() if c.name in ("tenants", "twins")]
    profile = Profile("seeded", (others[0], found_in, others[1]), ())
    with mutant.active():
        one = run_profile(profile, progress=False)
        two = run_profile(profile, progress=False, jobs=3)
    assert len(one.results) == 2 and one.violation is not None
    assert two.wall is not None and len(two.results) == 2
    assert two.violation == one.violation
    assert [_outcome(r) for r in two.results] == [_outcome(r) for r in one.results]
