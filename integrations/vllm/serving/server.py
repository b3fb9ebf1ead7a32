"""``retire serve [MODEL] [vLLM server options]``: vLLM's OpenAI-compatible server with Retire.

The server is vLLM's own (its argument parser, its FastAPI application, ``build_and_serve``);
``retire serve`` only adds what installs Retire: ``--scheduler-cls`` (the engine side, loaded in
the engine-core process), ``--middleware`` (scopes on the standard endpoints and the scope
routes), ``RetireAsyncLLM`` as the engine client, and, unless speculative decoding is
configured, ``step_digests``' connector in ``--kv-transfer-config`` (the workers digest the
blocks a step fills within that step; beside a connector of the user's through
``step_digests.MultiConnector``). With no model it serves the embedded tiny
default model (built locally on first use, nothing downloaded), with CPU engine settings that a
given option overrides. Retire's own options, removed before vLLM parses the rest:
``--retire-log PATH`` (the core's transitions, one JSON object per line, for
``retire validate-trace``), ``--retire-scope-ttl SECONDS`` (idle scopes are cancelled after
this long; default 900), ``--retire-step-digests on|off`` (off: no connector of Retire's; the
engine side reads every digest after the step; default on) and ``--retire-open-socket on|off``
(off: no ``open`` socket, ``early_opens``; a revision is decided between steps; default on).
"""

from __future__ import annotations

import asyncio
import atexit
import os
import shutil
import sys
import tempfile
from typing import Any

from .early_opens import FENCE_DIR_ENV

SCHEDULER = "retire_vllm.serving.scheduler.RetireServingScheduler"
MIDDLEWARE = "retire_vllm.serving.http.RetireMiddleware"
#: Idle scopes are cancelled after this long unless ``--retire-scope-ttl`` says otherwise.
DEFAULT_SCOPE_TTL_S = 900.0
#: KV pool of the default model when no size is given (blocks of 32 tokens).
DEFAULT_SERVE_BLOCKS = 1024


def _take_option(argv: list[str], name: str) -> tuple[list[str], str | None]:
    out: list[str] = []
    value: str | None = None
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == name and i + 1 < len(argv):
            value = argv[i + 1]
            i += 2
            continue
        if arg.startswith(name + "="):
            value = arg.split("=", 1)[1]
        else:
            out.append(arg)
        i += 1
    return out, value


def _given(argv: list[str]) -> set[str]:
    """The options present on the command line, as attribute names."""
    names = set()
    for arg in argv:
        if arg.startswith("--"):
            names.add(arg[2:].split("=", 1)[0].replace("-", "_"))
    return names


