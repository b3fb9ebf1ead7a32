"""The explorer's search over one configuration, on one process or split across worker processes.

``explore(config, jobs=N)`` drives the level-synchronous breadth-first search of ``shard``: with
one job a single ``Shard`` in this process owns every state; with N, N forked worker processes
each own the states that a hash of their orbit maps to (as TLC's distributed workers own the
states their fingerprint maps to; here the hash reads the core state's part of the orbit, so
that one worker computes all steps of a core state: ``symmetry.core_class``). Per level, this
process tells every worker to expand its frontier; the workers hand each other the successors
they do not own (one batch per pair of workers and level, through multiprocessing queues),
fingerprint, admit and check their new states, and report their totals and the first violation
they met. The search stops after the level in which any worker met a violation (the one with
the smallest key: the one a one-process search meets first), when no worker has a frontier
left, or at the configuration's state cap. A counterexample is rebuilt by asking the workers
for the parent links of its states. So the states, transitions, probe counts, verdicts and
counterexamples are the same for any number of workers (tests hold them to it). Workers are
started with ``fork``: they inherit the compiled spec, the patched core of a mutant and the
process's hash seed, which fingerprints depend on; where ``fork`` is not available the search
runs in this process. What does not live here: the expansion of a level (``shard``), the
profiles (``profiles``), the spec-only search (``explorer.explore_spec``).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import queue
import sys
import time
import traceback
from collections import Counter
from multiprocessing.connection import Connection
from typing import Any, Protocol, TextIO

import attrs

import retire_core as rc
from retire_checks.config import Config, StepFn
from retire_checks.counterexample import Counterexample
from retire_checks.shard import Found, LevelReport, Shard, ShardTotals, without_cyclic_gc
from retire_spec.actions import Action, ActionInstance
from retire_spec.invariants import INVARIANTS, Invariant


@attrs.frozen(slots=True)
class ExploreResult:
    config: Config
    states: int
    transitions: int
    max_depth: int
    seconds: float  # wall time
    quiescent: int
    exhaustive: bool
    probes: Counter[str]
    violation: Counterexample | None
    cpu_seconds: float = 0.0  # CPU time of the search, its worker processes included
    workers: int = 1

    @property
    def states_per_second(self) -> float:
        """Distinct states per second of wall time."""
        return self.states / self.seconds if self.seconds > 0 else 0.0


class Progress:
    """A plain progress line on stderr: rewritten in place on a terminal, else every 5 s."""

    def __init__(self, label: str, stream: TextIO | None = None, enabled: bool = True) -> None:
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.tty = enabled and hasattr(self.stream, "isatty") and self.stream.isatty()
        self.start = time.perf_counter()
        self.last = self.start
        self.period = 0.25 if self.tty else 5.0

    def update(self, states: int, transitions: int, depth: int, queue: int) -> None:
        now = time.perf_counter()
        if not self.enabled or now - self.last < self.period:
            return
        self.last = now
        rate = states / max(now - self.start, 1e-9)
        line = (
            f"[{self.label}] {states:>9,} states  {transitions:>10,} transitions  "
            f"depth {depth:>3}  queue {queue:>8,}  {rate:>8,.0f} states/s"
        )
        if self.tty:
            self.stream.write("\r" + line)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def done(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


class Cluster(Protocol):
    """The shards of one search, wherever they run."""

    workers: int

    def start(self) -> list[LevelReport]: ...
    def level(self) -> list[LevelReport]: ...
    def parent(self, fp: int) -> tuple[int, ActionInstance] | None: ...
    def totals(self) -> list[ShardTotals]: ...
    def close(self) -> None: ...


class LocalCluster:
    """One shard in this process."""

    workers = 1

    def __init__(self, shard: Shard) -> None:
        self.shard = shard

    def start(self) -> list[LevelReport]:
        return [self.shard.start()]

    def level(self) -> list[LevelReport]:
        self.shard.expand()
        return [self.shard.admit()]

    def parent(self, fp: int) -> tuple[int, ActionInstance] | None:
        return self.shard.parents[fp]

    def totals(self) -> list[ShardTotals]:
        return [self.shard.totals()]

    def close(self) -> None:
        del self.shard


_NOT_MINE = False  # a shard's answer for a state it does not own (a singleton: survives pickling)


def _serve(shard: Shard, me: int, inboxes: list[Any], conn: Connection) -> None:
    """A worker process: answers the coordinator's requests until told to exit. In a level,
    the batches it sends are marked last or not; it is through with a level once it has
    expanded its frontier and received the last batch of every other worker."""
    try:
        shard.index = me
        shard.c0 = time.process_time()
        workers = shard.workers
        inbox = inboxes[me]
        lasts = 0

        def take_in(message: tuple[int, bytes, bool]) -> None:
            nonlocal lasts
            source, data, last = message
            shard.receive(source, data)
            lasts += last

        def poll() -> None:
            while True:
                try:
                    message = inbox.get(block=False)
                except queue.Empty:
                    return
                take_in(message)

        def post(dest: int, data: bytes) -> None:
            inboxes[dest].put((me, data, False))

        with without_cyclic_gc():
            while True:
                op, arg = conn.recv()
                if op == "start":
                    conn.send(("ok", shard.start()))
                elif op == "level":
                    lasts = 0
                    shard.expand(post, poll)
                    for dest in range(workers):
                        if dest != me:
                            inboxes[dest].put((me, shard.take(dest), True))
                    while lasts < workers - 1:
                        take_in(inbox.get())
                    conn.send(("ok", shard.admit()))
                elif op == "parent":
                    conn.send(("ok", shard.parents.get(arg, _NOT_MINE)))
                elif op == "totals":
                    conn.send(("ok", shard.totals()))
                else:
                    return
    except BaseException:
        conn.send(("error", traceback.format_exc()))


class ProcessCluster:
    """``workers`` forked processes, one shard each."""

    def __init__(
        self,
        config: Config,
        step_fn: StepFn,
        actions: dict[str, Action] | None,
        invariants: tuple[Invariant, ...],
        workers: int,
    ) -> None:
        ctx = multiprocessing.get_context("fork")
        self.workers = workers
        # Queues, not pipes, between workers: a put returns at once (a feeder thread writes),
        # so two workers handing each other large batches cannot block each other.
        self.inboxes = [ctx.Queue() for _ in range(workers)]
        self.conns: list[Connection] = []
        self.procs: list[Any] = []
        # one shard is built here and inherited by every fork (with the compiled spec), each
        # taking its own index
        shard = Shard(config, step_fn, actions, invariants, 0, workers)
        for index in range(workers):
            mine, theirs = ctx.Pipe()
            proc = ctx.Process(
                target=_serve,
                args=(shard, index, self.inboxes, theirs),
                daemon=True,
                name=f"shard-{index}",
            )
            proc.start()
            theirs.close()
            self.conns.append(mine)
            self.procs.append(proc)

    def _ask(self, op: str, arg: Any = None, only: int | None = None) -> list[Any]:
        targets = range(self.workers) if only is None else (only,)
        for i in targets:
            self.conns[i].send((op, arg))
        answers = []
        for i in targets:
            try:
                status, value = self.conns[i].recv()
            except EOFError as err:
                code = self.procs[i].exitcode
                raise RuntimeError(f"explorer worker {i} died (exit code {code})") from err
            if status != "ok":
                raise RuntimeError(f"explorer worker {i} failed:\n{value}")
            answers.append(value)
        return answers

    def start(self) -> list[LevelReport]:
        return self._ask("start")

    def level(self) -> list[LevelReport]:
        return self._ask("level")

    def parent(self, fp: int) -> tuple[int, ActionInstance] | None:
        # (the owner of a state is not known from its fingerprint alone: every shard is asked)
        links = [link for link in self._ask("parent", fp) if link is not _NOT_MINE]
        return links[0]  # type: ignore[no-any-return]

    def totals(self) -> list[ShardTotals]:
        return self._ask("totals")

    def close(self) -> None:
        for conn in self.conns:
            with contextlib.suppress(OSError):  # a worker that failed has closed its end
                conn.send(("exit", None))
        for proc in self.procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.terminate()
                proc.join()
        for conn in self.conns:
            conn.close()
        for q in self.inboxes:
            q.close()


def can_fork() -> bool:
    """Whether worker processes can be started here (a daemonic process, such as a pool's
    worker, may not have children)."""
    return (
        "fork" in multiprocessing.get_all_start_methods()
        and not multiprocessing.current_process().daemon
    )


def explore(
    config: Config,
    step_fn: StepFn = rc.step,
    actions: dict[str, Action] | None = None,
    invariants: tuple[Invariant, ...] = INVARIANTS,
    progress: Progress | None = None,
    jobs: int = 1,
) -> ExploreResult:
    """Breadth-first search of the joint core/spec system of ``config`` over ``jobs`` worker
    processes (1: in this process); stops after the level of the first violation (refinement,
    invariant or quiescence) with a shortest counterexample."""
    if jobs < 1:
        raise ValueError(f"jobs must be at least 1, not {jobs}")
    t0 = time.perf_counter()
    c0 = time.process_time()
    with without_cyclic_gc():
        # the search's tables are freed inside: a collection over them once the collector is
        # back would take longer than the search
        local = jobs == 1 or not can_fork()
        cluster: Cluster = (
            LocalCluster(Shard(config, step_fn, actions, invariants))
            if local
            else ProcessCluster(config, step_fn, actions, invariants, jobs)
        )
        try:
            reports, depth, found, exhaustive = _levels(config, cluster, progress)
            violation = None if found is None else _counterexample(config, found, cluster)
            totals = cluster.totals()
        finally:
            cluster.close()
            del cluster
    probes: Counter[str] = Counter()
    for t in totals:
        probes.update(t.probes)
    own_cpu = time.process_time() - c0
    return ExploreResult(
        config,
        sum(r.states for r in reports),
        sum(r.transitions for r in reports),
        depth,
        time.perf_counter() - t0,
        sum(r.quiescent for r in reports),
        exhaustive and found is None,
        probes,
        violation,
        own_cpu if local else own_cpu + sum(t.cpu_seconds for t in totals),
        1 if local else jobs,
    )


def _levels(
    config: Config, cluster: Cluster, progress: Progress | None
) -> tuple[list[LevelReport], int, Found | None, bool]:
    """Level after level until a violation, an empty frontier or the state cap: the last
    reports, the depth reached, the violation and whether the cap was not what stopped it."""
    reports = cluster.start()
    found = _first(reports)
    depth = 0
    cap = config.max_states
    while found is None and any(r.frontier for r in reports):
        if cap is not None and sum(r.states for r in reports) >= cap:
            return reports, depth, found, False
        reports = cluster.level()
        if any(r.frontier for r in reports):
            depth += 1
        found = _first(reports)
        if progress is not None:
            progress.update(
                sum(r.states for r in reports),
                sum(r.transitions for r in reports),
                depth,
                sum(r.frontier for r in reports),
            )
    return reports, depth, found, True


def _first(reports: list[LevelReport]) -> Found | None:
    found = [r.found for r in reports if r.found is not None]
    return min(found, key=lambda f: f.key) if found else None


def _counterexample(config: Config, found: Found, cluster: Cluster) -> Counterexample:
    moves: list[ActionInstance] = [] if found.move is None else [found.move]
    link = cluster.parent(found.fp)
    while link is not None:
        fp, move = link
        moves.append(move)
        link = cluster.parent(fp)
    moves.reverse()
    return Counterexample(
        config, tuple(moves), found.error, quiescence=found.quiescence, violated=found.violated
    )


__all__ = [
    "Cluster",
    "ExploreResult",
    "LocalCluster",
    "ProcessCluster",
    "Progress",
    "can_fork",
    "explore",
]
