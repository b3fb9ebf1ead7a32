"""The second half of ``make mutation``'s kill command: the explorer of ``retire check --profile
quick``, one configuration per test, over the (mutated) core.

A mutant of ``retire_core`` is killed here if any configuration of the quick profile finds a
violation (an invariant, refinement against the spec, the engine's obedience to the commands,
quiescence) or can no longer be explored exhaustively. ``retire check`` also runs the Z3 proofs
(they read the spec, which no core mutant touches) and requires every probe to be hit over the
whole profile (not checked per mutant). Collected only when ``RETIRE_MUTATION`` is set (see
``tests/conftest.py``): ``make test`` already runs ``retire check`` once.
"""

from __future__ import annotations

import pytest

from retire_checks.explorer import PROFILES, Config, explore

QUICK = PROFILES["quick"]


@pytest.mark.parametrize("config", QUICK.configs, ids=[c.name for c in QUICK.configs])
def test_quick_configuration_holds(config: Config) -> None:
    result = explore(config)
    assert result.violation is None, result.violation.error
    assert result.exhaustive
