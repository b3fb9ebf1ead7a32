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
however the two sockets order them. What lives here: the socket's address, the listener thread
and the sender; the decision and its bookkeeping live in ``engine_side`` and ``scope_calls``.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable
from typing import Any

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
    """The API process's side: one PUSH socket per engine, made on first use. ``send`` is
    non-blocking and returns False when no engine core listens on that socket (the utility call
    then decides alone)."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
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
        try:
            sock.send(json.dumps(payload).encode(), zmq.NOBLOCK)
        except zmq.Again:
            return False
        return True
