"""Verification of the Retire protocol (import name ``retire_checks``).

What lives here: the abstraction function from core state to spec state, the correspondence of
spec moves and core events and transitions, and the lock-step harness that checks refinement
step by step (``abstraction``, ``correspondence``, ``lockstep``, its memo ``step_memo``); the
explorers, the Z3
interpretation and proofs, the mutant catalogue, trace validation and the ``retire`` CLI. What does
not: the protocol itself (``retire_spec`` states it, ``retire_core`` implements it).
"""
