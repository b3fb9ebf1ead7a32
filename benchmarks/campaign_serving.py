"""``retire campaign``'s faults that need a real server: the engine-core process killed.

``retire serve`` runs the version authority (``retire_core``) and the KV blocks inside vLLM's
engine-core process. ``engine_core_killed`` SIGKILLs that process while versions are live: a scope's
first version streams, its revision is sent, and the process dies at a random moment from 0 to 60 ms
later (before the revision was accepted, or after). What Retire must do: no token of the old version
reaches the application after the revision was accepted (it reads through ``ScopeReader``, which
drops what was still on the wire then), the server stops serving (its health check fails or it
exits: vLLM's API process shuts down with its engine), and nothing survives the crash that a
successor could inherit without verification: a new server serves the scope's next request cold
(version 0, no adopted block, no cached prompt token), with the same output as an unscoped request
of the same prompt, and ends clean. The core log the killed process wrote is validated up to its
last complete line (a prefix of a behaviour is a behaviour). Each trial's replacement server is the
next trial's victim. What does not live here: the in-process faults (``campaign``), the server
process wrapper (``servers``).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from retire_bench.servers import RETIRE, RetireServer, engine_core_pid

if TYPE_CHECKING:
    from retire_bench.campaign import Outcome

READ_TIMEOUT_S = 10.0
KILL_WINDOW_S = 0.06  # the kill lands this long after the revision is sent, at most
DEAD_WITHIN_S = 60.0  # the API process must stop serving within this time of the kill


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(10, 2000) for _ in range(n)]


def _stream(client: Any, model: str, tokens: list[int], scope: str | None, n: int) -> Any:
    from retire_vllm.client import scoped

    body: dict[str, Any] = {"ignore_eos": True}
    if scope is not None:
        body.update(scoped(scope))
    return client.completions.create(
        model=model, prompt=tokens, max_tokens=n, temperature=0, stream=True, extra_body=body
    )


def _read(stream: Any, app: Any, into: list[tuple[float, bool, Any]]) -> None:
    """Every chunk with the time it was read and whether the application's ``ScopeReader`` let
    it through, until the stream ends or breaks."""
    try:
        for chunk in stream:
            into.append((time.monotonic(), app.admit(chunk), chunk))
    except Exception:  # the server died under it, or the read timed out
        pass


def _stopped_serving(server: RetireServer) -> bool:
    import httpx

    deadline = time.monotonic() + DEAD_WITHIN_S
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            return True
        try:
            if httpx.get(f"{server.base}/health", timeout=2.0).status_code != 200:
                return True
        except httpx.HTTPError:
            return True
        time.sleep(0.2)
    return False


def _validate_prefix(log: Path | None) -> str | None:
    """Validate the killed process's core log up to its last complete line; None if valid."""
    if log is None or not log.exists():
        return "no core log"
    lines = log.read_text().splitlines(keepends=True)
    complete = [line for line in lines if line.endswith("\n")]
    if not complete:
        return None  # killed before any scoped work reached the core
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        f.writelines(complete)
    result = subprocess.run([RETIRE, "validate-trace", f.name], capture_output=True, text=True)
    os.unlink(f.name)
    return None if result.returncode == 0 else (result.stdout + result.stderr).strip()


def engine_core_killed(
    victim: RetireServer,
    make_server: Callable[[], RetireServer],
    rng: random.Random,
    out: Outcome,
) -> RetireServer:
    """One trial against ``victim``; returns the server that replaced it (the next victim)."""
    import openai

    from retire_vllm.client import ScopeReader

    scope = f"killed-{rng.randrange(1 << 30)}"
    # (a read timeout: a stream whose engine died is not always ended by the API process)
    c = openai.OpenAI(
        base_url=f"{victim.base}/v1", api_key="none", max_retries=0, timeout=READ_TIMEOUT_S
    )
    tokens = _tokens(rng, 96)
    revision = tokens[:64] + _tokens(rng, 32)
    app = ScopeReader()  # the application reads through the publication rule
    old: list[tuple[float, bool, Any]] = []
    new: list[tuple[float, bool, Any]] = []
    v0 = _stream(c, victim.model, tokens, scope, 3000)
    app.accept_response(scope, v0)
    first = next(iter(v0))
    old_reader = threading.Thread(target=_read, args=(v0, app, old), daemon=True)
    old_reader.start()
    accepted: list[float] = []

    def revise() -> None:
        try:
            s = _stream(c, victim.model, revision, scope, 3000)
            app.accept_response(scope, s)  # the headers came: the revision was accepted
            accepted.append(time.monotonic())
            _read(s, app, new)
        except Exception:
            pass  # the server died before accepting it

    reviser = threading.Thread(target=revise, daemon=True)
    reviser.start()
    time.sleep(rng.uniform(0.0, KILL_WINDOW_S))
    engine_core = engine_core_pid(victim.proc.pid)
    if engine_core is None:
        raise RuntimeError(f"no engine-core process below pid {victim.proc.pid}")
    os.kill(engine_core, signal.SIGKILL)
    killed = time.monotonic()
    out.injected = True
    out.detected = _stopped_serving(victim)
    seconds = {"to_stop_serving": time.monotonic() - killed}
    old_reader.join(30)
    reviser.join(30)
    seconds["streams_ended"] = time.monotonic() - killed
    # What of v0 reached the client after the revision was accepted: chunks already on the
    # wire then, which the application's reader drops; none may reach the application.
    wire = [(ok, ch) for t, ok, ch in old if accepted and t > accepted[0]]
    handed = [ch for ok, ch in wire if ok and ch.choices and ch.choices[0].text]
    out.wrong_output += len(handed)
    os.killpg(victim.proc.pid, signal.SIGKILL)  # the rest of it: nothing left to shut down
    victim.proc.wait()
    victim.stop()
    seconds["victim_stopped"] = time.monotonic() - killed
    rejected = _validate_prefix(victim.core_log)
    # A new server: the scope starts over, cold, and serves what a cold run serves.
    server = make_server()
    seconds["replacement_ready"] = time.monotonic() - killed
    c = openai.OpenAI(base_url=f"{server.base}/v1", api_key="none", max_retries=0)
    again = [ch for ch in _stream(c, server.model, revision, scope, 16)]
    plain = [ch for ch in _stream(c, server.model, revision, None, 16)]
    import httpx

    status = httpx.get(server.scope_url(scope)).json()
    text = "".join(ch.choices[0].text for ch in again if ch.choices)
    cold = (
        status.get("version") == 0
        and status.get("adopted_blocks") == 0
        and text == "".join(ch.choices[0].text for ch in plain if ch.choices)
    )
    out.wrong_output += int(not cold)
    httpx.post(f"{server.scope_url(scope)}/cancel")
    try:
        server.check_clean()
        clean = True
    except AssertionError as err:
        clean = False
        out.details["left_behind"] = str(err)
    out.repaired = out.detected and cold and clean and rejected is None
    out.details.update(
        first_chunk_version=first.model_extra.get("retire", {}).get("version")
        if first.model_extra
        else None,
        revision_accepted=bool(accepted),
        old_chunks_read=len(old),
        new_chunks_read=len(new),
        old_chunks_on_the_wire_after_acceptance=len(wire),
        old_chunks_handed_to_the_application_after_acceptance=len(handed),
        successor_after_restart=status,
        core_log_rejected=rejected,
        seconds_after_kill={k: round(v, 1) for k, v in seconds.items()},
    )
    return server
