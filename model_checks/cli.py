"""The ``retire`` command line.

Subcommands register themselves in ``COMMANDS`` (name -> (help, configure, run)); this module only
parses arguments and dispatches. ``retire scenario`` runs the scripted core scenario; the checks,
trace validation and the vLLM demo and replay add their own subcommands in their modules.
Exit codes: 0 success, 1 a check failed, 2 bad usage.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable

Configure = Callable[[argparse.ArgumentParser], None]
Run = Callable[[argparse.Namespace], int]

COMMANDS: dict[str, tuple[str, Configure, Run]] = {}

# Modules that contribute subcommands (imported lazily so a missing optional extra only
# disables its own subcommands).
PLUGINS = ("retire_checks.cli_checks", "retire_bench.cli")


def command(name: str, help: str, configure: Configure | None = None) -> Callable[[Run], Run]:
    def register(run: Run) -> Run:
        COMMANDS[name] = (help, configure or (lambda p: None), run)
        return run

    return register


@command("scenario", "run the scripted revision-chain scenario through the core and the spec")
def _scenario(args: argparse.Namespace) -> int:
    from retire_checks.scenario import run

    return run()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["serve"]:  # every other argument is vLLM's server's
        from retire_vllm.serving.server import main as serve

        return serve(argv[1:])
    for module in PLUGINS:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as err:
            if err.name is None or not module.startswith(err.name):
                raise
    parser = argparse.ArgumentParser(
        prog="retire", description="Retire: replace live LLM work safely."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("serve", help="vLLM's OpenAI-compatible server with Retire (docs/serving.md)")
    for name, (help_text, configure, _) in sorted(COMMANDS.items()):
        configure(sub.add_parser(name, help=help_text))
    args = parser.parse_args(argv)
    return COMMANDS[args.command][2](args)


if __name__ == "__main__":
    raise SystemExit(main())
