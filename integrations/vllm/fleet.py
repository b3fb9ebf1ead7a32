"""``RetireFleet``: several ``RetireEngine``s behind one ``ReplacementEngine``.

Each engine is its own vLLM engine with its own core; a scope lives on one engine, chosen when it
is submitted (by default a hash of its id), and every later call for it goes there. The fleet
decides placement only, never protocol.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence

from retire_core import Contract

from .api import Delivery
from .errors import LeakError
from .facade import RetireEngine


class RetireFleet:
    """Several ``RetireEngine``s (each its own vLLM engine and its own core) behind one
    ``ReplacementEngine``: a scope lives on one engine, chosen at submit time."""

    def __init__(
        self,
        engines: Sequence[RetireEngine],
        place: Callable[[str], int] | None = None,
    ) -> None:
        if not engines:
            raise ValueError("a fleet needs at least one engine")
        self.engines = list(engines)
        self._place = place or (
            lambda scope: int(hashlib.sha256(scope.encode()).hexdigest(), 16) % len(self.engines)
        )
        self._home: dict[str, RetireEngine] = {}

    def engine_of(self, scope: str) -> RetireEngine:
        return self._home[scope]

    def submit(self, scope: str, prompt: Sequence[int], contract: Contract, max_tokens: int) -> int:
        if scope in self._home:
            return self._home[scope].submit(scope, prompt, contract, max_tokens)  # raises
        engine = self.engines[self._place(scope)]
        version = engine.submit(scope, prompt, contract, max_tokens)
        self._home[scope] = engine
        return version

    def supersede(
        self, scope: str, prompt: Sequence[int], contract: Contract, max_tokens: int
    ) -> int:
        return self.engine_of(scope).supersede(scope, prompt, contract, max_tokens)

    def pause(self, scope: str) -> None:
        self.engine_of(scope).pause(scope)

    def unpause(self, scope: str) -> None:
        self.engine_of(scope).unpause(scope)

    def cancel(self, scope: str) -> None:
        self.engine_of(scope).cancel(scope)

    def step(self) -> None:
        for engine in self.engines:
            if engine.has_unfinished():
                engine.step()

    def consume(self, scope: str) -> list[Delivery]:
        return self.engine_of(scope).consume(scope)

    def has_unfinished(self) -> bool:
        return any(e.has_unfinished() for e in self.engines)

    def close(self) -> None:
        problems = []
        for engine in self.engines:
            try:
                engine.close()
            except LeakError as err:
                problems.append(str(err))
        if problems:
            raise LeakError("; ".join(problems))
