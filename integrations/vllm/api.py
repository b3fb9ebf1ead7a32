"""The engine-facing API shared by the Retire facade and the native baselines.

``ReplacementEngine`` is what the benchmarks and tests drive: submit a scope, supersede it with a
revised prompt, pause, cancel, step the engine, and read what the consumer received. Two families
implement it: ``retire_vllm.facade.RetireEngine`` (the core decides every publication, fence,
handoff and free) and the native baselines in ``retire_bench.native`` (abort-and-resubmit through
vLLM's public API, and the client that simply stops reading). ``Delivery`` is one chunk of tokens
as the consumer saw it, stamped with the version that produced it, so a harness can count obsolete
tokens without trusting the engine under test.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import attrs

from retire_core import Contract


@attrs.frozen(slots=True)
class Delivery:
    """Tokens handed to the consumer of ``scope`` at ``time`` (seconds, engine clock)."""

    scope: str
    version: int
    token_ids: tuple[int, ...]
    finished: bool
    time: float


class ReplacementEngine(Protocol):
    """One engine, several scopes; every call is made from the driving thread."""

    def submit(
        self, scope: str, prompt: Sequence[int], contract: Contract, max_tokens: int
    ) -> int: ...

    def supersede(
        self, scope: str, prompt: Sequence[int], contract: Contract, max_tokens: int
    ) -> int: ...

    def pause(self, scope: str) -> None: ...

    def unpause(self, scope: str) -> None: ...

    def cancel(self, scope: str) -> None: ...

    def step(self) -> None:
        """Run one engine step and move its outputs towards the consumers."""

    def consume(self, scope: str) -> list[Delivery]:
        """What the (possibly slow) consumer of ``scope`` reads now; empties its queue."""

    def has_unfinished(self) -> bool: ...

    def close(self) -> None:
        """Release every scope and check that no block or pin is left behind."""
