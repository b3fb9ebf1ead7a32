"""The integration's own errors: vLLM did something Retire's bookkeeping cannot account for.

``IntegrationError`` is the base; ``IsolationError`` means the core fenced a write vLLM was
about to make, ``LeakError`` that blocks, pins or pages were left behind, ``LedgerError`` that a
command would corrupt vLLM's block pool, ``EngineDeadError`` that the engine's workers died or
stopped answering. Protocol refusals are the core's ``RetireError``s.
"""

from __future__ import annotations


class IntegrationError(RuntimeError):
    """vLLM did something the integration's bookkeeping cannot account for."""


class IsolationError(IntegrationError):
    """The core fenced a write that vLLM was about to make (Rule 3 would be broken)."""


class LeakError(IntegrationError):
    """``close`` found blocks, pins or pages left behind."""


class LedgerError(IntegrationError):
    """A command the ledger cannot carry out without corrupting vLLM's block pool."""


class EngineDeadError(IntegrationError):
    """A worker process of the engine died, or did not answer one of Retire's calls in time: the
    commands the core issued can no longer be carried out (nothing more is done on that engine;
    a new engine starts over)."""