def parse(argv: list[str]) -> Any:
    """vLLM's server arguments with Retire installed and CPU defaults for what was not given."""
    from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from ..default_model import ensure_default_model
    from ..engine_config import apply_engine_env, engine_kwargs

    argv, log_path = _take_option(argv, "--retire-log")
    argv, ttl = _take_option(argv, "--retire-scope-ttl")
    argv, step_digests = _take_option(argv, "--retire-step-digests")
    if step_digests not in (None, "on", "off"):
        raise SystemExit(f"--retire-step-digests takes on or off, not {step_digests!r}")
    argv, open_socket = _take_option(argv, "--retire-open-socket")
    if open_socket not in (None, "on", "off"):
        raise SystemExit(f"--retire-open-socket takes on or off, not {open_socket!r}")
    parser = make_arg_parser(FlexibleArgumentParser(prog="retire serve"))  # type: ignore[no-untyped-call]
    args = parser.parse_args(argv)
    given = _given(argv)
    if args.model_tag is not None:
        args.model = args.model_tag
    default_model = args.model_tag is None and "model" not in given
    if default_model:
        args.model = str(ensure_default_model())
    tp = int(args.tensor_parallel_size or 1)
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"  # AsyncLLM: the engine core's own process
    apply_engine_env(tp)
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"
    if default_model:
        defaults = engine_kwargs(
            args.model, num_blocks=DEFAULT_SERVE_BLOCKS, tensor_parallel_size=tp
        )
    else:
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        defaults = {
            "dtype": "float32",
            "block_size": 32,
            "enforce_eager": True,
            "prefix_cache_retention_interval": None,  # (see engine_config.engine_kwargs)
        }
    defaults["enable_prompt_tokens_details"] = True  # cached_tokens in usage: the reuse
    for key, value in defaults.items():
        if key not in given and key != "model":
            setattr(args, key, value)
    if args.scheduler_cls not in (None, SCHEDULER) and "scheduler_cls" in given:
        raise SystemExit(f"retire serve installs its own scheduler ({SCHEDULER})")
    args.scheduler_cls = SCHEDULER
    args.middleware = [*(args.middleware or []), MIDDLEWARE]
    if args.speculative_config is None and step_digests != "off":
        # the workers digest the blocks a step fills within the step (``step_digests``, beside
        # a connector of the user's); with speculative decoding (whose draft pass runs after
        # the connector's per-step answer) the engine side reads them after the step instead
        from .step_digests import keep_cpu_reservation, with_step_digests

        if args.kv_transfer_config is None or args.kv_transfer_config.kv_connector is None:
            keep_cpu_reservation(tp * int(args.pipeline_parallel_size or 1))
        args.kv_transfer_config = with_step_digests(args.kv_transfer_config)
    if open_socket != "off":
        # the engine cores' ``open`` sockets (``early_opens``): a private directory, removed
        # when the server stops; short (an ipc path has about a hundred characters)
        short = "/tmp" if os.path.isdir("/tmp") else None
        directory = tempfile.mkdtemp(prefix="retire-", dir=short)
        atexit.register(shutil.rmtree, directory, ignore_errors=True)
        os.environ[FENCE_DIR_ENV] = directory
    else:
        os.environ.pop(FENCE_DIR_ENV, None)
    if log_path:
        os.environ["RETIRE_CORE_LOG"] = os.path.abspath(log_path)
        os.environ["RETIRE_DATA_PARALLEL_SIZE"] = str(int(args.data_parallel_size or 1))
    args.retire_scope_ttl = float(ttl) if ttl is not None else DEFAULT_SCOPE_TTL_S
    if not args.retire_scope_ttl > 0:
        raise SystemExit("--retire-scope-ttl must be a positive number of seconds")
    validate_parsed_serve_args(args)
    return args


async def serve(args: Any) -> None:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.api_server.entry import build_and_serve
    from vllm.entrypoints.launchers.launcher import setup_server
    from vllm.usage.usage_lib import UsageContext

    from .front_end import RetireAsyncLLM

    listen_address, sock = setup_server(args, reuse_port=False)
    engine_args = AsyncEngineArgs.from_cli_args(args)
    vllm_config = engine_args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
    engine: Any = RetireAsyncLLM.from_vllm_config(
        vllm_config=vllm_config,
        usage_context=UsageContext.OPENAI_API_SERVER,
        enable_log_requests=engine_args.enable_log_requests,
        disable_log_stats=engine_args.disable_log_stats,
    )
    # As vLLM's own ``run_server_worker``: the engine goes down when the server stops serving,
    # then the server's shutdown task is awaited.
    expiry = None
    try:
        await engine.retire("attach")  # every engine core listens on its open socket now
        engine.connect_open_sockets()
        expiry = asyncio.create_task(engine.expire_idle_scopes(args.retire_scope_ttl))
        shutdown_task = await build_and_serve(engine, listen_address, sock, args)
    finally:
        if expiry is not None:
            expiry.cancel()
        engine.shutdown(timeout=vllm_config.shutdown_timeout)
    try:
        await shutdown_task
    finally:
        sock.close()


def main(argv: list[str] | None = None) -> int:
    import uvloop

    from vllm.logger import configure_logging_from_args

    args = parse(list(sys.argv[1:] if argv is None else argv))
    configure_logging_from_args(args)
    uvloop.run(serve(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
