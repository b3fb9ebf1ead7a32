"""The ``retire`` command line.

It sits above the packages whose subcommands it offers, so it imports them and none imports it:
``retire_checks.cli`` (the registry and ``scenario``), ``retire_checks.cli_checks`` (``check``,
``validate-trace``), ``retire_bench.cli`` (``demo``, ``replay``), ``retire_bench.campaign``
(``campaign``) and ``retire_bench.isolation_campaign`` (``isolation``; all left out where
``retire_bench`` is not installed). ``retire serve`` hands
every other argument to vLLM's server.
Exit codes: 0 success, 1 a check failed, 2 bad usage.
"""

from __future__ import annotations

import argparse
import sys

import retire_checks.cli_checks  # noqa: F401  (registers check, validate-trace)
from retire_checks.cli import COMMANDS

try:
    import retire_bench.campaign  # (registers campaign)
    import retire_bench.cli  # (registers demo, replay)
    import retire_bench.isolation_campaign  # noqa: F401  (registers isolation)
except ModuleNotFoundError as err:
    if err.name is None or not "retire_bench.cli".startswith(err.name):
        raise


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["serve"]:  # every other argument is vLLM's server's
        from retire_vllm.serving.server import main as serve

        return serve(argv[1:])
    parser = argparse.ArgumentParser(
        prog="retire", description="Retire: replace live LLM work safely."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("serve", help="vLLM's OpenAI-compatible server with Retire (docs/serving.md)")
    for name, (help_text, configure, _) in sorted(COMMANDS.items()):
        configure(sub.add_parser(name, help=help_text))
    args = parser.parse_args(argv)
    return COMMANDS[args.command][2](args)
