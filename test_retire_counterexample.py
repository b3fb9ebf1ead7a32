"""Counterexample found by the Retire explorer (chain).

Violation: quiescence property(ies) ['no_leak'] violated
The test replays the shortest path through the real core and the spec with every check on; it
fails while the violation is present.
"""

import contextlib

from retire_checks.environment import Budget
from retire_checks.explorer import Config, replay
from retire_spec.actions import ActionInstance as A
from retire_spec.schema import Bounds

CONFIG = Config(
    'chain',
    Bounds(
        scopes=1,
        parts=2,
        frames=1,
        pages=1,
        positions=1,
        max_epoch=2,
        contexts=((1,), (2,)),
        fingerprints=(0,),
    ),
    Budget(
        faults=1,
        frame_kinds=(0,),
        partial_writes=False,
        reuse_choices=(True, False),
        pause=False,
        cancel=False,
    ),
    ledger_size=1,
)
MOVES = (
    A('open', (0, (1,), True)),
    A('supersede', (0, (1,), True)),
    A('launch', (0, 0, 0)),
    A('allocate', (0, 0, 0)),
    A('receipt', (0,)),
    A('close_writer', (0,)),
)
CHECK_QUIESCENCE = True


def test_counterexample_replays_cleanly() -> None:
    with contextlib.nullcontext():
        replay(CONFIG, MOVES, check_quiescence=CHECK_QUIESCENCE)
