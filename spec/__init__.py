"""The executable specification of the Retire protocol (import name ``retire_spec``).

What lives here: the abstract state (``schema``), the actions with their guards and effects
(``actions``), the safety and quiescence properties (``invariants``), and the small expression
vocabulary they are all written in (``expr``) together with its concrete interpretation over plain
Python values (and ``codegen``, the same interpretation compiled to straight-line Python). What
does not: the implementation (``retire_core``), the Z3 interpretation and the
explorers (``retire_checks``). Nothing here imports z3, vllm, torch, threads, clocks or I/O.
"""

from .actions import ACTIONS, Action, ActionInstance, apply_action, enabled
from .expr import Concrete, Interp
from .invariants import INVARIANTS, QUIESCENCE, Invariant, check_invariants
from .schema import (
    COLUMNS,
    Bounds,
    Column,
    Kind,
    SpecState,
    initial_state,
)

__all__ = [
    "ACTIONS",
    "COLUMNS",
    "INVARIANTS",
    "QUIESCENCE",
    "Action",
    "ActionInstance",
    "Bounds",
    "Column",
    "Concrete",
    "Interp",
    "Invariant",
    "Kind",
    "SpecState",
    "apply_action",
    "check_invariants",
    "enabled",
    "initial_state",
]
