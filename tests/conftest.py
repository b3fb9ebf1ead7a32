"""Suite-wide rules: a run in which no test passed, or any test was skipped, fails."""

from __future__ import annotations

import pytest


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None:
        return
    passed = len(reporter.stats.get("passed", []))
    skipped = len(reporter.stats.get("skipped", []))
    if exitstatus == 0 and (passed == 0 or skipped):
        reporter.write_line(
            f"FAILED: {passed} passed, {skipped} skipped — a run must pass tests and skip none"
        )
        session.exitstatus = 1
