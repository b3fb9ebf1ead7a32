"""Real server processes for the serving tests: ``retire serve`` and stock vLLM's server.

Each is started as a subprocess on 127.0.0.1 with a free port, its console going to a log file,
and is ready when ``/health`` answers. ``RetireServer.check_clean`` asks the server what Retire
and vLLM still hold (``GET /v1/retire/leaks``); ``close`` stops it and validates the core log
against the spec (``retire validate-trace``). ``engine_core_pid`` and ``rss_bytes`` read a
server's processes (psutil).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

READY_TIMEOUT_S = 240.0
#: The bound on every call a test or benchmark client makes to these servers, connect included: a
#: loaded 2-core machine (CI runs the serving tests beside CPU-bound ones) can hold up a connect
#: on 127.0.0.1 for longer than the 5 s that openai and httpx allow by default.
CLIENT_TIMEOUT_S = 600.0
#: The HTTP client of the scope routes, /health and the leak report (httpx's functions, bounded so).
HTTP = httpx.Client(timeout=CLIENT_TIMEOUT_S)
RETIRE = str(Path(sys.executable).parent / "retire")  # the console script of this venv
# Same engine for both servers: the tiny default model, fp32, 32-token blocks, eager.
ENGINE_OPTIONS = ["--max-num-seqs", "16", "--seed", "0"]


def pool_options(blocks: int) -> list[str]:
    """``retire serve`` options for the tiny default model with a KV pool of ``blocks`` blocks
    (block 0 included), the rest as ``ENGINE_OPTIONS``."""
    from retire_vllm.default_model import ensure_default_model

    return _pool(str(ensure_default_model()), blocks)


def model_options(model: str, blocks: int) -> list[str]:
    """The engine options both kinds of server get for ``model`` (a locally built default model
    of any size): fp32, 32-token blocks, eager, the cached tokens in ``usage``, then the pool of
    ``pool_options``."""
    from retire_vllm.engine_config import BLOCK_SIZE

    return [
        "--dtype",
        "float32",
        "--block-size",
        str(BLOCK_SIZE),
        "--enforce-eager",
        "--enable-prompt-tokens-details",
        *_pool(model, blocks),
    ]


def _pool(model: str, blocks: int) -> list[str]:
    from retire_vllm.engine_config import engine_kwargs

    kw = engine_kwargs(model, num_blocks=blocks)
    return [
        "--kv-cache-memory-bytes",
        str(kw["kv_cache_memory_bytes"]),
        "--num-gpu-blocks-override",
        str(blocks),
        "--max-model-len",
        str(kw["max_model_len"]),
        "--max-num-batched-tokens",
        str(kw["max_num_batched_tokens"]),
        *ENGINE_OPTIONS,
    ]


async def greedy_stream(
    client: Any, model: str, prompt: list[int], max_tokens: int, body: dict[str, Any]
) -> Any:
    """A streamed greedy completion of exactly ``max_tokens`` tokens (EOS ignored), its usage in
    the last chunk: the load the KV-pool benchmarks send through ``client`` (an
    ``openai.AsyncOpenAI``). ``body``: more body fields (a scope's, ``return_token_ids``)."""
    return await client.completions.create(
        model=model,
        prompt=prompt,
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True, **body},
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(tmp: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "VLLM_ENABLE_V1_MULTIPROCESSING": "1",
            "VLLM_RPC_BASE_PATH": str(tmp),
            "TMPDIR": str(tmp),
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


#: What ``GET /v1/retire/leaks`` lists that must be empty once every scope is cancelled.
HELD = (
    "ledger_blocks",
    "ledger_pins",
    "ledger_cached",
    "core_pages",
    "core_pinned",
    "managed_requests",
    "scheduler_requests",
    "admissions",
    "openings",
    "pipelined",
    "held_requests",
    "early_openings",
    "live_scopes",
)


#: The title vLLM gives its engine-core process (``/proc/PID/comm`` keeps its first 15 bytes).
ENGINE_CORE_TITLE = "VLLM::EngineCore"


def engine_core_pid(api_pid: int) -> int | None:
    """The engine-core process below a server's API process; None when there is none."""
    import psutil  # type: ignore[import-untyped]

    try:
        below = psutil.Process(api_pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return None
    for process in below:
        with contextlib.suppress(psutil.NoSuchProcess):
            if process.name().startswith(ENGINE_CORE_TITLE[:15]):
                return int(process.pid)
    return None


def rss_bytes(pid: int | None) -> int | None:
    """The resident memory of ``pid``; None when it is gone."""
    import psutil

    if pid is None:
        return None
    try:
        return int(psutil.Process(pid).memory_info().rss)
    except psutil.NoSuchProcess:
        return None


def leak_problems(leaks: dict[str, Any]) -> dict[str, Any]:
    """What a ``GET /v1/retire/leaks`` answer says is still held (empty: nothing): the lists of
    ``HELD``, free blocks short of the initial count, and the API process's per-request
    structures (``api_sizes``)."""
    problems: dict[str, Any] = {key: leaks[key] for key in HELD if leaks[key]}
    if leaks["free_blocks"] != leaks["initial_free_blocks"]:
        problems["free_blocks"] = (leaks["free_blocks"], leaks["initial_free_blocks"])
    for key, n in leaks.get("api_sizes", {}).items():
        if n:
            problems[f"api_{key}"] = n
    return problems


class Server:
    def __init__(self, argv: list[str], tmp: Path, name: str, *, wait: bool = True) -> None:
        """Start the server; ``wait``: return once it answers (else call ``wait_ready``, or
        ``ready_together`` for several, whose start-ups then overlap)."""
        tmp.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = tmp / f"{name}.log"
        self._log = open(self.log_path, "w")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [*argv, "--host", "127.0.0.1", "--port", str(self.port)],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=_env(tmp),
            # its own process group (``stop`` signals all of it), not its own session: Linux
            # schedules each session as one group (autogroup), and on a loaded 2-core machine a
            # busy server in a session of its own kept the other sessions' processes, its client
            # among them, off the CPUs for as long as it was busy (4-5 s: the whole of a
            # 3,500-token version; measured, and gone with the server in the client's session)
            process_group=0,
        )
        self._model: str | None = None
        if wait:
            self.wait_ready()

    @property
    def model(self) -> str:
        """The id of the model the server serves (known once it is ready)."""
        if self._model is None:
            raise RuntimeError(f"{self.log_path.stem} server not ready: call wait_ready first")
        return self._model

    def openai(self, *, asynchronous: bool = False) -> Any:
        """An ``openai`` client of this server that never retries, bounded by
        ``CLIENT_TIMEOUT_S``."""
        import openai

        cls = openai.AsyncOpenAI if asynchronous else openai.OpenAI
        return cls(
            base_url=f"{self.base}/v1", api_key="none", max_retries=0, timeout=CLIENT_TIMEOUT_S
        )

    def wait_ready(self) -> None:
        """Wait until ``/health`` answers and read the served model's id; a server that exits
        or does not answer within ``READY_TIMEOUT_S`` is stopped and its log's tail raised."""
        ready_together([self])

    def _answers(self) -> bool:
        """Is the server ready (then its model's id is read)? Raises if it exited."""
        if self.proc.poll() is not None:
            raise RuntimeError(f"server exited; log:\n{self.log_path.read_text()[-4000:]}")
        try:
            if HTTP.get(f"{self.base}/health", timeout=1.0).status_code == 200:
                self._model = HTTP.get(f"{self.base}/v1/models").json()["data"][0]["id"]
                return True
        except httpx.HTTPError:
            pass
        return False

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._log.close()


def ready_together(servers: Iterable[Server]) -> None:
    """Wait for servers started with ``wait=False``: their start-ups (three processes each,
    mostly importing vLLM and torch) overlap, about 47 s for two on this 2-core machine where
    one after the other took 69-81 s. If one exits or is not ready within ``READY_TIMEOUT_S``,
    every one is stopped and the failure raised with that server's log tail."""
    started = list(servers)
    pending = list(started)
    deadline = time.monotonic() + READY_TIMEOUT_S
    try:
        while pending:
            pending = [server for server in pending if not server._answers()]
            if pending and time.monotonic() > deadline:
                tail = pending[0].log_path.read_text()[-4000:]
                raise RuntimeError(f"server not ready; log:\n{tail}")
            if pending:
                time.sleep(0.5)
    except BaseException:
        for server in started:
            server.stop()
        raise


class RetireServer(Server):
    def __init__(
        self,
        tmp: Path,
        extra: list[str] | None = None,
        options: list[str] | None = None,
        *,
        log: bool = True,
        wait: bool = True,
    ) -> None:
        """``options``: the engine options, in place of ``ENGINE_OPTIONS``; ``log``: write the
        core's log (and validate it at ``close``); ``wait`` as ``Server``'s."""
        self.core_log: Path | None = tmp / "retire-core.jsonl" if log else None
        argv = [RETIRE, "serve", *(ENGINE_OPTIONS if options is None else options)]
        given = [*argv, *(extra or [])]
        flag = "--data-parallel-size"
        self.dp = int(given[given.index(flag) + 1]) if flag in given else 1
        if self.core_log is not None:
            argv += ["--retire-log", str(self.core_log)]
        super().__init__([*argv, *(extra or [])], tmp, "retire", wait=wait)

    def leaks(self) -> dict[str, Any]:
        answer: dict[str, Any] = HTTP.get(f"{self.base}/v1/retire/leaks").json()
        return answer

    def scope_url(self, scope: str) -> str:
        """The scope's route; its id percent-encoded (an id may hold "/")."""
        return f"{self.base}/v1/scopes/{quote(scope, safe='')}"

    def release_all(self) -> None:
        """Cancel every live scope (each with its own tenant)."""
        for scope, tenant in self.leaks()["live_scope_tenants"].items():
            HTTP.post(f"{self.scope_url(scope)}/cancel", headers={"x-retire-tenant": tenant})

    def check_clean(self, timeout_s: float = 60.0) -> None:
        """Nothing left: no live scope, request, pin, retained block or core page, and every
        usable block is free again (aborts reach the engine core asynchronously: poll)."""
        deadline = time.monotonic() + timeout_s
        while True:
            problems = leak_problems(self.leaks())
            if not problems:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"left behind: {problems}")
            time.sleep(0.1)

    def close(self) -> str:
        """Stop the server and validate its core log; returns the validator's verdict line."""
        self.stop()
        if self.core_log is None:
            return "no core log (started with log=False)"
        verdicts = []
        for log in self.core_logs():
            if not log.exists() or log.stat().st_size == 0:
                # as the facade's CoreLog: a server that never handled a scoped event wrote nothing
                verdicts.append(f"{log.name}: no transition logged, nothing checked")
                continue
            result = subprocess.run(
                [RETIRE, "validate-trace", str(log)], capture_output=True, text=True
            )
            if result.returncode != 0:
                raise AssertionError(f"core log rejected: {result.stdout}{result.stderr}")
            verdicts.append(result.stdout)
        return "".join(verdicts)

    def core_logs(self) -> list[Path]:
        """The core log of every engine core (one per data-parallel engine)."""
        from retire_vllm.corelog import engine_log_path

        assert self.core_log is not None
        return [engine_log_path(self.core_log, r, self.dp) for r in range(self.dp)]


class StockServer(Server):
    def __init__(
        self, tmp: Path, model: str, options: list[str] | None = None, *, wait: bool = True
    ) -> None:
        """``options``: every engine option (``--model`` too), in place of ``model`` with
        ``model_options``; ``wait`` as ``Server``'s."""
        entry = [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
        argv = options if options is not None else ["--model", model, *model_options(model, 1024)]
        super().__init__([*entry, *argv], tmp, "stock", wait=wait)
