"""The core's state records and maps on their own: ``evolve`` (the fast copy-with-changes every
step takes) against ``attrs.evolve``/``_replace``, and a state pickled in one process and read
in another (the replay's recorded core calls travel that way to ``retire_bench.interleave``)."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys

import attrs
import pytest

import retire_core as rc
from retire_core.frozen import FrozenMap
from retire_core.state import PageRecord, ParticipantRecord, evolve


class _Quiet:
    def info(self, event: str, **fields: object) -> None:
        pass


def test_evolve_equals_attrs_evolve_and_replace() -> None:
    """The core's ``evolve`` makes exactly the record ``attrs.evolve`` (``_replace`` for the
    ``PageRecord`` named tuple) makes, of the same class, leaving the original alone; an unknown
    field is refused."""
    page = PageRecord("s", 0, "q", 1, 2, "b2", "fp")
    changed = evolve(page, held=False, pinned=True, digest="d")
    assert type(changed) is PageRecord
    assert changed == page._replace(held=False, pinned=True, digest="d")
    assert (page.held, page.pinned, page.digest) == (True, False, None)
    part = ParticipantRecord(3)
    assert evolve(part, closed=True) == attrs.evolve(part, closed=True)
    core = rc.Retire(logger=_Quiet())
    core.handle(rc.Submit("s", "t", "f", (1,)))
    scope = core.scope("s")
    moved = evolve(scope, state=rc.ScopeState.PAUSED, admitted=False)
    assert type(moved) is type(scope)
    assert moved == attrs.evolve(scope, state=rc.ScopeState.PAUSED, admitted=False)
    for record in (page, part, scope):
        with pytest.raises(KeyError):
            evolve(record, no_such_field=1)


_READ_BACK = """
import pickle, sys
import retire_core as rc
class Quiet:
    def info(self, event, **fields):
        pass
state = pickle.loads(sys.stdin.buffer.read())
fresh = rc.Retire(logger=Quiet())
fresh.handle(rc.Submit("scope-a", "tenant", "fp", ("a", "b")))
print(state == fresh.snapshot(), hash(state) == hash(fresh.snapshot()))
"""


def test_a_pickled_state_hashes_like_a_fresh_one_in_another_process() -> None:
    """Equal states must hash equal in every process. A ``FrozenMap`` caches its hash, and string
    hashes are salted per process, so a pickled map must not carry its cached hash along (it
    did: the read-back state was equal to a fresh one but hashed differently)."""
    core = rc.Retire(logger=_Quiet())
    core.handle(rc.Submit("scope-a", "tenant", "fp", ("a", "b")))
    state = core.snapshot()
    hash(state)  # fills every cache on the way down
    assert state.scopes._h is not None
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run(
        [sys.executable, "-c", _READ_BACK],
        input=pickle.dumps(state),
        capture_output=True,
        env=env,
        check=True,
    )
    assert out.stdout.split() == [b"True", b"True"]


def test_a_frozen_map_pickles_as_its_items() -> None:
    m = FrozenMap({"x": 1, "y": 2})
    hash(m)
    back = pickle.loads(pickle.dumps(m))
    assert back == m and back._h is None and list(back) == ["x", "y"]


def test_a_txn_has_no_write_path_into_the_state_it_reads() -> None:
    """``Txn.rscopes`` is a read-only view, of the frozen state's scopes and later of the
    step's own copy; writes go through ``Txn.scopes``, which thaws a copy first."""
    from retire_core.txn import Txn

    state = rc.step(rc.CoreState(), rc.Submit("s0", "t0", "0", (1,))).state
    txn = Txn(state)
    with pytest.raises(TypeError):
        txn.rscopes["s1"] = state.scopes["s0"]  # type: ignore[index]
    txn.scopes["s1"] = state.scopes["s0"]
    with pytest.raises(TypeError):
        del txn.rscopes["s0"]  # type: ignore[attr-defined]
    assert "s1" in txn.rscopes and "s1" not in state.scopes
