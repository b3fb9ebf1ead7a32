"""The ``retire`` subcommand registry, and ``retire scenario``.

Modules that contribute subcommands register them in ``COMMANDS`` (name -> (help, configure,
run)) with ``command``: this one (``scenario``), ``retire_checks.cli_checks`` (``check``,
``validate-trace``) and ``retire_bench.cli`` (``demo``, ``replay``). The ``retire`` console
script itself (``retire_cli``) imports them all and dispatches; nothing here imports it.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

Configure = Callable[[argparse.ArgumentParser], None]
Run = Callable[[argparse.Namespace], int]

COMMANDS: dict[str, tuple[str, Configure, Run]] = {}


def command(name: str, help: str, configure: Configure | None = None) -> Callable[[Run], Run]:
    def register(run: Run) -> Run:
        COMMANDS[name] = (help, configure or (lambda p: None), run)
        return run

    return register


@command("scenario", "run the scripted revision-chain scenario through the core and the spec")
def _scenario(args: argparse.Namespace) -> int:
    from retire_checks.scenario import run

    return run()
