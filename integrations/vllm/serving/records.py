"""What the serving engine side keeps beside the core: admissions waiting for their request,
the requests under Retire, per-scope facts the API answers with, and the cleanup histogram.
Plain records; the rules that change them live in ``engine_side`` (and the core).
"""

from __future__ import annotations

from typing import Any

import attrs


@attrs.define
class Admission:
    """An admitted version whose request has not reached the scheduler yet."""

    scope: str
    version: int
    salt: str
    adopted: tuple[tuple[int, ...], ...]  # one block table per KV cache group
    cold: bool


@attrs.define
class ManagedRequest:
    rid: str
    scope: str
    version: int
    participants: tuple[str, ...]
    salt: str
    client_index: int
    adopted: tuple[tuple[int, ...], ...] = ()  # one block table per KV cache group
    handoff_pins: list[int] = attrs.field(factory=list)
    block_ids: list[list[int]] = attrs.field(factory=list)  # one table per KV cache group
    pages: list[int] = attrs.field(factory=list)
    scheduled: bool = False
    closed: set[str] = attrs.field(factory=set)
    fenced: bool = False


@attrs.define
class ScopeInfo:
    """What the API needs to answer ``GET /v1/scopes/{scope}`` beyond the core's record."""

    tenant: str
    last_active: float
    adopted_blocks: dict[int, int] = attrs.field(factory=dict)  # version -> blocks adopted
    context_blocks: dict[int, int] = attrs.field(factory=dict)  # version -> adoptable blocks


#: Upper bounds (seconds) of the cleanup-latency histogram's buckets.
CLEANUP_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0)


@attrs.define
class Histogram:
    """Cumulative-bucket histogram of durations (Prometheus' shape), fixed size."""

    bounds: tuple[float, ...] = CLEANUP_BUCKETS
    counts: list[int] = attrs.field(factory=lambda: [0] * len(CLEANUP_BUCKETS))
    total: float = 0.0
    n: int = 0

    def observe(self, seconds: float) -> None:
        for i, bound in enumerate(self.bounds):
            if seconds <= bound:
                self.counts[i] += 1
        self.total += seconds
        self.n += 1

    def as_dict(self) -> dict[str, Any]:
        return {
            "bounds": list(self.bounds),
            "counts": list(self.counts),
            "sum": self.total,
            "count": self.n,
        }
