"""What the serving engine side keeps beside the core: admissions waiting for their request,
the requests under Retire, per-scope facts the API answers with, the cleanup histogram and the
engine core's time in Retire's hooks; and what the API process counts of its own part (outputs
gated and discarded, its time in Retire's per-output code).
Plain records; the rules that change them live in ``engine_side`` (and the core).
"""

from __future__ import annotations

import collections
import contextlib
import time
from collections.abc import Iterator
from typing import Any

import attrs

from ..identity import OutputNames
from ..observe import BlockTables


@attrs.define
class Admission:
    """An admitted version whose request has not reached the scheduler yet."""

    scope: str
    version: int
    salt: str
    adopted: tuple[tuple[int, ...], ...]  # one block table per KV cache group
    cold: bool
    names: OutputNames | None = None  # names the blocks past its context (``identity``)


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
    tables: BlockTables = attrs.field(factory=BlockTables)  # vLLM's, one per KV cache group
    pages: list[int] = attrs.field(factory=list)
    scheduled: bool = False
    closed: set[str] = attrs.field(factory=set)
    fenced: bool = False
    announced: bool = False  # its fence's terminal output was sent
    names: OutputNames | None = None  # names the blocks past its context (``identity``)
    request: Any = None  # vLLM's ``Request``, until its writers closed (``executor.block_name``)
    # how many times vLLM preempted it: each time it runs again under new participants
    preemptions: int = 0


@attrs.define
class ScopeInfo:
    """What the API needs to answer ``GET /v1/scopes/{scope}`` beyond the core's record."""

    tenant: str
    last_active: float
    # when this scope id was opened (wall-clock ns): a forgotten scope's id opens a new scope at
    # version 0, and (incarnation, version) is what orders a scope's chunks for a client
    incarnation: int = attrs.field(factory=time.time_ns)
    adopted_blocks: dict[int, int] = attrs.field(factory=dict)  # version -> blocks adopted
    context_blocks: dict[int, int] = attrs.field(factory=dict)  # version -> adoptable blocks
    # version -> the names of its blocks past its context, until its admission takes them
    names: dict[int, OutputNames] = attrs.field(factory=dict)


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


#: Where Retire's time in the engine core is counted (``EngineTime.hooks``): the utility calls
#: (between steps), a request reaching the scheduler, the schedule (pause, allocations, the write
#: gate), the commit (the commit gate, writer closures, the output gate), requests finished
#: from outside, and the opens decided on the ``open`` thread (during a step's forward pass, or
#: while the engine waits: not part of a step's hooks).
ENGINE_HOOKS = ("utility", "add_request", "schedule", "commit", "finished_outside", "open_early")


@attrs.define
class EngineTime:
    """What Retire costs the engine core, measured by the engine side itself: the seconds spent
    in its hooks (by ``ENGINE_HOOKS`` entry; a hook entered from inside another is counted once,
    in the outer one) and the wall time of the steps it saw (from the scheduler's ``schedule`` to
    the end of its commit, the model's forward pass in between), with their number. Retire's
    share of a step is the schedule and commit hooks' seconds over ``step_seconds``. Of the
    hooks' time, ``worker_seconds`` is spent waiting for the workers to digest KV blocks (the
    blocks a step filled, the byte check before an adoption): a round trip to the worker
    processes, which digests computed in the worker within the step would save.
    ``worker_digest_seconds`` is what those digests cost the steps instead: the workers' time
    digesting the blocks named for each step (the slowest rank's), inside the forward pass's
    time and so not in the hooks' seconds; Retire's part of a step counts both."""

    hooks: dict[str, float] = attrs.field(factory=lambda: dict.fromkeys(ENGINE_HOOKS, 0.0))
    steps: int = 0
    step_seconds: float = 0.0
    worker_seconds: float = 0.0
    worker_digest_seconds: float = 0.0
    inside: bool = False  # a hook is running (nested hooks are not counted again)
    # when each step not committed yet was scheduled (oldest first: with a batch queue,
    # steps are scheduled ahead of the commit of the one before)
    step_starts: collections.deque[float] = attrs.field(factory=collections.deque)

    def step_scheduled(self, now: float) -> None:
        self.step_starts.append(now)

    @contextlib.contextmanager
    def scheduling(self) -> Iterator[None]:
        """Around the scheduler's ``schedule``: the step starts now, unless ``schedule`` raises
        (no step was scheduled, so none may be paired with the next commit)."""
        self.step_scheduled(time.perf_counter())
        try:
            yield
        except BaseException:
            self.step_starts.pop()
            raise

    def step_committed(self, now: float) -> None:
        if self.step_starts:
            self.steps += 1
            self.step_seconds += now - self.step_starts.popleft()

    def as_dict(self) -> dict[str, Any]:
        return {
            "hooks": dict(self.hooks),
            "steps": self.steps,
            "step_seconds": self.step_seconds,
            "worker_seconds": self.worker_seconds,
            "worker_digest_seconds": self.worker_digest_seconds,
        }


#: Where the API process's time in Retire's per-output code is counted (``ApiAccount.seconds``):
#: the publication check on each output of a scoped version (``front_end``), and the version
#: stamp on each body message of a generation response (``http``).
API_PARTS = ("gate", "stamp")


@attrs.define
class ApiAccount:
    """What the API process counts of Retire's part in it (``retire_api_*`` and the consumer
    boundary's drops on /metrics): the outputs of scoped versions that went through the
    publication check, those it discarded behind a fence, and the seconds spent in Retire's
    per-output code, by ``API_PARTS`` entry. Beside ``EngineTime`` it splits what a client sees
    added to its inter-token latency between the two processes."""

    seconds: dict[str, float] = attrs.field(factory=lambda: dict.fromkeys(API_PARTS, 0.0))
    outputs: int = 0
    dropped_outputs: int = 0
    openings_left: int = 0  # clients that left while their version was being opened

    def spent(self, part: str, since: float) -> None:
        self.seconds[part] += time.perf_counter() - since

    def as_dict(self) -> dict[str, Any]:
        return {
            "seconds": dict(self.seconds),
            "outputs": self.outputs,
            "dropped_outputs": self.dropped_outputs,
            "openings_left": self.openings_left,
        }
