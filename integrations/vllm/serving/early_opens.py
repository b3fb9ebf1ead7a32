"""A revision decided while the engine core's step runs: the socket its ``open`` also takes.

vLLM's engine core handles a utility call on its busy-loop thread between steps, so a revision
sent as one waits for the step in flight (up to a whole forward pass) before the authority
decides it and the old stream is ended. ``retire serve`` gives each engine core a socket of
Retire's own (an ``ipc://`` path in a private directory named by ``FENCE_DIR_ENV``, one per
data-parallel engine): the API process sends every scoped request's ``open`` there first
(``OpenSender``, non-blocking; refused when no engine listens, and the utility call alone
decides as before), then as the utility call it always was, and the request behind it.
``OpenListener``, a thread the engine side starts when it attaches, hands each message to
``EngineSide.open_early``, which decides it under the engine side's lock (the busy loop holds it
in Retire's hooks and lets it go during the forward pass) and queues the fenced versions'
terminal outputs at once; the rest of the revision's commands are carried out at the busy loop's
next hook, in the order the core gave them. The two copies of an ``open`` carry one opening id:
whichever arrives second finds the decision the first made, so an ``open`` is decided once
however the two sockets order them; ``OpenCopies`` is that rule, and it also drops a copy the
socket delivers twice and forgets an opening whose copy was lost, by the sender's sequence
numbers (one sender's copies leave in order on one socket; its utility calls may not). What
lives here: the socket's address, the listener thread, the sender and ``OpenCopies``; the
decision and its bookkeeping live in ``engine_side`` and ``scope_calls``.
"""

from __future__ import annotations

import enum
import json
import logging
import os
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

import attrs

#: The private directory of the engine cores' ``open`` sockets (``retire serve`` makes it); unset:
#: no socket, every ``open`` is decided between steps.
FENCE_DIR_ENV = "RETIRE_FENCE_DIR"

logger = logging.getLogger(__name__)


def address(directory: str, engine: int) -> str:
    return f"ipc://{os.path.join(directory, f'open-{engine}')}"


class OpenListener(threading.Thread):
    """The engine core's thread that takes ``open`` messages off its socket and hands each to
    ``decide`` (``EngineSide.open_early``). A message that is not a JSON object is dropped and
    logged (the utility call that follows it decides the ``open`` alone)."""

    def __init__(self, where: str, decide: Callable[[dict[str, Any]], None]) -> None:
        import zmq

        super().__init__(name="retire-open-listener", daemon=True)
        self.where = where
        self.decide = decide
        self.socket: Any = zmq.Context.instance().socket(zmq.PULL)
        self.socket.bind(where)  # here, so a bind failure reaches the caller

    def run(self) -> None:
        import zmq

        while True:
            try:
                raw = self.socket.recv()
            except zmq.ZMQError:  # the context is gone: the process is stopping
                return
            try:
                payload = json.loads(raw)
                if not isinstance(payload, dict):
                    raise ValueError("not an object")
            except ValueError as err:
                logger.warning("retire: dropped a malformed open message: %s", err)
                continue
            try:
                self.decide(payload)
            except Exception:  # the utility call decides it instead, and reports the error
                logger.exception("retire: an open taken off the engine's step failed")


