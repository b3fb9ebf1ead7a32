"""``python -m retire_cli``: the ``retire`` command line."""

from retire_cli import main

raise SystemExit(main())