class OpenSender:
    """The API process's side: one PUSH socket per engine, made on first use. ``send`` stamps
    the payload with this sender's id and its next sequence number (``OpenCopies``), and is
    non-blocking: it returns False when no engine core listens on that socket (the utility call
    then decides alone)."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.sender = uuid.uuid4().hex
        self._seq = 0
        self._sockets: dict[int, Any] = {}

    def connect(self, engines: int) -> None:
        for engine in range(engines):
            self._socket(engine)

    def _socket(self, engine: int) -> Any:
        import zmq

        sock = self._sockets.get(engine)
        if sock is None:
            sock = zmq.Context.instance().socket(zmq.PUSH)
            sock.setsockopt(zmq.IMMEDIATE, 1)  # no queueing for an engine not (yet) listening
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(address(self.directory, engine))
            self._sockets[engine] = sock
        return sock

    def send(self, engine: int, payload: dict[str, Any]) -> bool:
        import zmq

        sock = self._socket(engine)
        payload["sender"], payload["seq"] = self.sender, self._seq
        self._seq += 1  # before the send: a refused one leaves a gap, which is harmless
        try:
            sock.send(json.dumps(payload).encode(), zmq.NOBLOCK)
        except zmq.Again:
            return False
        return True


D = TypeVar("D")


class Copy(enum.Enum):
    """What a copy taken off the ``open`` socket does (``OpenCopies.take_copy``)."""

    DECIDES = "decides"  # the first of the two: decide the open now
    LATE = "late"  # its utility call decided it already
    DUPLICATE = "duplicate"  # the socket delivered this copy before


def copy_of(payload: dict[str, Any]) -> tuple[str, int] | None:
    """The sender and sequence number ``OpenSender.send`` stamped on ``payload`` (None: not a
    copy that went to the socket, or not one of ours)."""
    sender, seq = payload.get("sender"), payload.get("seq")
    if isinstance(sender, str) and isinstance(seq, int) and not isinstance(seq, bool):
        return sender, seq
    return None


@attrs.define
class OpenCopies(Generic[D]):
    """Which of an ``open``'s two copies decides it: the one on the ``open`` socket
    (``take_copy``) or its utility call (``take_utility``), whichever the engine side takes first;
    the other finds that decision (``D``; None: the copy decided nothing) or changes nothing.
    One sender's copies leave on one socket in the order of their sequence numbers, so a copy
    at or below the highest number taken from that sender is a duplicate, and a utility call
    waiting for a copy numbered below a later copy taken waits for a copy that was lost (the
    listener dropped it unread): it is forgotten and counted in ``lost``. Utility calls may
    come in any order. Nothing here grows with more than the opens in flight."""

    decided_early: dict[str, D | None] = attrs.field(factory=dict)  # copy first, by opening id
    lost: int = 0
    _highest: dict[str, int] = attrs.field(factory=dict)  # per sender, the last copy taken
    _waiting: dict[str, dict[int, str]] = attrs.field(factory=dict)  # utility first: seq -> id

    def take_copy(self, opening: str, sender: str, seq: int) -> Copy:
        """A copy off the socket; on ``DECIDES`` the caller decides and calls ``decided``."""
        if seq <= self._highest.get(sender, -1) or opening in self.decided_early:
            return Copy.DUPLICATE
        self._highest[sender] = seq
        waiting = self._waiting.get(sender, {})
        for earlier in [n for n in waiting if n < seq]:
            del waiting[earlier]
            self.lost += 1
        late = waiting.pop(seq, None) is not None
        if not waiting:
            self._waiting.pop(sender, None)
        return Copy.LATE if late else Copy.DECIDES

    def decided(self, opening: str, decision: D | None) -> None:
        self.decided_early[opening] = decision

    def take_utility(self, opening: str, copy: tuple[str, int] | None) -> D | None:
        """The utility call of ``opening`` (``copy``: the sender and number of its copy, None
        when none was sent): the copy's decision when the copy came first and decided; else
        None, the caller decides, and the copy, should it come, changes nothing."""
        if opening in self.decided_early:
            return self.decided_early.pop(opening)
        if copy is not None:
            sender, seq = copy
            if seq > self._highest.get(sender, -1):  # else it was lost: none will come
                self._waiting.setdefault(sender, {})[seq] = opening
        return None

    def openings(self) -> Iterator[str]:
        """The opening ids waiting for their other copy."""
        yield from self.decided_early
        for waiting in self._waiting.values():
            yield from waiting.values()

    def __len__(self) -> int:
        return len(self.decided_early) + sum(map(len, self._waiting.values()))
